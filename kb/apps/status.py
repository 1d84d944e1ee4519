"""`kb status`: coverage per stage, last sync, and the readiness of each service."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb as duckdb_lib

from kb.index.store import empty_index_note
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
            "documents": _document_counts(conn),
            "folders": _folder_counts(conn),
            "threads": one("SELECT count(DISTINCT tweet_id) FROM thread_posts"),
            **_enrichment_coverage(conn),
        }
    finally:
        conn.close()


def _document_counts(conn) -> dict:
    """Documents behind the links: fetched, thin (too little text to keep),
    and the other failures by reason, so the owner sees what `--retry` would try."""
    try:
        rows = conn.execute("SELECT status, coalesce(reason, ''), count(*) FROM documents "
                            "GROUP BY ALL ORDER BY 3 DESC, 2").fetchall()
    except duckdb_lib.CatalogException:
        return {"fetched": 0, "thin": 0, "failed": {}}
    out: dict = {"fetched": 0, "thin": 0, "failed": {}}
    for status, reason, count in rows:
        if status == "ok":
            out["fetched"] += count
        elif reason == "thin":
            out["thin"] += count
        else:
            out["failed"][reason or "unknown"] = out["failed"].get(reason or "unknown", 0) + count
    return out


def _folder_counts(conn) -> list[dict]:
    """Live bookmarks per bookmark folder, by the folder's current name."""
    try:
        rows = conn.execute(
            """SELECT f.folder_id, coalesce(f.name, f.folder_id) AS label, count(b.tweet_id)
               FROM folders f LEFT JOIN folder_bookmarks fb USING (folder_id)
               LEFT JOIN bookmarks b ON b.tweet_id = fb.tweet_id AND b.removed_at IS NULL
               GROUP BY f.folder_id, label ORDER BY lower(label), f.folder_id""").fetchall()
    except duckdb_lib.CatalogException:
        return []
    return [{"folder_id": folder_id, "name": name, "bookmarks": count} for folder_id, name, count in rows]


def _enrichment_coverage(conn) -> dict:
    """The numbers of the coverage checks of captions, transcripts and
    translations (the same queries). A table that does not exist yet gives
    no entry."""
    from kb.enrich.foreign_text import translation_coverage
    from kb.enrich.photo_queue import photo_coverage
    from kb.enrich.video_queue import video_coverage
    from kb.settings import excluded_sources

    out = {}
    for name, read in (("captions", photo_coverage), ("transcripts", video_coverage),
                       ("translations", lambda c: translation_coverage(c, excluded_sources()))):
        try:
            out[name] = read(conn)
        except duckdb_lib.CatalogException:
            pass
    return out


def _capture_counts(settings: Settings) -> dict:
    from kb.x.raw_store import RawStore

    counts = RawStore.from_settings(settings).capture_counts()
    # kb status calls the last complete capture the last sync.
    return {"last_sync": counts.get("last_capture"), **counts}


def _index_counts() -> dict:
    from kb.index.client import ChunkIndex

    from kb.index.model_choice import model_note

    try:
        counts = ChunkIndex.from_settings().counts()
    except Exception as exc:  # the status report must never crash on one store
        return {"state": f"unreadable: {exc}"}
    return {**counts, "model_note": model_note(counts.get("model"))}


def _embedder_readiness(settings: Settings) -> tuple[bool, str]:
    """Ollama and its model, and the local model, in one line."""
    from kb.index.embedder import Embedder

    report = Embedder.from_settings(settings).readiness()
    ollama, local = report["ollama"], report["local"]
    ollama_text = ("ollama ready" if ollama["has_model"] else f"ollama not ready ({ollama['error']})")
    local_text = (f"local model installed ({local['dim']}-d)" if local["present"]
                  else f"local model not ready ({local['error']})")
    return bool(report["ready"]), f"active {report['active']}; {ollama_text}; {local_text}"


def _models(settings: Settings) -> dict:
    """The file that each model loads from (kb/models/files.py): the
    embedder's local model, the cross-encoder, the whisper model and the
    tiny.en that stands in for it."""
    from kb.models.files import where

    whisper = settings.kb_whisper_model or "tiny.en"
    roles = {"embedder": settings.kb_local_model, "cross-encoder": settings.kb_rerank_model, "whisper": whisper}
    if whisper != "tiny.en":
        roles["whisper stand-in"] = "tiny.en"
    return {role: where(name) for role, name in roles.items()}


def model_lines(models: dict) -> list[str]:
    lines = ["models   (the file that each model loads from)"] if models else []
    for role, found in models.items():
        text = (f"{found['file']} ({found['source']})" if found.get("file")
                else f"not ready: {found.get('error')}")
        lines.append(f"  {role:<17} {found['model']}: {text}")
    return lines


def _services(settings: Settings) -> dict:
    from kb.x.browser import Browser
    from kb.telegram.gate import QualityGate
    from kb.enrich.transcriber import Transcriber
    from kb.enrich.voice_model import readiness as voice_readiness
    from kb.enrich.translator import Translator
    from kb.enrich.vision import Captioner
    from kb.wiki.agent import WikiAgent
    from kb.wiki.sandbox import sandbox_status
    from kb.telegram.bot_token import readiness as telegram_readiness
    from kb.guards.egress_proxy import egress_readiness
    from kb.guards.fetch_guard import allowlist_readiness

    browser = Browser.from_settings(settings)
    checks = {
        # Browser.readiness() covers the X login state too, and never shows its content.
        "browser": browser.readiness,
        # Whether Chromium's sandbox runs, and how to fix it when it cannot (kb/x/browser_room.py).
        "browser_sandbox": browser.sandbox_readiness,
        "embedder": lambda: _embedder_readiness(settings),
        "captions": Captioner.from_settings(settings).readiness,
        "transcripts": Transcriber.from_settings(settings).readiness,
        "voice_notes": lambda: voice_readiness(settings),
        "translation": Translator.from_settings(settings).readiness,
        "quality_gate": QualityGate.from_settings(settings).readiness,
        "wiki_agent": WikiAgent.from_settings(settings).readiness,
        "agent_sandbox": lambda: sandbox_status(settings.kb_agent_sandbox),
        "telegram": lambda: telegram_readiness(settings),
        "fetch_allowlist": lambda: allowlist_readiness(settings),
        "egress_proxy": lambda: egress_readiness(settings),
    }
    services = {}
    for name, check in checks.items():
        try:
            ok, detail = check()
        except Exception as exc:  # one broken service must not hide the others
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        services[name] = {"ready": ok, "detail": detail}
    # Only whether each key is set: never any part of its value.
    for key in ("groq_api_key", "deepseek_api_key", "anthropic_auth_token", "telegram_bot_token",
                "kb_dagster_postgres_url", "kb_s3_access_key_id", "kb_s3_secret_access_key"):
        value = getattr(settings, key)
        is_set = value is not None and bool(value.get_secret_value())
        services[key] = {"ready": is_set, "detail": "set" if is_set else "not set"}
    return services


def _wiki_state(settings: Settings) -> dict:
    """Telegram sources per state, read from Dagster (runs and materializations)."""
    if not (settings.dagster_home / "dagster.yaml").exists():
        return {"sources": {}, "waiting": [], "failed": []}
    import dagster as dg

    from kb.wiki.agent import WikiAgent
    from kb_assets.source_states import wiki_status
    from kb_assets.instance_config import ensure_dagster_home

    ensure_dagster_home(settings)
    with dg.DagsterInstance.get() as instance:
        state = wiki_status(instance, WikiAgent.from_settings(settings))
    state.pop("agent", None)  # the services list shows it
    return state


def _purpose_state(settings: Settings) -> dict:
    from kb.telegram.gate import purpose_is_default

    path = settings.wiki_dir / "purpose.md"
    return {"written": not purpose_is_default(settings.wiki_dir), "path": str(path)}


PURPOSE_HINT = ("  purpose.md is not written yet: write {path}. Until you do, the quality gate uses a\n"
                "  default purpose (it keeps explanations, research and analysis; it rejects advertising,\n"
                "  thin news and link lists), and the wiki agent has no guide to your subjects.")


def collect_status(settings: Settings | None = None) -> dict:
    from kb.telegram.notifier import recent_notices

    settings = settings or get_settings()
    from kb.settings import CONFIG_DIR, setting_names_read, settings_file

    read = settings_file()
    return {
        "kb_home": str(settings.home),
        # Which settings file this process read: a key in another file is not seen.
        "settings_file": str(read) if read else None,
        "settings_file_note": None if read else f"none ({CONFIG_DIR / '.env'} does not exist): the environment only",
        # The settings that the owner's specification names, and the name that gave each value.
        "setting_names": setting_names_read(settings),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "capture": _capture_counts(settings),
        "normalized": _duckdb_counts(settings),
        "index": _index_counts(),
        "wiki": _wiki_state(settings),
        "purpose": _purpose_state(settings),
        "services": _services(settings),
        "models": _models(settings),
        "daemon": _daemon(settings),
        "backups": _backups(settings),
        # Without a bot, the notices to the owner are here (and in the daemon's log).
        "unsent_notices": recent_notices(settings),
    }


def _backups(settings: Settings) -> dict:
    from kb.backup.archive import last_backup

    try:
        return last_backup(settings)
    except OSError as exc:
        return {"folder": str(settings.backup_dir), "last": None, "bytes": None, "kept": 0, "error": str(exc)}


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
    from kb.apps.run_report import SERVICES

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
        service = f" for {SERVICES[key][1]}" if numbers["waiting"] else ""
        lines.append(f"  {label:<11} {finished}/{numbers[total]} {noun} ({share:.0f}%), "
                     f"{numbers['waiting']} waiting{service}{extra}")
    return lines


def setting_name_lines(names: dict) -> list[str]:
    """One line per setting with a name in the owner's specification, for
    example `ingest max turns: 25 (INGEST_MAX_TURNS)`, then the names that
    are set but change nothing."""
    shown = names.get("settings") or {}
    if not shown:
        return []
    lines = ["settings (the name that kb read; the specification's names work too)"]
    lines += [f"  {s['label']}: {s['value']} ({s['read']})" for s in shown.values()]
    lines += [f"  {name} is set and changes nothing: {why}" for name, why in (names.get("without_meaning") or {}).items()]
    return lines


# Keys that a service line names already (each service once), and keys
# that only some setups use. `kb status --all` shows every key.
KEY_OF_A_SERVICE = {"groq_api_key", "deepseek_api_key", "anthropic_auth_token", "telegram_bot_token"}
S3_KEYS = {"kb_s3_access_key_id", "kb_s3_secret_access_key"}


def shown_services(report: dict, show_all: bool = False) -> dict:
    """The service lines of the text report: without the keys that a service
    line names already, without the S3 keys of a local index, and without the
    Postgres URL that a local owner does not set; all of them with `show_all`."""
    services = report["services"]
    if show_all:
        return services
    bucket = str((report.get("index") or {}).get("path") or "").startswith("s3://")
    return {name: svc for name, svc in services.items()
            if name not in KEY_OF_A_SERVICE and (name not in S3_KEYS or bucket)
            and (name != "kb_dagster_postgres_url" or svc["ready"])}


def format_status(report: dict, show_all: bool = False) -> str:
    lines = [f"KB_HOME  {report['kb_home']}",
             f"settings file  {report.get('settings_file') or report.get('settings_file_note')}"]
    lines += setting_name_lines(report.get("setting_names") or {})
    cap = report["capture"]
    lines.append(f"last sync  {cap['last_sync'] or 'never'}   batches {cap['batches']}   pages {cap.get('pages', '?')}"
                 + (f"   incomplete {cap['incomplete_batches']}" if cap.get("incomplete_batches") else "")
                 + (f"   ERROR {cap['error']}" if cap.get("error") else ""))
    norm = report["normalized"]
    if norm.get("state") == "ok":
        total = norm["bookmarks"] or 1
        lines.append("coverage")
        lines.append(f"  normalized  {norm['bookmarks']} bookmarks ({norm['removed']} removed)")
        lines.append(f"  chunked     {norm['chunked_bookmarks']}/{norm['bookmarks']} "
                     f"({100 * norm['chunked_bookmarks'] / total:.0f}%), {norm['chunks']} chunks")
        docs = norm.get("documents") or {}
        failed = docs.get("failed") or {}
        reasons = ", ".join(f"{reason} {n}" for reason, n in failed.items())
        lines.append(f"  documents   {docs.get('fetched', 0)} fetched, {docs.get('thin', 0)} thin, "
                     f"{sum(failed.values())} failed" + (f" ({reasons})" if reasons else ""))
        lines += _coverage_lines(norm)
        if norm.get("threads"):
            lines.append(f"  threads     {norm['threads']} bookmarks with the author's thread")
        if norm.get("folders"):
            lines.append("  folders     " + ", ".join(f"{f['name']} {f['bookmarks']}" for f in norm["folders"]))
    else:
        lines.append(f"normalized  {norm.get('state')}")
    index = report["index"]
    lines.append(f"  indexed     {index.get('bookmarks', 0)} bookmarks, {index.get('chunks', 0)} chunks"
                 + (f", model {index['model']}" if index.get("model") else ""))
    if index.get("model_note"):
        lines.append(f"  {index['model_note']}")
    if norm.get("state") == "empty" and not index.get("chunks"):
        lines.append(empty_index_note(index.get("path") or report["kb_home"]))
    wiki = report.get("wiki") or {}
    if wiki.get("sources"):
        counts = ", ".join(f"{n} {state}" for state, n in sorted(wiki["sources"].items()))
        lines.append(f"  telegram    {counts}")
        if wiki.get("waiting"):
            lines.append(f"  waiting for the wiki agent: {', '.join(wiki['waiting'][:10])}")
    purpose = report.get("purpose") or {}
    if purpose and not purpose.get("written"):
        lines.append(PURPOSE_HINT.format(path=purpose["path"]))
    daemon = report.get("daemon") or {}
    lines.append("daemon   " + ("running" if daemon.get("running") else "not running: sensors, schedules and the "
                                "bot's requests wait. Start it with `kb up`")
                 + (f" (last heartbeat {daemon['last_heartbeat']})" if daemon.get("last_heartbeat") else ""))
    backups = report.get("backups") or {}
    if backups.get("last"):
        lines.append(f"backup   last {backups['last']} ({backups['bytes'] / 1e6:.1f} MB), "
                     f"{backups['kept']} kept in {backups['folder']}")
    else:
        lines.append(f"backup   none yet in {backups.get('folder')}"
                     + (f": {backups['error']}" if backups.get("error") else ": the backup schedule writes one each day"))
    notices = report.get("unsent_notices") or []
    if notices:
        lines.append("notices that no bot sent (newest last; the whole list: logs/notices.jsonl)")
        lines += [f"  {n.get('at', '?')}  {n.get('text', '')}" for n in notices]
    lines += model_lines(report.get("models") or {})
    lines.append("services" + ("" if show_all else "   (`kb status --all`: every setting, also the unused ones)"))
    for name, svc in shown_services(report, show_all).items():
        lines.append(f"  {name:<22} {'ready' if svc['ready'] else 'not ready':<10} {svc['detail']}")
    return "\n".join(lines)
