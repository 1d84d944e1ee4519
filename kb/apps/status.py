"""`kb status`: coverage per stage, last sync, and the readiness of each service."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb as duckdb_lib

from kb.settings import Settings, get_settings


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
    from kb_assets.enrich.photo_captions import photo_coverage
    from kb.settings import excluded_sources
    from kb_assets.enrich.video_transcripts import video_coverage
    from kb_assets.enrich.translations import translation_coverage

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


def _embedder_readiness() -> tuple[bool, str]:
    """Ollama and its model, and the local model, in one line."""
    from kb_resources.embedder import Embedder

    report = Embedder().readiness()
    ollama, local = report["ollama"], report["local"]
    ollama_text = ("ollama ready" if ollama["has_model"] else f"ollama not ready ({ollama['error']})")
    local_text = (f"local model loads ({local['dim']}-d)" if local["loads"] else f"local model fails ({local['error']})")
    return bool(report["ready"]), f"active {report['active']}; {ollama_text}; {local_text}"


def _services(settings: Settings) -> dict:
    from kb_resources.browser import Browser
    from kb_resources.gate import QualityGate
    from kb_resources.transcriber import Transcriber
    from kb_resources.translator import Translator
    from kb_resources.vision import Captioner
    from kb_resources.wiki_agent import WikiAgent
    from kb.telegram_api import readiness as telegram_readiness

    checks = {
        # Browser.readiness() covers the X login state too, and never shows its content.
        "browser": Browser().readiness,
        "embedder": _embedder_readiness,
        "captions": Captioner().readiness,
        "transcripts": Transcriber().readiness,
        "translation": Translator().readiness,
        "quality_gate": QualityGate().readiness,
        "wiki_agent": WikiAgent().readiness,
        "telegram": lambda: telegram_readiness(settings),
    }
    services = {}
    for name, check in checks.items():
        try:
            ok, detail = check()
        except Exception as exc:  # one broken service must not hide the others
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        services[name] = {"ready": ok, "detail": detail}
    # Only whether each key is set: never any part of its value.
    for key in ("groq_api_key", "deepseek_api_key", "anthropic_auth_token", "telegram_bot_token"):
        value = getattr(settings, key)
        is_set = value is not None and bool(value.get_secret_value())
        services[key] = {"ready": is_set, "detail": "set" if is_set else "not set"}
    return services


def _wiki_state(settings: Settings) -> dict:
    """Telegram sources per state, read from Dagster (runs and materializations)."""
    if not (settings.dagster_home / "dagster.yaml").exists():
        return {"sources": {}, "waiting": [], "failed": []}
    import dagster as dg

    from kb_assets.wiki.wiki_pages import wiki_status
    from kb_assets.instance_config import ensure_dagster_home

    ensure_dagster_home(settings)
    with dg.DagsterInstance.get() as instance:
        state = wiki_status(instance)
    state.pop("agent", None)  # the services list shows it
    return state


def collect_status(settings: Settings | None = None) -> dict:
    settings = settings or get_settings()
    return {
        "kb_home": str(settings.home),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "capture": _capture_counts(settings),
        "normalized": _duckdb_counts(settings),
        "index": _index_counts(),
        "wiki": _wiki_state(settings),
        "services": _services(settings),
        "daemon": _daemon(settings),
    }


def _daemon(settings: Settings) -> dict:
    """Whether a Dagster daemon runs for this KB_HOME, from its heartbeat in
    the instance. The sensors, schedules, the bot's requests and every
    notification need it (`kb up` runs it)."""
    from kb.apps.up import HEARTBEAT_FRESH_S, daemon_heartbeat

    try:
        beat = daemon_heartbeat(settings.dagster_home)
    except Exception as exc:  # a broken instance must not hide the rest of the status
        return {"running": False, "last_heartbeat": None, "error": f"{type(exc).__name__}: {exc}"}
    age = (datetime.now(timezone.utc) - beat).total_seconds() if beat else None
    return {"running": age is not None and age < HEARTBEAT_FRESH_S,
            "last_heartbeat": beat.isoformat(timespec="seconds") if beat else None}


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
    wiki = report.get("wiki") or {}
    if wiki.get("sources"):
        counts = ", ".join(f"{n} {state}" for state, n in sorted(wiki["sources"].items()))
        lines.append(f"  telegram    {counts}")
        if wiki.get("waiting"):
            lines.append(f"  waiting for the wiki agent: {', '.join(wiki['waiting'][:10])}")
    daemon = report.get("daemon") or {}
    lines.append("daemon   " + ("running" if daemon.get("running") else "not running: sensors, schedules and the "
                                "bot's requests wait. Start it with `kb up`")
                 + (f" (last heartbeat {daemon['last_heartbeat']})" if daemon.get("last_heartbeat") else ""))
    lines.append("services")
    for name, svc in report["services"].items():
        lines.append(f"  {name:<22} {'ready' if svc['ready'] else 'not ready':<10} {svc['detail']}")
    return "\n".join(lines)
