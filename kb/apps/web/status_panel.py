"""The status panel of the web page: coverage per stage, last sync, and the
readiness of each service.

It reads only files: the raw capture manifests, the LanceDB index and the
wiki folder. It never opens DuckDB (the serving side must work while a sync
holds the DuckDB file), so coverage is counted from the index: the
bookmark cards say what each bookmark has (links, photos, videos), the
passages say which texts made it into the index.

Each check is cheap: no model loads and no browser starts. A service that
does not answer within SERVICE_TIMEOUT_S counts as not ready.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone

import httpx

from kb.apps.web.reader import WikiReader
from kb.wiki_files import WIKI_SOURCE
from kb.index.client import ChunkIndex
from kb.index.store import BOOKMARKS, CHUNKS
from kb.x.raw_store import RawStore
from kb.settings import Settings

SERVICE_TIMEOUT_S = 1.0
# Card media kinds that the transcript stage reads.
VIDEO_KINDS = ("video", "animated_gif")


def collect_web_status(settings: Settings, index: ChunkIndex, wiki: WikiReader) -> dict:
    coverage = _guarded(lambda: index_coverage(index)) if index.exists() else {
        "error": "the index is empty: run `kb sync`", "stages": []}
    wiki_state = _guarded(lambda: wiki_counts(wiki, coverage.get("wiki_pages_indexed", 0)))
    if wiki_state.get("exists") and "stages" in coverage:
        coverage["stages"].append(_count_stage("wiki pages indexed", wiki_state["pages"],
                                               wiki_state["indexed"]))
    return {
        "kb_home": str(settings.home),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "capture": capture_counts(settings),
        "index": coverage,
        "wiki": wiki_state,
        "services": service_readiness(settings, index),
        "dagster_ui": settings.kb_dagster_ui_url,
    }


def _guarded(collect) -> dict:
    # One unreadable store must not hide the rest of the panel.
    try:
        return collect()
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def capture_counts(settings: Settings) -> dict:
    """Sync batches from the capture manifests on disk."""
    return RawStore.from_settings(settings).capture_counts()


def index_coverage(index: ChunkIndex) -> dict:
    """Counts of the index, and per enrichment stage the share of bookmarks
    that need it and have its text in the index."""
    counts = index.counts()
    by_source: dict[str, dict] = {}
    with_source: dict[str, set[str]] = defaultdict(set)
    chunks = index.table(CHUNKS)
    if chunks is not None:
        table = chunks.search().select(["tweet_id", "source"]).limit(None).to_arrow()
        for tweet_id, source in zip(table.column("tweet_id").to_pylist(), table.column("source").to_pylist()):
            entry = by_source.setdefault(source, {"passages": 0, "bookmarks": 0})
            entry["passages"] += 1
            with_source[source].add(tweet_id)
        for source, ids in with_source.items():
            by_source[source]["bookmarks"] = len(ids)
    needs = _needs_from_cards(index)
    has_page_text = with_source["link"] | with_source["article"]
    # Wiki pages share the passages table (tweet_id wiki:<path>); they are
    # not bookmarks.
    bookmark_ids = set().union(*(ids for source, ids in with_source.items() if source != WIKI_SOURCE))
    stages = [
        _stage("indexed", needs["all"], bookmark_ids),
        _stage("links extracted", needs["links"], has_page_text),
        _stage("photos captioned", needs["photos"], with_source["image"]),
        _stage("videos transcribed", needs["videos"], with_source["video"]),
    ]
    return {
        "bookmarks": counts.get("bookmarks", 0),
        "indexed_bookmarks": len(bookmark_ids),
        "chunks": counts.get("chunks", 0),
        "model": counts.get("model"),
        "last_sync": counts.get("last_sync"),
        "vector_index": counts.get("vector_index"),
        "fts_unindexed_rows": counts.get("fts_unindexed_rows"),
        "by_source": dict(sorted(by_source.items())),
        "stages": stages,
        "wiki_pages_indexed": len(with_source[WIKI_SOURCE]),
    }


def _needs_from_cards(index: ChunkIndex) -> dict[str, set[str]]:
    needs: dict[str, set[str]] = {"all": set(), "links": set(), "photos": set(), "videos": set()}
    cards = index.table(BOOKMARKS)
    if cards is None:
        return needs
    table = cards.search().select(["tweet_id", "payload"]).limit(None).to_arrow()
    for tweet_id, payload in zip(table.column("tweet_id").to_pylist(), table.column("payload").to_pylist()):
        needs["all"].add(tweet_id)
        data = json.loads(payload or "{}")
        if any(link.get("kind") in ("link", "card", "article") for link in data.get("links") or []):
            needs["links"].add(tweet_id)
        media = data.get("media") or []
        if any(item.get("kind") == "photo" for item in media):
            needs["photos"].add(tweet_id)
        if any(item.get("kind") in VIDEO_KINDS for item in media):
            needs["videos"].add(tweet_id)
    return needs


def _stage(name: str, needed: set[str], done: set[str]) -> dict:
    return _count_stage(name, len(needed), len(needed & done))


def _count_stage(name: str, needed: int, done: int) -> dict:
    return {"stage": name, "done": done, "of": needed, "percent": round(100 * done / needed) if needed else None}


def wiki_counts(wiki: WikiReader, indexed: int) -> dict:
    if not wiki.exists():
        return {"exists": False, "pages": 0, "indexed": indexed, "by_type": {}}
    by_type: dict[str, int] = defaultdict(int)
    pages = [p for p in wiki.pages() if "/" in p.path]
    for page in pages:
        by_type[page.path.split("/", 1)[0]] += 1
    return {"exists": True, "pages": len(pages), "indexed": indexed, "by_type": dict(sorted(by_type.items()))}


def service_readiness(settings: Settings, index: ChunkIndex) -> dict:
    services = {"query_embedder": _query_embedder(settings, index),
                "browser": _browser(),
                "x_login": {"ready": settings.x_state_path.exists(),
                            "detail": "saved" if settings.x_state_path.exists() else "run `kb login`"},
                "dagster_ui": _answers(settings.kb_dagster_ui_url, "run `dagster dev`")}
    for key in ("groq_api_key", "deepseek_api_key", "anthropic_auth_token", "telegram_bot_token"):
        value = getattr(settings, key)
        is_set = value is not None and bool(value.get_secret_value())
        # Only whether a key is set: the panel never shows a secret.
        services[key] = {"ready": is_set, "detail": "set" if is_set else "not set"}
    return services


def _query_embedder(settings: Settings, index: ChunkIndex) -> dict:
    """Whether the search page can embed a query with the index's model.
    It checks that the model is there; it does not load it."""
    from kb.index.embed_local import local_model_path
    from kb.index.embed_ollama import ollama_models
    from kb.index.embed_vectors import EmbedderError

    info = index.model_info() if index.exists() else None
    if info is None:
        return {"ready": False, "detail": "the index has no vectors yet: run `kb sync`"}
    backend = info[0].split(":", 1)[0]
    if backend == "hash":
        return {"ready": True, "detail": f"{info[0]} (test embedder)"}
    if backend == "local":
        try:
            # The model of the index: an index of all-MiniLM-L6-v2 keeps it (Embedder.keeping_to).
            from kb.index.search import embedder_for_index

            name = embedder_for_index(info).local_model
            return {"ready": True, "detail": f"{info[0]} at {local_model_path(name, download=False)}"}
        except EmbedderError as exc:
            return {"ready": False, "detail": str(exc)}
    if backend == "ollama":
        try:
            names = ollama_models(settings.ollama_url, timeout=SERVICE_TIMEOUT_S)
        except EmbedderError as exc:
            return {"ready": False, "detail": f"{info[0]}: {exc}. Keyword search (mode bm25) still works."}
        model = info[0].split(":", 1)[1]
        has = any(name.split(":", 1)[0] == model.split(":", 1)[0] for name in names)
        return {"ready": has, "detail": f"{info[0]} at {settings.ollama_url}" if has
                else f"Ollama has no model {model}: run `ollama pull {model}`"}
    return {"ready": False, "detail": f"the index holds vectors of an unknown backend: {info[0]}"}


def _browser() -> dict:
    from kb.x.browser import Browser

    try:
        ready, detail = Browser.from_settings().readiness()
    except Exception as exc:  # noqa: BLE001 - the panel reports every failure
        ready, detail = False, f"{type(exc).__name__}: {exc}"
    return {"ready": ready, "detail": detail}


def _answers(url: str, hint: str) -> dict:
    try:
        response = httpx.get(url, timeout=SERVICE_TIMEOUT_S, follow_redirects=True)
        return {"ready": response.status_code < 500, "detail": f"{url} answers ({response.status_code})"}
    except httpx.HTTPError:
        return {"ready": False, "detail": f"{url} does not answer: {hint}"}
