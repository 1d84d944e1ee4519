"""kb-mcp: the MCP server over the kb search index, on stdio.

An agent (the model) calls these tools; retrieval returns passages, and the
agent reasons over them:
- search_bookmarks: hybrid search, one best passage per bookmark. By default
  the deep search (a cross-encoder sorts the first hits again): an agent
  waits seconds for its model anyway, and the deep search gives the best
  held-out order. rerank=false asks for the fast search.
- get_bookmark: the post, the author's thread under it, its quoted post, links,
  media and bookmark folders. No document bodies.
- read_document: the text behind a bookmark or a page, one bounded page at a
  time, or its best passages for a query.
- search_wiki, read_wiki_page: the same over the wiki that the agent keeps.

The server reads the LanceDB index and the wiki folder only. It never opens
DuckDB: a sync holds the DuckDB file for minutes, and the server must answer
while it runs. LanceDB tables are versioned, so a call sees one committed
version while the index asset writes the next one. No tool writes anything.

stdout carries the MCP messages, so logs go to stderr only. The channel itself
is in mcp_server/stdio_channel.py.

Register it with an agent client, for example: `claude mcp add kb -- kb-mcp`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from kb.index.reading import (PAGE_CHARS, PAGE_WORDS, Document, DocumentNotFound, OffsetError, Passage, SourceKinds,
                               WikiPageNotFound, bookmark_documents, bookmark_sources, clip_words, count_words,
                               media_with_captions, page_of, read_wiki_file, resolve_document, source_list, source_rank,
                               tweet_id_from, word_offsets)
from kb.index.folders import folders_of
from kb.index.rerank import RerankError, load_model
from kb.index.cards import served_card
from kb.index.search import SearchResponse, search, warm_up
from kb.index.search_request import MAX_LIMIT, check_query
from kb.wiki_files import WIKI_ID_PREFIX, WIKI_SOURCE
from kb.index.embed_local import use_cpu_threads
from kb.index.embed_vectors import EmbedderError
from kb.index.client import ChunkIndex
from kb.index.store import IndexModelMismatch, empty_index_note, to_utc
from kb.settings import get_settings
from mcp_server.stdio_channel import serve_stdio

log = logging.getLogger("kb.mcp")

SERVER_NAME = "kb"
INSTRUCTIONS = (
    "kb is the owner's knowledge store: X bookmarks with the pages, videos and photos behind them, "
    "and a wiki that an agent keeps. Start with search_bookmarks or search_wiki. Then use get_bookmark "
    "for a post, read_document to read the text behind a bookmark page by page (or with a query for its "
    "best passages), and read_wiki_page to read a wiki page."
)
# A caption with the text of a busy screenshot can be long; get_bookmark
# stays cheap.
CAPTION_WORDS = 300
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)


# --- the index, read only -------------------------------------------------------
class ReadOnlyIndex:
    """The LanceDB index, opened only when its folder exists: the server must
    not create a folder in an empty KB_HOME."""

    def __init__(self) -> None:
        self._index: ChunkIndex | None = None
        self._lock = threading.Lock()

    def use(self, index: ChunkIndex) -> None:
        """Serve this index (the search service: the index of kb web, so
        that the process holds one copy of the passages)."""
        with self._lock:
            self._index = index

    def get(self) -> ChunkIndex | None:
        settings = get_settings()
        with self._lock:
            if self._index is None or self._index.path != settings.lance_uri:
                index = ChunkIndex.from_settings(settings)
                if not index.exists():
                    return None
                self._index = index
            return self._index


INDEX = ReadOnlyIndex()
SOURCE_KINDS = SourceKinds()


def _last_sync(index: ChunkIndex | None) -> str | None:
    return index.last_sync() if index is not None else None


def _run_search(index: ChunkIndex, query: str, **kwargs) -> SearchResponse:
    """The one search function (as `kb search`), with its input errors as tool errors."""
    try:
        return search(query, index=index, **kwargs)
    except (ValueError, EmbedderError, IndexModelMismatch, RerankError) as exc:
        raise ToolError(str(exc)) from exc


def _check_query(query: str) -> None:
    try:
        check_query(query)
    except ValueError as exc:
        raise ToolError(str(exc)) from exc


# --- search_bookmarks ------------------------------------------------------------
HIT_FIELDS = ("tweet_id", "url", "author", "created_at", "score", "best_source", "best_chunk", "best_ref",
              "chunk_count", "word_count", "media", "lang", "best_source_text")


def search_bookmarks(
    query: Annotated[str, Field(description="Words to search for. Put a \"phrase\" in quotes to find it as it is.")],
    limit: Annotated[int, Field(description="Number of bookmarks, 1 to 100.")] = 10,
    author: Annotated[str | None, Field(description="Only posts by this X handle, for example karpathy.")] = None,
    source: Annotated[str | None, Field(description="Only passages of this kind: post, thread, quote, article, "
                                                    "link, video, image or telegram. Commas for more than one.")] = None,
    after: Annotated[str | None, Field(description="Only posts on or after this date (YYYY-MM-DD).")] = None,
    before: Annotated[str | None, Field(description="Only posts before this date (YYYY-MM-DD).")] = None,
    folder: Annotated[str | None, Field(description="Only bookmarks in this bookmark folder, by its name on X.")] = None,
    rerank: Annotated[bool, Field(description="true (the default): the deep search. A cross-encoder sorts the first "
                                              "20 hits again: the best order, about 0.3 to 1 s per call (more on a busy "
                                              "machine). false: the "
                                              "fast search, about 15 ms per call.")] = True,
) -> dict[str, Any]:
    """Search the bookmarks and the texts behind them (posts, the author's own thread under a post, quoted
    posts, articles, linked pages, video transcripts, photo captions), and the sources sent to the Telegram bot
    (best_source `telegram`, tweet_id `telegram:<item id>`, best_ref the parsed file): hybrid vector and keyword
    search, one best passage per bookmark or source.

    Filters apply before ranking. author: an X handle. source: post, thread, quote, article, link, video or image
    (commas for more than one). after (inclusive) and before (exclusive): YYYY-MM-DD or ISO 8601, on the post
    date. folder: a bookmark folder's name (an unknown name gets an error that names the folders). limit: 1 to 100 (a larger value is capped at 100). Each hit gives best_chunk (the passage that matched),
    best_ref (the page it came from) and word_count (of everything behind the bookmark): read more with
    read_document(tweet_id). By default a deep search: a cross-encoder sorts the first hits again (each sorted hit
    gets rerank_score); rerank=false gives the fast search. `search_mode` in the answer says which one ran: "deep" or
    "fast". When the cross-encoder cannot load, the answer comes from the fast search and `note` says why."""
    started = time.perf_counter()
    _check_query(query)
    index = INDEX.get()
    sources = _bookmark_sources(index, source)
    if index is None or sources == []:
        return _empty_search(query, limit, index, note=empty_index_note(get_settings().lancedb_dir),
                             after=after, before=before)
    arguments = {"limit": limit, "author": author, "source": sources, "after": after, "before": before,
                 "folder": folder}
    note = None
    if rerank:
        try:
            load_model()  # once per process; before the search, so that a missing model costs no second search
        except RerankError as exc:
            # The search must answer without the cross-encoder (a missing
            # package or model folder): the fast search, and a word why.
            log.warning("search_bookmarks: the deep search is not available: %s", exc)
            note = f"The deep search is not available, so these hits come from the fast search: {exc}"
            rerank = False
    response = _run_search(index, query, rerank=rerank, **arguments)
    fields = HIT_FIELDS + ("rerank_score",) if response.rerank else HIT_FIELDS
    hits = [{name: getattr(hit, name) for name in fields} for hit in response.hits]
    log.info("search_bookmarks: %d hits in %.0f ms", len(hits), (time.perf_counter() - started) * 1000)
    # The filters as the caller set them (the wiki is left out without a word).
    filters = _filters({**response.filters, "source": source})
    answer = {"query": response.query, "limit": response.limit, "filters": filters, "last_sync": response.last_sync,
              "index_model": response.model, "search_mode": "deep" if response.rerank else "fast",
              "count": len(hits), "hits": hits}
    if note:
        answer["note"] = note
    return answer


def _bookmark_sources(index: ChunkIndex | None, source: str | None) -> list[str] | None:
    """The source filter for a bookmark search: what the caller asked for, and
    never the wiki (search_wiki searches it). None: no filter needed."""
    asked = source_list(source)
    if set(asked) == {WIKI_SOURCE}:
        raise ToolError("source='wiki' holds the wiki pages: use search_wiki for them")
    return bookmark_sources(asked, lambda: SOURCE_KINDS.of(index) if index is not None else [])


def _empty_search(query: str, limit: int, index: ChunkIndex | None, note: str, **dates) -> dict:
    """The answer when there is nothing to search. The input is checked as
    search() checks it, so a bad input gets the same error either way."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ToolError(f"limit={limit!r} must be a whole number, 1 or more")
    for name, value in dates.items():
        try:
            to_utc(value, name=name)
        except ValueError as exc:
            raise ToolError(str(exc)) from exc
    return {"query": " ".join(query.split()), "limit": min(limit, MAX_LIMIT), "filters": {},
            "last_sync": _last_sync(index), "index_model": _index_model(index), "count": 0, "hits": [], "note": note}


def _index_model(index: ChunkIndex | None) -> str | None:
    """The embedding model of an index that the search did not read (an
    empty answer); a search gives it in its response (issue 48)."""
    info = index.model_info() if index is not None else None
    return info[0] if info else None


def _filters(filters: dict) -> dict:
    return {k: v for k, v in filters.items() if v not in (None, "", []) and k not in ("tweet_id", "ref")}


# --- get_bookmark ----------------------------------------------------------------
def get_bookmark(
    tweet_id: Annotated[str, Field(description="The tweet id of the bookmark, or its post URL.")],
) -> dict[str, Any]:
    """One bookmark: the full post text, the author's own thread under it (`thread`), the quoted post, author,
    date, the bookmark folders that hold it, every link, and every media item with its caption when one exists.
    No document bodies, so it is cheap: `documents` says what read_document can read
    (source, ref, words). tweet_id: the id, or the post URL."""
    tweet_id = _tweet_id_from(tweet_id, "tweet_id")
    index = INDEX.get()
    card = index.bookmark(tweet_id) if index is not None else None
    if card is None:
        if tweet_id.startswith(WIKI_ID_PREFIX):
            raise ToolError(f"tweet_id={tweet_id!r} is a wiki page, not a bookmark: use read_wiki_page")
        raise ToolError(f"tweet_id={tweet_id!r} is not in the index: no bookmark has this id")
    outline = index.outline(tweet_id)
    return {
        **served_card(card),
        "media": media_with_captions(index, tweet_id, card.get("media") or [], max_words=CAPTION_WORDS),
        # The author's own replies under the post, and the bookmark folders (current names) that hold it.
        "thread": card.get("thread") or [],
        "folders": folders_of(index, tweet_id),
        "documents": bookmark_documents(outline),
        "last_sync": index.last_sync(),
        # A source sent to the Telegram bot: its title, type, file name and parsed file.
        **({"source": {k: card.get(k, "") for k in ("source_kind", "item_id", "title", "type", "file_name",
                                                     "parsed_path")}} if card.get("source_kind") else {}),
    }


def _tweet_id_from(value: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{name} is empty: give a tweet id or a post URL")
    return tweet_id_from(value)


# --- read_document ---------------------------------------------------------------
def read_document(
    tweet_id_or_url: Annotated[str, Field(description="A tweet id or post URL (everything behind the bookmark), "
                                                      "or the URL of one page (a best_ref of search_bookmarks).")],
    query: Annotated[str | None, Field(description="Give the best passages of the document for these words, "
                                                   "instead of a page.")] = None,
    offset: Annotated[int, Field(description="Word offset of the page: 0, then next_offset.")] = 0,
) -> dict[str, Any]:
    """Read the text behind a bookmark (a tweet id or post URL: the post, quoted post, articles, linked pages,
    transcripts, captions) or one page (its URL, as in best_ref), in reading order.

    Without query: one page of at most about 2,000 words from `offset` (a word offset; start at 0). When
    has_more is true, call again with offset=next_offset. With query: the best passages of this document for
    the query, best first, within the same bound; each gives the offset to read on from there."""
    document = _resolve_document(tweet_id_or_url)
    if query is not None:
        return _document_passages(document, query)
    try:
        page = page_of(document["passages"], offset)
    except OffsetError as exc:
        raise ToolError(str(exc)) from exc
    log.info("read_document: %s words %d..%d of %d", document["label"], page.offset, page.offset + page.words,
             page.total_words)
    return {**document["header"], "offset": page.offset, "next_offset": page.next_offset,
            "has_more": page.has_more, "page_words": page.words, "total_words": page.total_words,
            "parts": page.parts, "last_sync": document["last_sync"]}


def _resolve_document(value: str) -> dict:
    """The passages of a bookmark (tweet id, post URL) or of a page (its URL)."""
    if not isinstance(value, str) or not value.strip():
        raise ToolError("tweet_id_or_url is empty: give a tweet id, a post URL or a page URL")
    index = INDEX.get()
    if index is None:
        raise ToolError(f"tweet_id_or_url={value.strip()!r} is not in the index: the index is empty")
    try:
        document = resolve_document(index, value, name="tweet_id_or_url")
    except (ValueError, DocumentNotFound) as exc:
        raise ToolError(str(exc)) from exc
    return _document(index, document)


def _document(index: ChunkIndex, document: Document) -> dict:
    rows = document.rows
    first = rows[0] if rows else {}
    created = first.get("created_at")
    header: dict[str, Any] = {
        "tweet_id": document.tweet_id,
        "ref": document.ref,
        "url": first.get("url", ""),
        "author": first.get("author", ""),
        "created_at": created.isoformat() if created is not None else None,
        "sources": sorted({r["source"] for r in rows}, key=lambda s: (source_rank(s), s)),
    }
    return {"index": index, "header": header, "passages": document.passages,
            "label": document.tweet_id or document.ref, "tweet_id": document.tweet_id, "ref": document.ref,
            "last_sync": index.last_sync()}


def _document_passages(document: dict, query: str) -> dict:
    """The best passages of one document for a query, within one page bound."""
    started = time.perf_counter()
    response = _run_search(document["index"], query, limit=MAX_LIMIT, tweet_id=document["tweet_id"],
                           ref=document["ref"])
    starts = dict(zip(((p.source, p.ref, p.position) for p in document["passages"]),
                      word_offsets(document["passages"])))
    passages, words, chars, cut = [], 0, 0, False
    for hit in response.hits:
        text, source_text = hit.best_chunk, hit.best_source_text
        size = count_words(text) + count_words(source_text)
        length = len(text) + len(source_text)
        if words + size > PAGE_WORDS or chars + length > PAGE_CHARS:
            if passages:
                cut = True
                break
            # One passage over the bound: keep its start only.
            text, _ = clip_words(text, PAGE_WORDS, PAGE_CHARS)
            source_text, size, length, cut = "", count_words(text), len(text), True
        words, chars = words + size, chars + length
        passages.append({
            "source": hit.best_source, "ref": hit.best_ref, "position": hit.best_position,
            "score": hit.score, "text": text, "source_text": source_text,
            "offset": starts.get((hit.best_source, hit.best_ref, hit.best_position)),
        })
        if cut:
            break
    log.info("read_document: %s query, %d passages in %.0f ms", document["label"], len(passages),
             (time.perf_counter() - started) * 1000)
    return {**document["header"], "query": response.query, "count": len(passages), "page_words": words,
            "total_words": sum(count_words(p.text) for p in document["passages"]),
            "has_more": cut, "passages": passages, "last_sync": document["last_sync"]}


# --- the wiki -----------------------------------------------------------------------
def search_wiki(
    query: Annotated[str, Field(description="Words to search for in the wiki pages.")],
    limit: Annotated[int, Field(description="Number of pages, 1 to 100.")] = 10,
) -> dict[str, Any]:
    """Search the wiki pages (sources, entities, concepts, syntheses) that the wiki agent wrote from the owner's
    sources: hybrid search, one best passage per page. Read a whole page with read_wiki_page(path). Empty until
    the wiki has pages."""
    _check_query(query)
    index = INDEX.get()
    if index is None or WIKI_SOURCE not in SOURCE_KINDS.of(index):
        empty = _empty_search(query, limit, index, note="The index has no wiki pages yet.")
        return {"query": empty["query"], "limit": empty["limit"], "last_sync": empty["last_sync"], "count": 0,
                "pages": [], "note": empty["note"]}
    response = _run_search(index, query, limit=limit, source=[WIKI_SOURCE])
    pages = [{"path": hit.best_ref, "score": hit.score, "passage": hit.best_chunk, "date": hit.created_at,
              "passages": hit.chunk_count, "words": hit.word_count} for hit in response.hits]
    log.info("search_wiki: %d pages", len(pages))
    return {"query": response.query, "limit": response.limit, "last_sync": response.last_sync,
            "count": len(pages), "pages": pages}


def read_wiki_page(
    path: Annotated[str, Field(description="The page path as search_wiki gives it, for example "
                                           "wiki/concepts/vector-search.md, or a link target: concepts/vector-search.")],
    offset: Annotated[int, Field(description="Word offset of the page: 0, then next_offset.")] = 0,
) -> dict[str, Any]:
    """Read one wiki page: its Markdown text (with frontmatter), at most about 2,000 words from `offset`; when
    has_more is true, call again with offset=next_offset. path: as search_wiki gives it
    (wiki/concepts/vector-search.md), or a link target (concepts/vector-search). Only pages inside the wiki folder.
    Also gives the page's title, type, date (UTC, ISO 8601, or null) and the pages that it links (link targets)."""
    try:
        wiki_file = read_wiki_file(get_settings().wiki_dir, path)
        page = page_of([Passage(WIKI_SOURCE, wiki_file.path, 0, wiki_file.text)], offset)
    except (ValueError, WikiPageNotFound) as exc:  # WikiPathError and OffsetError are ValueErrors
        raise ToolError(str(exc)) from exc
    # Title, type, date and links by the one reader of a page (kb.wiki_files.read_page),
    # as the web page, the index and the checks read them.
    read = wiki_file.page
    return {"path": wiki_file.path, "title": read.title, "type": read.type,
            "date": read.date.isoformat() if read.date else None,
            "links": list(dict.fromkeys(link.target for link in read.links if link.target)),
            "offset": page.offset, "next_offset": page.next_offset, "has_more": page.has_more,
            "page_words": page.words, "total_words": page.total_words,
            "text": "".join(part["text"] for part in page.parts)}


# --- the server ------------------------------------------------------------------
TOOLS = (search_bookmarks, get_bookmark, read_document, search_wiki, read_wiki_page)


def build_server() -> MCPServer:
    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, log_level="INFO")
    for tool in TOOLS:
        server.add_tool(tool, annotations=READ_ONLY, structured_output=True)
    return server


def configure_logging() -> None:
    # stdout is the MCP channel: one stray line there breaks the client.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    """The console command `kb-mcp`: serve the tools on stdin and stdout."""
    configure_logging()
    # Agent clients start one server each; one CPU thread per server keeps
    # them from fighting for the cores (see use_cpu_threads).
    use_cpu_threads(1)
    settings = get_settings()
    server = build_server()
    # Load the query embedder before the server says it is ready: else the
    # first search_bookmarks waits for it.
    index = INDEX.get()
    took = warm_up(index) if index is not None else None
    if took is not None:
        log.info("kb-mcp loaded the query embedder and the index in %.1f s", took)
    log.info("kb-mcp serves the index at %s and the wiki at %s", settings.lance_uri, settings.wiki_dir)
    serve_stdio(server)



if __name__ == "__main__":
    main()
