"""A dense search under a filter, on a table with a vector index (issue 29).

The prefilter leaves the rows of one author, one date window or one source
kind. The nearest partitions of the IVF index hold few of them, so a search
of a fixed number of partitions lost hits. The search must return every
bookmark that the filter leaves, in the order of an exact search."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

import kb.index.dense as dense_module
import kb.index.maintenance as maintenance_module
import kb.index.passage_rows as passage_rows_module
import kb.index.search as search_module
from kb.index.client import ChunkIndex
from kb.index.maintenance import vector_partitions, vector_probes
from kb.index.store import CHUNKS
from kb.index.search import search

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WORDS = [f"w{i}" for i in range(400)]
CROWD = 1800  # bookmarks of one author that fill the table
AUTHORS = {f"author{i}": 8 + 5 * i for i in range(6)}  # 8 to 33 bookmarks each
# The shipped value: the fixture few_probes() lowers it for the module.
MIN_COMPARED_VECTORS = maintenance_module.MIN_COMPARED_VECTORS
QUERIES = ("w1 w2 w3 w4", "w150 w7 w300", "w42 w43 w99 w201 w5")


def _text(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, 12, replace=False))


def _row(tweet_id: str, author: str, created_at: datetime, source: str, position: int, text: str) -> dict:
    return {"chunk_id": f"{tweet_id}-{position}", "tweet_id": tweet_id, "url": "", "author": author,
            "created_at": created_at, "source": source, "ref": f"ref-{tweet_id}", "position": position,
            "text": text}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("filtered")


@pytest.fixture(scope="module")
def hasher_module(folder):
    from kb.index.embedder import Embedder

    return Embedder.from_settings(backend="hash", cache_dir=str(folder / "cache"))


@pytest.fixture(scope="module")
def few_probes():
    """The store stands in for a table of more than MIN_COMPARED_VECTORS
    rows, whose usual search scans only some of the partitions (a smaller
    table is searched in every partition)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(maintenance_module, "MIN_COMPARED_VECTORS", 0)
        yield


@pytest.fixture(scope="module")
def store(folder, hasher_module, few_probes):
    """A table over the vector index size (1,800 crowd bookmarks and six small
    authors), with its IVF index. Each small author posts in a date window
    of its own; some of its bookmarks are videos."""
    rng = np.random.default_rng(29)
    rows = [_row(f"c{i}", "crowd", T0 + timedelta(hours=i), "post", 0, _text(rng)) for i in range(CROWD)]
    for number, (author, count) in enumerate(AUTHORS.items()):
        start = T0 + timedelta(days=400 + 30 * number)
        for i in range(count):
            source = "video" if i % 4 == 0 else "post"
            for position in range(1 + i % 2):  # one or two passages
                rows.append(_row(f"{author}-{i}", author, start + timedelta(hours=i), source, position, _text(rng)))
    index = ChunkIndex(path=str(folder / "lancedb"), vector_index_min_rows=1000)
    tweet_ids = sorted({r["tweet_id"] for r in rows})
    index.replace_chunks(tweet_ids, rows, hasher_module)
    # As the chunk_index asset calls it: the vector index, and no compaction
    # (a compaction merges the index into a few partitions: see
    # kb.index.maintenance.vector_index_config()).
    index.maintain(skip_if_current=True)
    table = index.dataset(CHUNKS)
    partitions = table.stats.index_stats("vector_idx")["indices"][0]["num_partitions"]
    # The usual search scans only some of the partitions.
    assert partitions >= vector_partitions(len(rows)) - 1 > vector_probes(len(rows))
    return index, rows


def _exact_order(index: ChunkIndex, rows: list[dict], keep, vector: np.ndarray) -> list[str]:
    """The bookmarks that `keep` leaves, by the distance of their nearest
    passage: the exact search, from every stored vector."""
    table = index.dataset(CHUNKS).to_table(columns=["tweet_id", "chunk_id", "vector"])
    kept = {r["chunk_id"] for r in rows if keep(r)}
    best: dict[str, float] = {}
    matrix = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    distances = 1.0 - matrix @ np.asarray(vector, dtype=np.float32)
    for tweet_id, chunk_id, distance in zip(table.column("tweet_id").to_pylist(),
                                            table.column("chunk_id").to_pylist(), distances.tolist()):
        if chunk_id in kept:
            best[tweet_id] = min(best.get(tweet_id, 2.0), distance)
    return sorted(best, key=lambda t: (best[t], t))


def _check(index, rows, hasher, keep, **filters) -> None:
    for query in QUERIES:
        vector = hasher.embed_query(query)
        hits = search(query, index=index, embedder=hasher, mode="dense", limit=100, **filters).hits
        exact = _exact_order(index, rows, keep, vector)
        assert len(exact) <= 100
        # Every bookmark that the filter leaves, in the exact order. Equal
        # distances may come in either order: compare the distances there.
        assert sorted(h.tweet_id for h in hits) == sorted(exact), (filters, query)
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        want = {t: i for i, t in enumerate(exact)}
        for a, b in zip(hits, hits[1:]):
            assert want[a.tweet_id] < want[b.tweet_id] or abs(a.score - b.score) < 1e-6, (filters, query)


@pytest.mark.parametrize("author", sorted(AUTHORS))
def test_an_author_filter_returns_every_bookmark_of_the_author(store, hasher_module, author):
    index, rows = store
    _check(index, rows, hasher_module, lambda r: r["author"] == author, author=author)


@pytest.mark.parametrize("number", range(len(AUTHORS)))
def test_a_date_window_returns_every_bookmark_in_it(store, hasher_module, number):
    index, rows = store
    after = T0 + timedelta(days=400 + 30 * number)
    before = after + timedelta(days=10)
    _check(index, rows, hasher_module, lambda r: after <= r["created_at"] < before, after=after, before=before)


def test_a_source_filter_returns_every_passage_of_the_source(store, hasher_module):
    index, rows = store
    assert sum(r["source"] == "video" for r in rows) <= 100
    _check(index, rows, hasher_module, lambda r: r["source"] == "video", source="video")
    _check(index, rows, hasher_module, lambda r: r["source"] == "video" and r["author"] == "author5",
           source="video", author="author5")


def test_a_wide_filter_fills_the_list(store, hasher_module, monkeypatch):
    """Above the exact threshold, the search scans the partitions that should
    hold enough rows of the filter, and every partition when they do not
    (here the threshold and the margin are lowered to reach these branches
    on a small table)."""
    index, rows = store
    monkeypatch.setattr(dense_module, "EXACT_FILTER_ROWS", 20)
    monkeypatch.setattr(dense_module, "FILTER_PROBE_SAFETY", 0.01)
    dense_module._FILTER_ROWS.clear()
    hits = search("w1 w2 w3 w4", index=index, embedder=hasher_module, mode="dense", limit=100,
                  after=T0, before=T0 + timedelta(days=40)).hits
    assert len(hits) == 100
    # 49 passages of one author: the first partitions hold too few of them.
    _check(index, rows, hasher_module, lambda r: r["author"] == "author5", author="author5")


class _RandomVectors:
    """Random unit vectors, one per text: their distances to a query lie
    close together, so a coarse (PQ) distance often swaps two neighbours."""

    model_name, dim, stats = "test:random-64", 64, {}

    def __init__(self, texts: list[str]):
        rng = np.random.default_rng(32)
        matrix = rng.standard_normal((len(texts), self.dim)).astype(np.float32)
        self.by_text = dict(zip(texts, matrix / np.linalg.norm(matrix, axis=1, keepdims=True)))

    def keeping_to(self, recorded_model):
        return self

    def embed_documents(self, texts):
        return np.stack([self.by_text[t] for t in texts])


@pytest.fixture(scope="module")
def random_store(tmp_path_factory):
    """1,500 passages with random vectors and their IVF index: 300 of
    author "near", the others of "crowd"."""
    rows = [_row(f"r{i}", "crowd" if i >= 300 else "near", T0 + timedelta(hours=i), "post", 0, f"text {i}")
            for i in range(1500)]
    index, embedder = _vector_indexed(tmp_path_factory, "random", rows)
    return index, rows, embedder


def _vector_indexed(tmp_path_factory, name: str, rows: list[dict]) -> tuple:
    """(index, embedder): `rows` with random vectors in a new index with its IVF index."""
    embedder = _RandomVectors([r["text"] for r in rows])
    index = ChunkIndex(path=str(tmp_path_factory.mktemp(name) / "lancedb"), vector_index_min_rows=1000)
    index.replace_chunks([r["tweet_id"] for r in rows], rows, embedder)
    index.maintain(skip_if_current=True)
    assert index.counts()["vector_index"]
    return index, embedder


def _check_exact(index, rows, embedder, keep, **filters) -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        query = rng.standard_normal(embedder.dim).astype(np.float32)
        query /= np.linalg.norm(query)
        hits = search("anything", index=index, mode="dense", limit=100, query_vector=query, **filters).hits
        distance = {r["tweet_id"]: 1.0 - float(embedder.by_text[r["text"]] @ query) for r in rows if keep(r)}
        assert [h.tweet_id for h in hits] == sorted(distance, key=distance.get)[:100]


def test_an_exact_filtered_search_orders_by_the_stored_vectors(random_store):
    """The vector index keeps PQ codes. A filter that leaves more rows
    than the search keeps (300 rows of one author, 200 kept) must still give
    the exact nearest rows in the exact order: the stored vectors re-rank
    them (dense.VECTOR_REFINE)."""
    index, rows, embedder = random_store
    _check_exact(index, rows, embedder, lambda r: r["author"] == "near", author="near")


def test_without_kept_vectors_lance_gives_the_same_exact_hits(random_store, monkeypatch):
    """A fragment of many rows read into memory (no rows files: `kb
    search`) keeps no stored vectors, so Lance compares the vectors of a
    narrow filter: the same hits in the same order as from the kept vectors."""
    index, rows, embedder = random_store
    monkeypatch.setattr(passage_rows_module, "VECTORS_IN_MEMORY_MAX_ROWS", 0)
    fresh = ChunkIndex(path=index.path, vector_index_min_rows=1000)
    assert not fresh.passage_rows(fresh.dataset(CHUNKS)).keeps_vectors
    _check_exact(fresh, rows, embedder, lambda r: r["author"] == "near", author="near")


def test_the_re_rank_of_kept_vectors_is_lances_refine(store, hasher_module, monkeypatch):
    """Through the index (some partitions), the coarse PQ distances choose
    VECTOR_REFINE x k rows and the stored vectors order them: from the kept
    vectors in numpy, or by Lance's refine when the rows keep none. Both
    give the same rows in the same order."""
    index, _ = store
    table = index.dataset(CHUNKS)
    kept = index.passage_rows(table)
    assert kept.keeps_vectors
    monkeypatch.setattr(passage_rows_module, "VECTORS_IN_MEMORY_MAX_ROWS", 0)
    fresh = ChunkIndex(path=index.path, vector_index_min_rows=1000)
    none_kept = fresh.passage_rows(fresh.dataset(CHUNKS))
    assert not none_kept.keeps_vectors
    probes = vector_probes(table.count_rows())
    assert dense_module._vector_partitions_of(table) > probes  # the index, not every vector
    for query in QUERIES:
        vector = hasher_module.embed_query(query)
        ours = dense_module._refined(table, kept, vector, None, 30, probes)
        lances = dense_module._refined(table, none_kept, vector, None, 30, probes)
        assert [r for r, _ in ours] == [r for r, _ in lances]
        assert np.allclose([d for _, d in ours], [d for _, d in lances], atol=1e-5)
        # The re-rank orders by the stored vectors: the distances rise.
        assert [d for _, d in ours] == sorted(d for _, d in ours)


def test_a_small_table_is_searched_exactly(random_store, monkeypatch):
    """A table of fewer than MIN_COMPARED_VECTORS rows is searched in every
    partition, and the stored vectors re-rank the hits: the exact order,
    as without the index."""
    index, rows, embedder = random_store
    monkeypatch.setattr(maintenance_module, "MIN_COMPARED_VECTORS", MIN_COMPARED_VECTORS)
    assert len(rows) < MIN_COMPARED_VECTORS
    _check_exact(index, rows, embedder, lambda r: True)


# --- the author filter through its index (issue 49) ---------------------------------
def _authors_table(path, hasher) -> ChunkIndex:
    index = ChunkIndex(path=str(path), vector_index_min_rows=5000)
    rows = [_row(f"{author}-{i}", author, T0 + timedelta(hours=i), "post", 0, f"borrow checker note {i}")
            for author in ("Alice", "alice_two", "BOB", "@Carol") for i in range(3)]
    index.replace_chunks(sorted({r["tweet_id"] for r in rows}), rows, hasher)
    index.maintain()
    return index


def _authors_found(index, hasher, author: str) -> list[str]:
    hits = search("borrow checker note", index=index, embedder=hasher, author=author, limit=100).hits
    return sorted({h.author for h in hits})


def test_the_author_filter_ignores_case_and_reads_the_author_index(tmp_path, hasher_module):
    """The filter compares handles without case and without "@", and Lance
    answers it from the scalar index of the lower-case author column, not
    from a read of every author (108 ms at 1,000,000 passages)."""
    from kb.index.chunk_schema import AUTHOR_KEY_COLUMN

    index = _authors_table(tmp_path / "lancedb", hasher_module)
    assert _authors_found(index, hasher_module, "@ALICE") == ["Alice"]
    assert _authors_found(index, hasher_module, "bob") == ["BOB"]
    assert _authors_found(index, hasher_module, "carol") == ["Carol"]  # a hit shows the handle without "@"
    # Not a prefix, not a pattern: "alice" leaves out alice_two, "%" finds nothing.
    assert _authors_found(index, hasher_module, "alice_two") == ["alice_two"]
    assert _authors_found(index, hasher_module, "%") == []
    assert _authors_found(index, hasher_module, "a' OR '1'='1") == []
    table = index.dataset(CHUNKS)
    assert (AUTHOR_KEY_COLUMN,) in {tuple(ix["fields"]) for ix in table.list_indices()}
    where = search_module._where(author="@ALICE", sources=[], after=None, before=None, tweet_id=None, ref=None)
    plan = table.scanner(filter=where, columns=[], with_row_id=True).explain_plan()
    assert "ScalarIndexQuery" in plan and "lower(" not in plan, plan


def test_a_table_from_before_gets_the_author_column_and_its_index(tmp_path, hasher_module):
    """A passages table without the author key column (written before issue
    49): the author filter still works, on the author column; the next write
    adds the column to every row, and maintain() builds its index."""
    import lance
    import pyarrow as pa

    from kb.index.chunk_schema import AUTHOR_KEY_COLUMN, chunks_schema

    index = _authors_table(tmp_path / "lancedb", hasher_module)
    table = lance.dataset(index.table_uri(CHUNKS)).to_table()
    schema = chunks_schema(256, "hash:bow-256")
    old_schema = pa.schema([f for f in schema if f.name != AUTHOR_KEY_COLUMN], metadata=schema.metadata)
    index._connect().create_table(CHUNKS, data=table.drop_columns([AUTHOR_KEY_COLUMN]).cast(old_schema),
                                  mode="overwrite")
    assert AUTHOR_KEY_COLUMN not in index.table(CHUNKS).schema.names
    assert _authors_found(index, hasher_module, "@ALICE") == ["Alice"]

    index.replace_chunks(["dave-0"], [_row("dave-0", "Dave", T0, "post", 0, "borrow checker note dave")],
                         hasher_module)
    index.maintain()
    table = index.dataset(CHUNKS)
    assert AUTHOR_KEY_COLUMN in table.schema.names
    keys = dict(zip(*table.to_table(columns=["author", AUTHOR_KEY_COLUMN]).to_pydict().values()))
    assert keys == {"Alice": "alice", "alice_two": "alice_two", "BOB": "bob", "Carol": "carol", "Dave": "dave"}
    assert _authors_found(index, hasher_module, "@ALICE") == ["Alice"]
    assert _authors_found(index, hasher_module, "DAVE") == ["Dave"]
    plan = table.scanner(filter=f"{AUTHOR_KEY_COLUMN} = 'alice'", columns=[], with_row_id=True).explain_plan()
    assert "ScalarIndexQuery" in plan, plan


# --- the full-text queries under a narrow filter (issue 58) --------------------
NARROW_FILTERS = ({"author": "author3"}, {"author": "crowd"}, {"folder": "mixed"}, {"source": "video"},
                  {"source": "post", "after": T0 + timedelta(days=430), "before": T0 + timedelta(days=520)},
                  {"tweet_id": "author5-3"})
TEXT_QUERIES = QUERIES + ("w17", '"w8 w9" w10', "w3 w30 w60 w90 w120 w240 w360", "w5 nothere")


def _full_text_calls(monkeypatch) -> list[tuple]:
    """(where, allow) of each full-text query that reaches Lance."""
    import kb.index.full_text as full_text_module

    calls, real = [], full_text_module._fts

    def spy(table, query, where, depth, column="text", allow=None):
        calls.append((where, allow))
        return real(table, query, where, depth, column=column, allow=allow)

    monkeypatch.setattr(full_text_module, "_fts", spy)
    monkeypatch.setattr(search_module, "_fts", spy)
    return calls


def _filtered_hits(path, hasher, mode: str, filters_to_try=None) -> list:
    """The hits of each filter (NARROW_FILTERS unless given) and query, from
    a new reader (no look-up kept from a search before)."""
    index = ChunkIndex(path=path, vector_index_min_rows=1000)
    return [[(h.tweet_id, h.chunk_id, h.score, h.exact_match)
             for h in search(query, index=index, embedder=hasher, mode=mode, limit=20, **filters).hits]
            for filters in filters_to_try or NARROW_FILTERS for query in TEXT_QUERIES]


@pytest.mark.parametrize("mode", ["hybrid", "bm25"])
def test_a_narrow_filter_gives_its_rows_to_lance_once_with_the_same_hits(store, hasher_module, monkeypatch, mode):
    """Under a narrow filter (an author, a folder, a source, a date window, one
    bookmark), the full-text queries (BM25 and the rare-word look-ups) get the
    filter's rows as Lance's row allowlist, and Lance evaluates the SQL
    filter no more. The hits are those of the SQL filter: the same bookmarks,
    passages, scores and order."""
    from kb.index.folders import folder_rows, replace_folders

    index, rows = store
    mixed = [f"c{i}" for i in range(0, CROWD, 6)] + [f"author{n}-{i}" for n in range(6) for i in range(0, 8, 2)]
    replace_folders(index, folder_rows([("fm", "mixed")], [("fm", t) for t in mixed]))
    path = str(index.path)
    calls = _full_text_calls(monkeypatch)
    new = _filtered_hits(path, hasher_module, mode)
    assert calls and all(allow is not None for _, allow in calls)
    calls.clear()
    monkeypatch.setattr(search_module, "ROW_ALLOWLIST_MAX_ROWS", -1)  # the SQL filter, as before
    monkeypatch.setattr(search_module, "WIDE_SOURCE_ALLOWLIST", False)
    old = _filtered_hits(path, hasher_module, mode)
    assert calls and all(allow is None and where for where, allow in calls)
    assert sum(map(len, new)) > 200  # the filters and queries find hits
    assert new == old


WIDE_TEXT_FILTERS = ({"source": "post"}, {"source": ["post", "video"]}, {"author": "crowd"},
                     {"source": "post", "after": T0, "before": T0 + timedelta(days=60)})


@pytest.mark.parametrize("mode", ["hybrid", "bm25"])
def test_a_wide_source_filter_gives_its_rows_to_lance_once_with_the_same_hits(store, hasher_module, monkeypatch,
                                                                              mode):
    """A filter of source kinds alone gets its rows as Lance's row allowlist
    also when it is wide (the MCP server gives each search the same kinds).
    Another wide filter (an author, a date window) changes from search to
    search: it keeps the SQL filter. The hits are those of the SQL filter."""
    index, _ = store
    monkeypatch.setattr(search_module, "ROW_ALLOWLIST_MAX_ROWS", 100)  # each filter here is wide
    path = str(index.path)
    calls = _full_text_calls(monkeypatch)
    new = _filtered_hits(path, hasher_module, mode, WIDE_TEXT_FILTERS)
    by_where = {}
    for where, allow in calls:
        by_where.setdefault(where, set()).add(allow is not None)
    assert by_where["source IN ('post')"] == by_where["source IN ('post', 'video')"] == {True}
    assert all(allowed == {False} for where, allowed in by_where.items() if "author" in where or "created_at" in where)
    calls.clear()
    monkeypatch.setattr(search_module, "WIDE_SOURCE_ALLOWLIST", False)  # the SQL filter, as before
    old = _filtered_hits(path, hasher_module, mode, WIDE_TEXT_FILTERS)
    assert calls and all(allow is None and where for where, allow in calls)
    assert sum(map(len, new)) > 200
    assert new == old


def test_unindexed_rows_keep_the_sql_filter(tmp_path, hasher_module):
    """Lance scores the rows that no full-text index segment covers by a flat
    search, and there its BM25 statistics differ between the allowlist and
    the SQL filter. So a table with such rows (a sync's new rows before
    maintain()) keeps the SQL filter, until maintain() folds the rows in."""
    index = _authors_table(tmp_path / "lancedb", hasher_module)
    where = search_module._where(author="bob", sources=[], after=None, before=None, tweet_id=None, ref=None)

    def allowlist():
        table = index.dataset(CHUNKS)
        return search_module._row_allowlist(table, index.passage_rows(table), where)

    assert allowlist() is not None
    extra = [_row("BOB-new", "BOB", T0, "post", 0, "borrow checker note new")]
    index.replace_chunks(["BOB-new"], extra, hasher_module)
    assert allowlist() is None
    assert "BOB-new" in {h.tweet_id for h in search("borrow", index=index, embedder=hasher_module, author="bob").hits}
    index.maintain()
    assert allowlist() is not None


@pytest.mark.parametrize("stable", [False, True])
def test_only_row_addresses_make_an_allowlist(tmp_path, stable):
    """The allowlist holds row addresses. A table with stable row ids (kb
    makes none) has row ids that are not addresses: it keeps the SQL filter."""
    import lance
    import pyarrow as pa

    table = lance.write_dataset(pa.table({"tweet_id": ["a", "b", "c"], "text": ["one x", "two y", "three z"]}),
                                str(tmp_path / "t.lance"), enable_stable_row_ids=stable)
    table.create_scalar_index("text", "INVERTED")

    class Rows:
        identity = (str(tmp_path), stable)

    allow = search_module._row_allowlist(table, Rows(), "tweet_id IN ('a', 'c')")
    assert (allow is None) == stable


def test_the_one_thread_product_gives_numpys_values_bit_for_bit():
    """The dense search compares the stored vectors of a filter's rows in
    one BLAS thread (_dot()): the same distances, bit for bit, as numpy's
    product in its usual threads, so the same order and ties. The limit
    ends with the product."""
    from threadpoolctl import threadpool_info

    rng = np.random.default_rng(58)
    matrix = rng.standard_normal((6000, 384)).astype(np.float32)  # OpenBLAS splits this product
    threads = [i["num_threads"] for i in threadpool_info()]
    for _ in range(5):
        vector = rng.standard_normal(384).astype(np.float32)
        assert np.array_equal(dense_module._dot(matrix, vector), matrix @ vector)
    assert [i["num_threads"] for i in threadpool_info()] == threads


def test_products_of_many_threads_run_in_one_blas_thread_and_give_back_its_threads():
    """The searches of a server run their products in their worker threads,
    at the same time. Each product runs in one BLAS thread, also in a
    thread other than the first; when the last one ends, numpy's BLAS has
    its threads of before, not one."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_info

    matrix = np.random.default_rng(5).standard_normal((3000, 384)).astype(np.float32)
    vector = matrix[0]
    threads = [i["num_threads"] for i in threadpool_info()]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(10):
            list(pool.map(lambda _: dense_module._dot(matrix, vector), range(32)))
            assert [i["num_threads"] for i in threadpool_info()] == threads

    class Probe(np.ndarray):
        """A matrix that notes the BLAS threads when it is multiplied."""

        def __matmul__(self, other):
            seen.append([i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"])
            return np.asarray(self) @ other

    seen: list = []
    probe = matrix.view(Probe)
    # Two threads that live on (as the workers of the search), one product
    # after the other: each runs in one BLAS thread.
    first_done, release = threading.Event(), threading.Event()

    def first() -> None:
        dense_module._dot(probe, vector)
        first_done.set()
        release.wait(10)

    worker = threading.Thread(target=first)
    worker.start()
    assert first_done.wait(10)
    second = threading.Thread(target=dense_module._dot, args=(probe, vector))
    second.start()
    second.join(10)
    release.set()
    worker.join(10)
    # Each BLAS library in the process (numpy's; scipy's and others when a
    # test before loaded them) ran the product in one thread.
    assert len(seen) == 2 and all(counts and set(counts) == {1} for counts in seen), seen
    assert [i["num_threads"] for i in threadpool_info()] == threads


# --- the dense search under a wide filter of source kinds (issue 58) ----------
KINDS = ("post", "link", "article", "video")
WIDE_FILTERS = ({"source": ["post", "link", "article"]}, {"source": ["post", "video"]}, {"source": "video"},
                {"source": "note"})


@pytest.fixture(scope="module")
def kinds_store(tmp_path_factory, few_probes):
    """1,600 passages with random vectors and their IVF index, of four
    source kinds in turn (as bench_index.py's corpus)."""
    rows = [_row(f"k{i}", "crowd", T0 + timedelta(hours=i), KINDS[i % 4], 0, f"text {i} w{i % 7}")
            for i in range(1600)]
    return _vector_indexed(tmp_path_factory, "kinds", rows)


@pytest.mark.parametrize("mode", ["hybrid", "dense"])
def test_a_wide_source_filter_takes_the_index_rows_without_the_filter_with_the_same_hits(
        kinds_store, monkeypatch, mode):
    """Under a filter of source kinds that leaves at least half the rows,
    the index query runs without the filter for more rows, and the rows of
    other kinds are left out (_coarse()). A filter that leaves fewer rows
    ("video"; "note": none) keeps the query with the filter, as the row
    allowlist of the search. The hits are those of the query with the SQL
    filter: the same bookmarks, passages, scores and order."""
    index, embedder = kinds_store
    monkeypatch.setattr(dense_module, "EXACT_FILTER_ROWS", 20)  # each filter here is wide (no exact search)
    dense_module._FILTER_ROWS.clear()
    calls, real = [], dense_module._nearest

    def spy(table, vector, where, depth, probes, refine=None, use_index=True, allow=None):
        calls.append(where if allow is None else "allowlist")
        return real(table, vector, where, depth, probes, refine=refine, use_index=use_index, allow=allow)

    monkeypatch.setattr(dense_module, "_nearest", spy)
    rng = np.random.default_rng(58)
    vectors = rng.standard_normal((6, embedder.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

    def hits() -> list:
        # A query word that no passage holds: no equal BM25 scores, whose
        # order Lance does not fix; the full-text queries still run.
        return [[(h.tweet_id, h.chunk_id, h.score, h.best_source)
                 for h in search(f"absent{n}", index=index, mode=mode, limit=20, query_vector=vector,
                                 **filters).hits]
                for filters in WIDE_FILTERS for n, vector in enumerate(vectors)]

    new = hits()
    assert None in calls  # the query without the filter ran
    assert ("allowlist" in calls) == (mode == "hybrid")  # a search with a full-text query has the allowlist
    monkeypatch.setattr(dense_module, "WIDE_OVERFETCH", 1.0)  # more often too few rows of the kinds
    assert hits() == new
    # The coarse rows themselves: those of the query with the filter, in its order.
    table = index.dataset(CHUNKS)
    rows, probes = index.passage_rows(table), vector_probes(table.count_rows())
    for filters in WIDE_FILTERS[:2]:
        where = search_module._where(author=None, sources=filters["source"], after=None, before=None,
                                     tweet_id=None, ref=None)
        for vector in vectors:
            coarse = dense_module._coarse(table, rows, vector, where, 400, probes, filters["source"])
            assert coarse == real(table, vector, where, 400, probes)
    calls.clear()
    monkeypatch.setattr(dense_module, "WIDE_MAX_OVERFETCH", 0)  # the query with the SQL filter, as before
    monkeypatch.setattr(search_module, "ROW_ALLOWLIST_MAX_ROWS", -1)
    monkeypatch.setattr(search_module, "WIDE_SOURCE_ALLOWLIST", False)
    old = hits()
    assert calls and None not in calls and "allowlist" not in calls
    assert sum(map(len, new)) >= 20 * 6 * 3
    assert new == old
