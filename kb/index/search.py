"""The one search function for the CLI, the MCP server and any UI.

Modes:
- `bm25`: LanceDB's native full-text index (BM25).
- `dense`: cosine similarity of embedding vectors.
- `hybrid` (default): both, fused.

Fusion (hybrid): kb/index/fusion.py. Exact words first (the exact phrase,
rare words): kb/index/exact_words.py. Deep search (`rerank=True`): a
cross-encoder sorts the first hits again, kb/index/deep_search.py.

Results: one best passage per bookmark, with chunk_count and word_count of
everything behind the bookmark. With `tweet_id` or `ref` set (read one
document), results are passages of that document, best first.

Filters apply before ranking (prefilter), so `source="video", limit=3`
returns 3 hits when 3 videos exist. On a table with a vector index, the
index's coarse (PQ) distances choose the candidates of the nearest
partitions, and the stored vectors order them (_refined()). A dense search
under a filter that leaves few rows is exact; under a wider filter it
scans enough partitions to fill its list (_dense()). The stored vectors
come from the passage rows (mapped files in the search service of `kb
web`), not from reads through Lance (8 to 13 us a row). `folder` keeps to the bookmarks of one
bookmark folder, by its current name or its id (kb/index/folders.py). A
narrow filter (at most ROW_ALLOWLIST_MAX_ROWS rows), and a filter of source
kinds alone, finds its rows once per table version; the full-text queries
and the vector query get them as Lance's row allowlist
(kb/index/full_text.py), not the SQL. Under a filter of source kinds that
leaves at least half the rows, the vector query runs without the filter
and leaves out the other kinds (kb/index/dense.py). The serving side reads LanceDB only and
never opens DuckDB, so search works while a sync writes.

Speed: a search reads one table version, as a Lance dataset (pylance, not
LanceDB's query builders: see ChunkIndex.dataset()). The two retrievers and
the rare-word look-ups give row ids and scores only; they run at the same
time. The other columns of the candidates and of the hits come from memory
(ChunkIndex.passage_rows()), not from reads by row id. The candidates
are plain objects: the rules read one column of each (from Python lists)
and the text of those that a rule must look at, lowered once per search.
The result of a rare-word look-up is kept with the rows of the table
version, by filter and word, so a word looked up before costs no Lance
query until the next version; the word counts of a server spare the
look-up of a common word (kb/index/exact_words.py). A table without a vector index (fewer
rows than kb_vector_index_min_rows) is searched in numpy from its vectors
in memory, with the same distance and order as Lance. Figures:
benchmarks/index_and_retrieval.md.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timezone

import numpy as np
from lance.dataset import serialize_row_addrs

from kb.index import dense
from kb.index.deep_search import reranked_by_model
from kb.index.dense import EXACT_FILTER_ROWS, _dense, _exact_dense, _filter_rows, _kept
from kb.index.embedder import Embedder
from kb.index.exact_words import (EARLY_PROBES, MAX_PROBES, WORD_CACHE_IDS, WORD_CACHE_WORDS,
                                  count_new_fragments, indexed_words, is_keyword_query, keep_rare_in_top,
                                  LowerTexts, query_phrases, PhraseTest, rare_candidates, rare_word_max, skip_common_words,
                                  lowered_words, words_to_look_up)
from kb.index.folders import folder_members
from kb.index.full_text import ROW_ID, _bm25, _fts
from kb.index.fusion import FUSION_METHODS, Candidate, score_candidates
from kb.index.client import ChunkIndex
from kb.index.maintenance import vector_index_name
from kb.index.store import CHUNKS, IndexModelMismatch, empty_index_note, sql_in, sql_str
from kb.index.chunk_schema import AUTHOR_KEY_COLUMN, NGRAM_COLUMN, author_key
from kb.index.passage_rows import PassageRows
from kb.index.search_request import SearchRequest
from kb.settings import get_settings

# A filter that leaves at most this many rows gives the full-text queries of
# a search (BM25 and the rare-word look-ups) its row ids, as Lance's row
# allowlist (_Scope.allow), not its SQL: Lance evaluated the SQL again for
# each query. At 1,000,000 passages `tweet_id IN (2,000 values)` cost about
# 15 ms of CPU per query, and a search of a folder makes 4 to 6 of them;
# the allowlist of 6,000 rows costs about 3 ms per query, with the same
# rows and scores (benchmarks/index_and_retrieval.md, "Issue 58").
ROW_ALLOWLIST_MAX_ROWS = EXACT_FILTER_ROWS
# A wider filter of source kinds only gets its row allowlist too (_row_allowlist()).
WIDE_SOURCE_ALLOWLIST = True

RESULT_COLUMNS = ["chunk_id", "tweet_id", "url", "author", "created_at", "source", "ref", "position",
                  "text", "source_text", "word_count", "lang", "bookmark_chunks", "bookmark_words"]
# The retrievers give the row id and the score only. Grouping reads one
# column of each candidate from memory (the tweet id; source, ref and
# position when one document is read), the rules read the text of the
# candidates that they must look at, and the other result columns are read
# only for the hits shown (benchmarks/index_and_retrieval.md).
# LanceDB runs a query in native code and releases the GIL, so the lexical
# and the vector query (and the rare-word look-ups) run at the same time.
# One worker for each query of a search: the lexical list, the dense list and
# the rare-word look-ups; none waits for a free worker.
# _pick() reads the keys of the ranked candidates in blocks of this many.
PICK_BLOCK = 64
_POOL = ThreadPoolExecutor(max_workers=2 + EARLY_PROBES, thread_name_prefix="kb-search")


@dataclass
class Hit:
    tweet_id: str
    url: str
    author: str
    created_at: str | None
    score: float
    best_source: str
    best_chunk: str
    best_ref: str
    chunk_count: int
    word_count: int
    media: list = field(default_factory=list)
    lang: str = ""
    best_source_text: str = ""
    best_position: int = 0
    chunk_id: str = ""
    exact_match: bool = False
    rerank_score: float | None = None  # the cross-encoder's score, for the hits that it sorted (rerank=True)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SearchResponse:
    query: str
    mode: str
    hits: list[Hit]
    limit: int
    filters: dict
    model: str | None = None
    last_sync: str | None = None
    took_ms: float = 0.0
    note: str | None = None  # set when there is nothing to search: what to do
    rerank: bool = False  # the cross-encoder sorted the first hits again (kb.index.rerank)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["hits"] = [h.to_dict() for h in self.hits]
        return out


def search(query: str, **options) -> SearchResponse:
    """Search the index. The options: SearchRequest (kb/index/search_request.py),
    plus `index` (a ChunkIndex; else the one of the settings) and `embedder`
    (the query embedder; else the index's default).

    `kb index --rebuild` swaps the passages table for a new one under the
    readers (kb/index/model_choice.py). A search that pinned the old table
    then finds its files gone ("Not found"): it reads the new table once
    more, so search works during the rebuild."""
    try:
        return _search(query, **options)
    except (OSError, ValueError) as exc:
        if "Not found:" not in str(exc):
            raise
    index = options.get("index")
    if index is not None:  # forget the old table: the next read opens the new one
        index._datasets.clear()
        index._rows = None
    return _search(query, **options)


def _search(query: str, *, index: ChunkIndex | None = None, embedder: Embedder | None = None,
            **options) -> SearchResponse:
    """Search the index: the steps below, in order. The options: SearchRequest
    (kb/index/search_request.py)."""
    started = time.perf_counter()
    request = SearchRequest(query, **options)
    index = index or ChunkIndex.from_settings()
    # One pinned version for the whole search: the row ids stay valid.
    table = index.dataset(CHUNKS)
    schema = table.schema if table is not None else None
    meta = index.meta(table, schema=schema)
    response = SearchResponse(query=request.query, mode=request.mode, hits=[], limit=request.limit,
                              filters=request.filters, model=meta.get("model"), last_sync=meta.get("last_sync"),
                              rerank=request.rerank)
    if table is None:
        response.note = empty_index_note(index.path)
    else:
        scope = _scope(request, index, table)
        if scope is not None:
            retrieved = _retrieve(request, index, scope, embedder)
            chosen = _ranked(request, scope, retrieved)
            if request.rerank:
                chosen = reranked_by_model(request.query, scope.rows, chosen, request.per_document)[:request.limit]
            response.hits = _hits(index, scope.rows, chosen)
    response.took_ms = _ms(started)
    return response


@dataclass
class _Scope:
    """The table version that one search reads and its filter (_scope())."""

    table: object  # the passages table at one version (a Lance dataset)
    schema: object
    where: str | None  # the filter as Lance SQL
    rows: PassageRows
    texts: LowerTexts
    table_rows: int
    # The rows of a narrow filter as Lance's row allowlist, for the
    # full-text queries (_row_allowlist()); None: they take `where`.
    allow: bytes | None = None


def _scope(request: SearchRequest, index: ChunkIndex, table) -> _Scope | None:
    """Step 1: the filters as a where clause, and the rows in memory. None
    when the folder filter holds no bookmark: nothing can match."""
    schema = table.schema
    in_folder = folder_members(index, request.folder) if request.folder else None
    if in_folder == []:
        return None
    where = _where(author=request.author, sources=request.sources, after=request.after, before=request.before,
                   tweet_id=request.tweet_id, ref=request.ref, tweet_ids=in_folder,
                   author_keys=AUTHOR_KEY_COLUMN in schema.names)
    index.check_schema(schema=schema)
    rows = index.passage_rows(table)
    count_new_fragments(rows)
    allow = _row_allowlist(table, rows, where, request.only_sources) if where and request.wants_lexical else None
    return _Scope(table=table, schema=schema, where=where, rows=rows, texts=LowerTexts(rows),
                  table_rows=table.count_rows(), allow=allow)


@dataclass
class _Retrieved:
    """The candidates of the retrievers, by row id (_retrieve())."""

    candidates: dict[int, Candidate]
    lexical: list[tuple[int, float]] | None  # None: no lexical query (mode dense)
    rare_ids: set[int] | None  # the passages that hold the rare query words
    # The passages that hold each rare query word, of the look-ups that found
    # them all (at most rare_max): {word: row ids} (_mark_exact()).
    word_rows: dict[str, set[int]] = field(default_factory=dict)


def _retrieve(request: SearchRequest, index: ChunkIndex, scope: _Scope, embedder: Embedder | None) -> _Retrieved:
    """Step 2: the dense and the lexical (BM25) retrievers, and the look-ups
    of rare words. The full-text query and the rare-word look-ups start on
    worker threads before the query embedding, and run while this thread
    embeds the query (all of them release the GIL)."""
    dense_rows = lexical_rows = early_probes = None
    if request.wants_dense and request.query_vector is not None:
        dense_rows = _start_dense(request, scope, request.query_vector)
    if request.wants_lexical:
        lexical_rows = _POOL.submit(_bm25, scope.table, request.query, scope.where, request.depth, scope.allow)
        early_probes = _early_probes(request, scope)
    if request.wants_dense and dense_rows is None:
        dense_rows = _start_dense(request, scope, _embed_query(request.query, index, scope.schema, embedder))
    # Candidates by row id. The retrievers give row ids and scores only.
    candidates: dict[int, Candidate] = {}
    if dense_rows is not None:
        for rank, (row_id, distance) in enumerate(dense_rows.result()):
            cand = candidates.setdefault(row_id, Candidate(row_id))
            cand.dense, cand.dense_rank = 1.0 - distance, rank
    if lexical_rows is None:
        return _Retrieved(candidates, None, None)
    lexical = lexical_rows.result()
    for rank, (row_id, score) in enumerate(lexical):
        cand = candidates.setdefault(row_id, Candidate(row_id))
        cand.bm25, cand.bm25_rank = score, rank
    word_rows: dict[str, set[int]] = {}
    rare_ids = _rare_word_passages(scope.table, scope.rows, scope.table_rows, request.query, scope.where, lexical,
                                   candidates, early_probes, scope.texts, scope.allow, word_rows)
    return _Retrieved(candidates, lexical, rare_ids, word_rows)


def _start_dense(request: SearchRequest, scope: _Scope, vector: np.ndarray):
    """The dense query, as a Future: in numpy from the vectors in memory
    when the table has no vector index and only source kinds filter it,
    else a Lance query on a worker thread."""
    if scope.rows.vectors is not None and request.only_sources:
        return _Done(_exact_dense(scope.rows.vectors, vector, request.depth, request.sources or None))
    kinds = request.sources if request.only_sources and request.sources else None
    return _POOL.submit(_dense, scope.table, scope.rows, vector, scope.where, request.depth, scope.table_rows, kinds,
                        scope.allow)


def _early_probes(request: SearchRequest, scope: _Scope) -> list[tuple] | None:
    """The look-ups of the rare query words that can start at once."""
    words = rare_candidates(request.query)
    if request.only_sources:
        skip_common_words(scope.rows, words, scope.where, scope.table_rows, request.sources or None)
    if 0 < len(words) <= EARLY_PROBES and rare_word_max(scope.table_rows) >= request.depth:
        # Few words, and no count in the lexical list can show that one
        # is common (it holds at most `depth` hits): each word is looked
        # up (see _rare_word_passages), so the look-ups need not wait
        # for the lexical list. Of more than MAX_PROBES words, the count
        # then chooses the ones whose look-ups are used.
        return _probe(scope.table, scope.rows, scope.table_rows, words, scope.where, scope.allow)
    return None


def _ranked(request: SearchRequest, scope: _Scope, retrieved: _Retrieved) -> list[Candidate]:
    """Step 3: fuse the scores, put the exact phrase and the rare words
    first, and choose one passage per bookmark (or per position of the
    document that is read): request.picked of them."""
    candidates = retrieved.candidates
    cands = list(candidates.values())
    _mark_exact(request, scope, retrieved, cands)
    score_candidates(cands, request.mode, request.fusion)
    keyword_query = is_keyword_query(request.query)
    if retrieved.rare_ids:
        for cand in cands:
            cand.rare = cand.row_id in retrieved.rare_ids
    picked = request.picked
    with_keys = _key_reader(scope.rows, request.per_document)
    if keyword_query:
        ranked = sorted(candidates.values(), key=lambda c: (c.exact, c.rare, c.score), reverse=True)
        return _pick(ranked, picked, with_keys)
    ranked = sorted(candidates.values(), key=lambda c: (c.exact, c.score), reverse=True)
    return keep_rare_in_top(ranked, _pick(ranked, picked, with_keys), picked, with_keys)


def _key_reader(rows: PassageRows, per_document: bool) -> Callable[[list[Candidate]], None]:
    """A function that sets the key of the candidates that have none: the
    tweet id, or (source, ref, position) when one document is read. Only the
    candidates that the choice looks at get a key (_pick()): under one
    source kind at 1,000,000 passages a search has about 1,100 candidates
    (most of them from the look-ups of rare words), and it looks at a few
    dozen (benchmarks/index_and_retrieval.md)."""
    names = ("source", "ref", "position") if per_document else ("tweet_id",)

    def with_keys(cands: list[Candidate]) -> None:
        missing = [c for c in cands if c.key is None]
        if not missing:
            return
        ids = [c.row_id for c in missing]
        columns = [rows.column(name, ids) for name in names]
        keys = zip(*columns) if per_document else columns[0]
        for cand, key in zip(missing, keys):
            cand.key = key

    return with_keys


def _mark_exact(request: SearchRequest, scope: _Scope, retrieved: _Retrieved, cands: list[Candidate]) -> None:
    """Mark the candidates that hold the exact quoted phrases. A passage that
    holds the exact phrase holds every query word, so the full-text query
    matched it: when that list was not cut at the depth, only its passages
    can hold the phrase."""
    phrases = query_phrases(request.query)
    if not phrases:
        return
    lexical = retrieved.lexical
    if lexical is None or len(lexical) >= request.depth or not indexed_words(request.query):
        looked_at = cands
    else:
        lexical_ids = {row_id for row_id, _ in lexical}
        looked_at = [c for c in cands if c.row_id in lexical_ids]
    looked_at = _may_hold_phrases(scope.rows, phrases, retrieved.word_rows, looked_at)
    holds_phrases = PhraseTest(phrases)
    for cand, text in zip(looked_at, scope.texts.lowered([c.row_id for c in looked_at])):
        cand.exact = holds_phrases(text)


def _may_hold_phrases(rows: PassageRows, phrases: list[str], word_rows: dict[str, set[int]],
                      cands: list[Candidate]) -> list[Candidate]:
    """The candidates that can hold the phrases, by the look-ups of rare
    words: a passage with an ASCII-only text that holds an ASCII phrase
    word is one of the passages that the look-up of that word found (when
    it found them all). Why: in Python and in Lance's tokenizer a word of
    ASCII letters and digits between characters that are not letters, digits
    or "_" is the same word, lowered and stemmed alike. Under one source kind
    at 1,000,000 passages a search has about 1,100 candidates (the rows of
    the rare words), of which about 300 remain: the phrase test read 6 MB
    of text per search. A text with other characters keeps the test (in
    Python a combining mark, or the "i" of "İ" lowered, can end a word that
    Lance's tokenizer does not end there). The ASCII flags come with the
    word counts (PassageRows.count_words()); without them, each candidate
    keeps the test."""
    sets = [word_rows[w] for w in {w for p in phrases for w in p.split(" ")} if w.isascii() and w in word_rows]
    if not sets or not cands:
        return cands
    ascii_texts = rows.ascii_texts([c.row_id for c in cands])
    if ascii_texts is None:
        return cands
    return [c for c, plain in zip(cands, ascii_texts) if not plain or all(c.row_id in s for s in sets)]


def warm_up(index: ChunkIndex | None = None, *, mode: str = "hybrid") -> float | None:
    """Run one search, so that a server loads the query embedder and the
    index parts that a search reads before it says that it is ready. Else
    the first query pays for them (the query model load, and the index
    parts that each query reads). mode="bm25" warms all but the embedder.

    Returns the seconds it took, or None when the index is empty or the
    search failed. Never raises: the first real search reports the error."""
    started = time.perf_counter()
    index = index or ChunkIndex.from_settings()
    try:
        table = index.dataset(CHUNKS)
        if table is None:
            return None
        prewarm_indexes(table)
        # The word counts, so that no search looks up a common word. At
        # 100,000 passages they take 7 to 10 s of CPU, so they run on their
        # own thread: the server says that it is ready before they end (until
        # then a search looks up more words, as without counts).
        rows = index.passage_rows(table)
        rows.words_of = lowered_words
        count_new_fragments(rows)
        search("warm up", index=index, limit=1, mode=mode)
    except Exception as exc:  # noqa: BLE001 - a server must start without it
        import logging

        logging.getLogger(__name__).warning("The search did not warm up: %s", exc)
        return None
    return time.perf_counter() - started


def prewarm_indexes(table) -> None:
    """Load the vector index into the readers' cache (Lance's index cache):
    else the first queries load the partitions that they read (at 100k
    passages, the first queries took 1.5 times the CPU of the later ones).
    Not the full-text index: Lance loads the posting list of each query word
    when a query first asks for it, and a prewarm loads the lists of every
    word. At 100,000 passages the prewarm put 70 MB of lists in the cache;
    300 queries without it loaded 29 MB, and the second 300 cost the same
    CPU as with the prewarm (benchmarks/index_and_retrieval.md)."""
    name = vector_index_name(table)
    if name:
        table.prewarm_index(name)


# --- the filter ------------------------------------------------------------
def _where(*, author, sources, after, before, tweet_id, ref, tweet_ids=None, author_keys=True) -> str | None:
    """The filter as Lance SQL. author_keys: the table has AUTHOR_KEY_COLUMN
    (with its scalar index); a table from before issue 49 lacks it until
    the next write or maintain() adds it, and then lower(author) serves."""
    parts = []
    if author and author_keys:
        parts.append(f"{AUTHOR_KEY_COLUMN} = {sql_str(author_key(author))}")
    elif author:
        parts.append(f"lower(author) = {sql_str(author_key(author))}")
    if sources:
        parts.append(sql_in("source", sources))
    if after:
        parts.append(f"created_at >= timestamp {sql_str(after.strftime('%Y-%m-%dT%H:%M:%S.%fZ'))}")
    if before:
        parts.append(f"created_at < timestamp {sql_str(before.strftime('%Y-%m-%dT%H:%M:%S.%fZ'))}")
    if tweet_id is not None:
        parts.append(f"tweet_id = {sql_str(str(tweet_id))}")
    if ref is not None:
        parts.append(f"ref = {sql_str(ref)}")
    if tweet_ids:  # the bookmarks of a folder
        parts.append(sql_in("tweet_id", tweet_ids))
    return " AND ".join(parts) or None


# --- retrieval ---------------------------------------------------------------
def _embed_query(query: str, index: ChunkIndex, schema, embedder: Embedder | None) -> np.ndarray:
    if embedder is None:
        return _default_embedder(index, schema).embed_query(query)
    return index.embedder_for(embedder, schema=schema).embed_query(query)


_DEFAULT_EMBEDDERS: dict[tuple, Embedder] = {}


def _default_embedder(index: ChunkIndex, schema) -> Embedder:
    """The embedder of the settings for an index that records this model,
    made and checked once: making it and checking it against the index cost
    about 1 ms per search (kb-mcp and kb web call search() with no embedder).
    The settings object is new when the environment changes (get_settings()),
    so a new KB_HOME or backend gets a new embedder."""
    settings = get_settings()
    key = (id(settings), index.model_info(schema=schema))
    embedder = _DEFAULT_EMBEDDERS.get(key)
    if embedder is None:
        embedder = index.embedder_for(Embedder.from_settings(settings), schema=schema)
        if len(_DEFAULT_EMBEDDERS) >= 8:
            _DEFAULT_EMBEDDERS.clear()
        _DEFAULT_EMBEDDERS[key] = embedder
    return embedder


def embedder_for_index(info: tuple[str, int] | None) -> Embedder:
    """The default embedder for a search of an index that holds `info`
    (model, dimension): see Embedder.keeping_to."""
    return Embedder.from_settings().keeping_to(info[0] if info else None)


_ALLOWLISTS: dict[tuple, bytes] = {}
_FTS_COVERS: dict[tuple, bool] = {}


def _row_allowlist(table, rows: PassageRows, where: str, only_sources: bool = False) -> bytes | None:
    """The rows that `where` leaves, as Lance's row allowlist (a serialized
    bitmap of row ids: the table has no stable row ids, so a row id is the
    row's address), when they are at most ROW_ALLOWLIST_MAX_ROWS, or when
    only source kinds filter (only_sources, WIDE_SOURCE_ALLOWLIST), and the
    full-text indexes cover every row. Kept per table version, with the
    filter's rows (_filter_rows()). None: the full-text queries take `where`.

    A wide filter of source kinds: the MCP server and kb web give each
    search the same kinds, so the list is made once per table version (at
    1,000,000 passages, 3 kinds of 4: 750,000 rows, 0.11 s and 139 kB).
    Under it Lance's BM25 query cost 3.0 ms of CPU, under the SQL filter
    7.6 ms. Other wide filters (a long date window, a large author) change
    from search to search: they keep the SQL filter.

    Why only a covered table: Lance scores the rows that no index segment
    covers yet (a sync's new rows before maintain() folds them in) by a flat
    search, and there its BM25 statistics differ between the allowlist and
    the SQL filter (tried on lance 13: 18.9 against 19.7 for the same row).
    Over indexed rows both give the same rows and scores."""
    if table.has_stable_row_ids:  # then a row id is not the row's address (kb's tables have none)
        return None
    ids = _filter_rows(table, rows, where)
    # _filter_rows() gives at most EXACT_FILTER_ROWS + 1 rows: more means a wide filter too.
    wide = len(ids) > min(ROW_ALLOWLIST_MAX_ROWS, dense.EXACT_FILTER_ROWS)
    if (wide and not (only_sources and WIDE_SOURCE_ALLOWLIST)) or not _fts_covers_every_row(table, rows):
        return None
    if wide:
        def every_row() -> bytes:
            found = table.to_table(columns=[], with_row_id=True, filter=where).column(ROW_ID).to_numpy()
            return serialize_row_addrs(found.tolist())

        return _kept(_ALLOWLISTS, (table.uri, rows.identity, where), every_row)
    return _kept(_ALLOWLISTS, (table.uri, rows.identity, where), lambda: serialize_row_addrs(ids.tolist()))


def _fts_covers_every_row(table, rows: PassageRows) -> bool:
    """True when each full-text index (words and n-grams) has a segment
    that covers each data fragment of this table version."""
    def count() -> bool:
        fragments = {f.fragment_id for f in table.get_fragments()}
        full_text = [ix for ix in table.describe_indices() if ix.field_names in (["text"], [NGRAM_COLUMN])]
        return bool(full_text) and all(
            fragments <= {f for segment in ix.segments for f in segment.fragment_ids} for ix in full_text)

    return _kept(_FTS_COVERS, (table.uri, rows.identity), count)


class _Done:
    """A result at hand, with the interface of a Future."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


def _probe(table, rows: PassageRows, table_rows: int, words: list[str], where: str | None,
           allow: bytes | None = None) -> list[tuple]:
    """One full-text look-up per word: at most rare_max + 1 passages each.
    A word that a search with the same filter looked up before on this
    table version needs no look-up: its result is in rows.word_holders, by
    filter and word (the same version and filter give the same result).
    Each look-up costs about 1.6 ms of CPU. allow: the rows of `where` as a
    row allowlist (_row_allowlist())."""
    known = rows.word_holders
    return [(word, known[(where, word)], None) if (where, word) in known
            else (word, None, _POOL.submit(_fts, table, word, where, rare_word_max(table_rows) + 1, allow=allow))
            for word in words]


def _holders(rows: PassageRows, probe: tuple, rare_max: int, where: str | None) -> list[int] | None:
    """The row ids of the passages that hold the word of this look-up, best
    first, or None when it is absent (or a stop word to the index) or common."""
    word, known, future = probe
    if future is None:
        return None if known is None else known.tolist()
    found = future.result()
    ids = [row_id for row_id, _ in found] if found and len(found) <= rare_max else None
    kept = rows.word_holders
    if len(kept) < WORD_CACHE_WORDS:
        if ids is None:
            kept[(where, word)] = None
        elif rows.word_ids_kept + len(ids) <= WORD_CACHE_IDS:
            kept[(where, word)] = array("Q", ids)  # 8 bytes an id; a tuple of ints takes 40
            rows.word_ids_kept += len(ids)
    return ids


def _rare_word_passages(table, rows: PassageRows, table_rows: int, query: str, where: str | None,
                        lexical: list[tuple[int, float]], candidates: dict[int, Candidate],
                        probes: list[tuple] | None, texts: LowerTexts, allow: bytes | None = None,
                        word_rows: dict[str, set[int]] | None = None) -> set[int] | None:
    """Row ids of the passages that hold every rare word of the query, or
    None when the query has no rare word. Those passages join the candidates,
    so a rare word is found even when neither list ranked its passage.
    probes: the look-ups of every query word, when they already started.
    word_rows: gets {word: row ids} of each rare word (_mark_exact())."""
    rare_max = rare_word_max(table_rows)
    held_by = dict.fromkeys(rare_candidates(query), 0)
    known = rows.word_holders
    if all((where, word) in known and known[(where, word)] is None for word in held_by):
        # No word is rare (an empty query too): whichever words the count
        # below chose, the answer is None. The count costs about 0.5 ms for
        # a query of 5 words.
        return None
    if probes is None or len(probes) > MAX_PROBES:
        started = {probe[0]: probe for probe in probes or ()}
        maybe_rare = words_to_look_up(rows, held_by, rare_max, where, lexical, texts)
        for word, (_, _, future) in started.items():
            if future is not None and word not in maybe_rare:
                future.cancel()  # started early, but not one of the words chosen by the count
        if not maybe_rare:
            return None
        new = iter(_probe(table, rows, table_rows, [w for w in maybe_rare if w not in started], where, allow))
        probes = [started[w] if w in started else next(new) for w in maybe_rare]
    holders: set[int] | None = None
    for probe in probes:
        ids = _holders(rows, probe, rare_max, where)
        if ids is None:
            continue
        for row_id in ids:
            if row_id not in candidates:
                candidates[row_id] = Candidate(row_id)
        found = set(ids)
        if word_rows is not None:
            word_rows[probe[0]] = found
        holders = found if holders is None else holders & found
    return holders


def _pick(ranked: list[Candidate], limit: int, with_keys: Callable[[list[Candidate]], None]) -> list[Candidate]:
    """The first `limit` candidates with distinct keys. One document read:
    its passages (key: source, ref, position). Else: one passage per
    bookmark (key: tweet id). with_keys() reads the keys of the candidates
    in blocks of PICK_BLOCK, as the choice comes to them (_key_reader())."""
    chosen: list[Candidate] = []
    seen: set = set()
    for start in range(0, len(ranked), PICK_BLOCK):
        block = ranked[start:start + PICK_BLOCK]
        with_keys(block)
        for cand in block:
            key = cand.key
            if key in seen:
                continue
            seen.add(key)
            chosen.append(cand)
            if len(chosen) == limit:
                return chosen
    return chosen


def _hits(index: ChunkIndex, rows: PassageRows, chosen: list[Candidate]) -> list[Hit]:
    if not chosen:
        return []
    found = rows.get(sorted({c.row_id for c in chosen}), RESULT_COLUMNS)
    cards = index.bookmarks(sorted({row["tweet_id"] for row in found.values()}))
    hits = []
    for cand in chosen:
        row = found[cand.row_id]
        card = cards.get(row["tweet_id"], {})
        created = row["created_at"]
        hits.append(Hit(
            tweet_id=row["tweet_id"],
            url=row["url"] or card.get("url", ""),
            author=row["author"] or card.get("author", ""),
            created_at=created.astimezone(timezone.utc).isoformat() if created else card.get("created_at"),
            score=round(float(cand.score), 6),
            best_source=row["source"],
            best_chunk=row["text"],
            best_ref=row["ref"],
            chunk_count=int(row["bookmark_chunks"] or 1),
            word_count=int(row["bookmark_words"] or row["word_count"] or 0),
            media=card.get("media") or [],
            lang=row["lang"] or card.get("lang", ""),
            best_source_text=row["source_text"] or "",
            best_position=int(row["position"] or 0),
            chunk_id=row["chunk_id"],
            exact_match=cand.exact or cand.rare,
            rerank_score=None if cand.rerank is None else round(cand.rerank, 6),
        ))
    return hits


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)


__all__ = ["search", "warm_up", "prewarm_indexes", "SearchResponse", "Hit", "FUSION_METHODS",
           "IndexModelMismatch", "embedder_for_index"]
