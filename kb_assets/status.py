"""`kb status`: coverage per stage, last sync, and the readiness of each service."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb as duckdb_lib

from kb_resources.settings import Settings, get_settings


def _duckdb_counts(settings: Settings) -> dict:
    """Counts from DuckDB. While a sync writes, the file is locked for every
    other process: then the report says so instead of waiting."""
    path = settings.duckdb_path
    if not path.exists():
        return {"state": "empty"}
    try:
        conn = duckdb_lib.connect(str(path), read_only=True)
    except duckdb_lib.IOException as exc:
        if "lock" in str(exc).lower():
            return {"state": "busy: a sync holds the DuckDB file"}
        raise
    try:
        def one(sql: str) -> int:
            try:
                return int(conn.execute(sql).fetchone()[0])
            except duckdb_lib.CatalogException:
                return 0

        return {
            "state": "ok",
            "bookmarks": one("SELECT count(*) FROM bookmarks WHERE removed_at IS NULL"),
            "removed": one("SELECT count(*) FROM bookmarks WHERE removed_at IS NOT NULL"),
            "chunked_bookmarks": one("SELECT count(DISTINCT tweet_id) FROM chunks"),
            "chunks": one("SELECT count(*) FROM chunks"),
            "links": one("SELECT count(DISTINCT url_norm) FROM links"),
            "photos": one("SELECT count(*) FROM media WHERE kind = 'photo'"),
            "videos": one("SELECT count(*) FROM media WHERE kind IN ('video', 'animated_gif')"),
            **_enrichment_coverage(conn),
        }
    finally:
        conn.close()


def _enrichment_coverage(conn) -> dict:
    """The numbers of the coverage checks of captions, transcripts and
    translations (the same queries). A table that does not exist yet gives
    no entry."""
    from kb_assets.captions import photo_coverage
    from kb_resources.settings import excluded_sources
    from kb_assets.transcripts import video_coverage
    from kb_assets.translations import translation_coverage

    out = {}
    for name, read in (("captions", photo_coverage), ("transcripts", video_coverage),
                       ("translations", lambda c: translation_coverage(c, excluded_sources()))):
        try:
            out[name] = read(conn)
        except duckdb_lib.CatalogException:
            pass
    return out


def _capture_counts(settings: Settings) -> dict:
    from kb_resources.raw_store import RawStore

    store = RawStore()
    batches = store.batches()
    manifests = [m for m in (store.manifest(b) for b in batches) if m]
    complete = [m for m in manifests if m.complete]
    last = max(complete, key=lambda m: m.finished_at, default=None)
    return {
        "batches": len(batches),
        "pages": sum(len(store.pages(b)) for b in batches),
        "incomplete_batches": len(manifests) - len(complete),
        "last_sync": last.finished_at if last else None,
        "watermark": (store.watermark() or {}).get("tweet_id"),
    }


def _index_counts() -> dict:
    from kb_resources.lance_index import ChunkIndex

    try:
        return ChunkIndex().counts()
    except Exception as exc:  # the status report must never crash on one store
        return {"state": f"unreadable: {exc}"}


def _services(settings: Settings) -> dict:
    from kb_resources.browser import Browser
    from kb_resources.embedder import Embedder
    from kb_resources.transcriber import Transcriber
    from kb_resources.translator import Translator
    from kb_resources.vision import Captioner

    def secret_state(value) -> str:
        return "set" if value is not None and value.get_secret_value() else "not set"

    services = {}
    # Browser.readiness() covers the X login state too, and never shows its content.
    for name, resource in (("browser", Browser()), ("embedder", Embedder()), ("captions", Captioner()),
                           ("transcripts", Transcriber()), ("translation", Translator())):
        try:
            ok, detail = resource.readiness()
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        services[name] = {"ready": ok, "detail": detail}
    for key in ("groq_api_key", "deepseek_api_key", "anthropic_auth_token", "telegram_bot_token"):
        value = getattr(settings, key)
        services[key] = {"ready": secret_state(value) == "set", "detail": secret_state(value)}
    return services


def collect_status(settings: Settings | None = None) -> dict:
    settings = settings or get_settings()
    return {
        "kb_home": str(settings.home),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "capture": _capture_counts(settings),
        "normalized": _duckdb_counts(settings),
        "index": _index_counts(),
        "services": _services(settings),
    }


def _coverage_lines(norm: dict) -> list[str]:
    lines = []
    for key, label, done, total, noun in (
        ("captions", "captioned", "captioned", "photos", "photos"),
        ("transcripts", "transcribed", "transcribed", "videos", "videos"),
        ("translations", "translated", None, "foreign_texts", "foreign texts"),
    ):
        numbers = norm.get(key)
        if not numbers:
            continue
        finished = numbers[done] if done else numbers["translated"] + numbers["already_english"]
        share = 100 * finished / numbers[total] if numbers[total] else 100
        extra = f", {numbers['failed']} failed" if numbers.get("failed") else ""
        lines.append(f"  {label:<11} {finished}/{numbers[total]} {noun} ({share:.0f}%), "
                     f"{numbers['waiting']} waiting{extra}")
    return lines


def format_status(report: dict) -> str:
    lines = [f"KB_HOME  {report['kb_home']}"]
    cap = report["capture"]
    lines.append(f"last sync  {cap['last_sync'] or 'never'}   batches {cap['batches']}   pages {cap['pages']}"
                 + (f"   incomplete {cap['incomplete_batches']}" if cap["incomplete_batches"] else ""))
    norm = report["normalized"]
    if norm.get("state") == "ok":
        total = norm["bookmarks"] or 1
        lines.append("coverage")
        lines.append(f"  normalized  {norm['bookmarks']} bookmarks ({norm['removed']} removed)")
        lines.append(f"  chunked     {norm['chunked_bookmarks']}/{norm['bookmarks']} "
                     f"({100 * norm['chunked_bookmarks'] / total:.0f}%), {norm['chunks']} chunks")
        lines += _coverage_lines(norm)
    else:
        lines.append(f"normalized  {norm.get('state')}")
    index = report["index"]
    lines.append(f"  indexed     {index.get('bookmarks', 0)} bookmarks, {index.get('chunks', 0)} chunks"
                 + (f", model {index['model']}" if index.get("model") else ""))
    lines.append("services")
    for name, svc in report["services"].items():
        lines.append(f"  {name:<22} {'ready' if svc['ready'] else 'not ready':<10} {svc['detail']}")
    return "\n".join(lines)
