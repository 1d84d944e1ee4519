"""`kb web`: a search page in the browser over the same search function as
`kb search` and the MCP server.

One page of plain HTML, CSS and JavaScript (static/), and JSON endpoints:

    GET /api/search?q=&author=&folder=&source=&after=&before=&mode=&limit=
        (mode: hybrid, the default; bm25; dense; or deep, the hybrid list
        that a cross-encoder sorts again: slower, a better order)
    GET /api/folders
    GET /api/bookmark/<tweet_id>
    GET /api/document?id=<tweet id or URL>&offset=<word offset>
    GET /api/wiki/search?q=&limit=
    GET /api/wiki/page?path=<wiki path>
    GET /api/status

The page keeps the search and its filters in the address (/?q=...&author=...)
and runs it on load, so a search can be bookmarked, shared and reloaded.

The app reads only the LanceDB index and the wiki files, like the MCP
server: it never opens DuckDB, so it answers while a sync writes. `kb web`
(serve()) is also the search service of kb-mcp (mcp_server/service.py), and
reads the passage rows from memory-mapped files that it writes into
settings.passage_rows_dir (kb/index/passage_rows.py, PassageRows.read()).

Security: it binds to 127.0.0.1 by default and has no login, so kb's guard
(kb/apps/owner_guard.py) stands in front of it, as in front of the Dagster
UI: it accepts only requests whose Host is a loopback name or the bound
host, with the served port (a web page that points its own domain name at
127.0.0.1 cannot read it: DNS rebinding), and no request from another
origin or site, except a top-level navigation to the page. Bookmark and wiki
text is untrusted: the page puts it into the document as text nodes, and
the Content-Security-Policy allows no inline script.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import asynccontextmanager
from pathlib import Path

from cachetools import TTLCache
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kb.index.reading import (DocumentNotFound, SourceKinds, WikiPageNotFound, bookmark_documents, bookmark_sources,
                               media_with_captions, source_list)
from kb.apps.owner_guard import OwnerOnly, ResponseHeaders
from kb.apps.web.reader import WikiReader, highlight_spans, page_path, query_terms, read_document, snippet
from kb.apps.web.status_panel import collect_web_status
from kb.apps.web.wiki_html import render_page
from kb.wiki_files import WIKI_SOURCE
from kb.index.folders import folders, folders_of
from kb.index.embed_vectors import EmbedderError
from kb.index.client import ChunkIndex
from kb.index.store import IndexModelMismatch, empty_index_note
from kb.index.search_request import check_query
from kb.settings import Settings, get_settings

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_LIMIT = 20
WIKI_LIMIT = 8
# The status panel asks services over HTTP; a page that polls it must not
# make each service answer again each time.
STATUS_CACHE_S = 5.0
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' https: data:; "
       "media-src https:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")


class KbJSON(JSONResponse):
    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=False, default=str).encode("utf-8")


def _error(status: int, message: str) -> KbJSON:
    return KbJSON({"error": message}, status_code=status)


class SecurityHeaders(ResponseHeaders):
    """Headers on every answer: no inline script, no framing, no sniffing
    of a JSON answer as HTML, no caching of data."""

    def __init__(self, app):
        super().__init__(app, _security_headers)


def _security_headers(path: str) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
               (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]
    if path.startswith("/api/"):
        headers.append((b"cache-control", b"no-store"))
    return headers


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


# --- endpoints ---------------------------------------------------------------------


def index_page(request: Request) -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


def _index(request: Request) -> ChunkIndex | None:
    """The index, or None before the first sync. A reader must not create
    the index folder (ChunkIndex would) in an empty KB_HOME."""
    index: ChunkIndex = request.app.state.index
    return index if index.exists() else None


def _source_kinds(request: Request) -> list[str]:
    state = request.app.state
    return state.kinds.of(state.index)


# The page's modes that are not a mode of search(): mode and rerank for each.
PAGE_MODES = {"deep": ("hybrid", True)}


def _search_mode(request: Request) -> tuple[str, bool]:
    """The search mode and the deep search flag of a request's `mode`. The
    page offers the deep search as a mode: one click away, and the address
    keeps it. search() refuses a mode that it does not know."""
    mode = _param(request, "mode") or "hybrid"
    return PAGE_MODES.get(mode, (mode, False))


def api_search(request: Request) -> KbJSON:
    from kb.index.rerank import RerankError
    from kb.index.search import search

    index = _index(request)
    query = _param(request, "q")
    mode, rerank = _search_mode(request)
    if index is None:
        return KbJSON({"query": query or "", "mode": mode, "hits": [], "last_sync": None,
                       "note": empty_index_note(request.app.state.index.path)})
    sources = bookmark_sources(source_list(_param(request, "source")), lambda: _source_kinds(request))
    if query is None or sources == []:
        return KbJSON({"query": query or "", "mode": mode, "hits": [], "last_sync": index.last_sync()})
    try:
        response = search(query, limit=_param(request, "limit") or DEFAULT_LIMIT, author=_param(request, "author"),
                          source=sources, after=_param(request, "after"), before=_param(request, "before"),
                          folder=_param(request, "folder"), mode=mode, index=index, rerank=rerank)
    except ValueError as exc:
        return _error(400, str(exc))
    except RerankError as exc:
        return _error(503, f"{exc} The other modes work without the cross-encoder.")
    except (EmbedderError, IndexModelMismatch) as exc:
        return _error(503, f"{exc} Keyword search (mode bm25) works without the embedder.")
    payload = response.to_dict()
    for hit in payload["hits"]:
        hit["highlights"] = highlight_spans(hit["best_chunk"], query)
    return KbJSON(payload)


def api_folders(request: Request) -> KbJSON:
    """The bookmark folders by their current names, with their bookmark counts."""
    index = _index(request)
    found = folders(index) if index is not None else []
    return KbJSON({"folders": [{"folder_id": f.folder_id, "name": f.name, "bookmarks": len(f.tweet_ids)}
                               for f in found]})


def api_bookmark(request: Request) -> KbJSON:
    index = _index(request)
    tweet_id = request.path_params["tweet_id"]
    card = index.bookmark(tweet_id) if index is not None else None
    if card is None:
        return _error(404, f"tweet_id={tweet_id!r} is not in the index: no bookmark has this id")
    card["folders"] = folders_of(index, tweet_id)
    card["media"] = media_with_captions(index, tweet_id, card.get("media") or [])
    card["documents"] = bookmark_documents(index.outline(tweet_id))
    return KbJSON(card)


def api_document(request: Request) -> KbJSON:
    target = _param(request, "id")
    if target is None:
        return _error(400, "id is missing: give a bookmark id or the URL of a document")
    index = _index(request)
    if index is None:
        return _error(404, f"id={target!r} is not in the index: the index is empty")
    try:
        page = read_document(target, _param(request, "offset") or 0, index=index)
    except DocumentNotFound as exc:
        return _error(404, str(exc))
    except ValueError as exc:
        return _error(400, str(exc))
    return KbJSON(page)


def api_wiki_search(request: Request) -> KbJSON:
    """Wiki pages for a query: through the index with the search function
    of the bookmarks when the index holds the wiki, else over the files."""
    from kb.index.search import search

    wiki: WikiReader = request.app.state.wiki
    query = _param(request, "q") or ""
    try:
        limit = max(1, min(100, int(_param(request, "limit") or WIKI_LIMIT)))
    except ValueError:
        return _error(400, f"limit={_param(request, 'limit')!r} is not a whole number")
    if query.strip():
        try:
            check_query(query)  # the files' search reads each word: a long query costs much
        except ValueError as exc:
            return _error(400, str(exc))
    if not query_terms(query):
        return KbJSON({"query": query, "exists": wiki.exists(), "searched": "nothing", "hits": []})
    if WIKI_SOURCE in _source_kinds(request):
        try:
            response = search(query, limit=limit, source=WIKI_SOURCE, mode=_search_mode(request)[0],
                              index=_index(request))
        except ValueError as exc:
            return _error(400, str(exc))
        except (EmbedderError, IndexModelMismatch) as exc:
            return _error(503, str(exc))
        hits = []
        for hit in response.hits:
            path = page_path(hit.best_ref)
            title, kind = wiki.describe(path)
            hits.append({"path": path, "title": title, "type": kind, "score": hit.score,
                         "snippet": snippet(hit.best_chunk, query_terms(query))})
        searched = "index"
    else:
        hits, searched = wiki.search(query, limit=limit), "files"
    for hit in hits:
        hit["highlights"] = highlight_spans(hit["snippet"], query)
    return KbJSON({"query": query, "exists": wiki.exists(), "searched": searched, "hits": hits})


def api_wiki_page(request: Request) -> KbJSON:
    wiki: WikiReader = request.app.state.wiki
    if not wiki.exists():
        return _error(404, f"there is no wiki at {wiki.root} yet")
    try:
        page = wiki.read(_param(request, "path") or "")
    except WikiPageNotFound as exc:
        return _error(404, str(exc))
    except ValueError as exc:
        return _error(400, str(exc))
    return KbJSON(render_page(page, wiki))


def api_status(request: Request) -> KbJSON:
    state = request.app.state
    with state.status_lock:  # one collection at a time: a second request waits and reads its answer
        status = state.status_cache.get("status")
        if status is None:
            status = state.status_cache["status"] = collect_web_status(state.settings, state.index, state.wiki)
    return KbJSON(status)


# --- the app -------------------------------------------------------------------------


def create_app(settings: Settings | None = None, *, bound_host: str = DEFAULT_HOST,
               warm_up: bool = False, rows_files: bool = False) -> Starlette:
    """The web app over the index and wiki that `settings` name.

    `bound_host`: the host that the server listens on. The app answers the
    loopback names and this host (any Host for 0.0.0.0 or ::), each with
    the port that the request came in on (kb/apps/owner_guard.py).
    `warm_up`: run one search before the app is returned (the query
    embedder loads, the index opens), so the first search does not wait.
    `rows_files`: the passage rows from memory-mapped files
    (settings.passage_rows_dir), as the search service reads them."""
    settings = settings or get_settings()
    routes = [
        Route("/", index_page),
        Route("/api/search", api_search),
        Route("/api/folders", api_folders),
        Route("/api/bookmark/{tweet_id}", api_bookmark),
        Route("/api/document", api_document),
        Route("/api/wiki/search", api_wiki_search),
        Route("/api/wiki/page", api_wiki_page),
        Route("/api/status", api_status),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    # SecurityHeaders outside the guard: the guard's refusals get the headers too.
    middleware = [Middleware(SecurityHeaders),
                  Middleware(OwnerOnly, bound_host=bound_host)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=_lifespan)
    app.state.settings = settings
    app.state.search_service = None
    # The search service: the rows as memory-mapped files. The page and
    # every relayed kb-mcp session search them in this process, without a
    # copy in its heap.
    app.state.index = ChunkIndex.from_settings(settings, rows_dir=str(settings.passage_rows_dir) if rows_files else "")
    app.state.kinds = SourceKinds()
    app.state.wiki = WikiReader(settings.wiki_dir)
    app.state.status_lock = threading.Lock()
    app.state.status_cache = TTLCache(maxsize=1, ttl=STATUS_CACHE_S)
    if warm_up:
        from kb.index.search import warm_up as warm_up_search

        warm_up_search(app.state.index)
    return app


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


@asynccontextmanager
async def _lifespan(app: Starlette):
    """At the end (uvicorn's shutdown, also on SIGTERM): remove the search
    service's socket, so that a new kb-mcp serves alone at once. Why here:
    uvicorn raises the signal again after its shutdown, so code after
    uvicorn.run() does not run."""
    yield
    service = app.state.search_service
    if service is not None:
        service.close()


def start_search_service(app: Starlette):
    """Serve kb-mcp's tools on the search service's socket, over the app's
    index: each kb-mcp that an agent client starts then relays to this
    process, which holds the model and the passages once
    (mcp_server/service.py). Without the socket, each kb-mcp serves alone."""
    from mcp_server import server as mcp
    from mcp_server.service import ServiceError, start_service

    mcp.INDEX.use(app.state.index)
    try:
        return start_service(app.state.settings.mcp_socket, mcp.build_server)
    except (ServiceError, OSError) as exc:
        log.warning("kb web does not serve kb-mcp sessions: %s. Each kb-mcp then serves alone.", exc)
        return None


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, settings: Settings | None = None) -> None:
    """Run the web app until Ctrl-C. A host other than loopback opens the
    page, which has no login, to the network: kb warns about it."""
    import uvicorn

    from kb.apps.connection_rules import RuledHTTPProtocol

    if not is_loopback(host):
        log.warning("kb web listens on %s: every machine that reaches it can read your bookmarks. "
                    "It has no login.", host)
    from kb.index.embed_local import use_cpu_threads

    # A serving process: one CPU thread for the query model, as kb-mcp
    # (see use_cpu_threads). kb web serves the relayed kb-mcp sessions too.
    use_cpu_threads(1)
    app = create_app(settings, bound_host=host, warm_up=True, rows_files=True)
    app.state.search_service = start_search_service(app)
    print(f"kb web: http://{host if ':' not in host else f'[{host}]'}:{port}/  (Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", http=RuledHTTPProtocol)
