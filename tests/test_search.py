"""The LanceDB index and the one search function, on real LanceDB files.

Most tests use the deterministic hash embedder (shared words make near
vectors). The rare-keyword and model-change tests use the bundled local model,
which is loaded once per test process."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import lance
import numpy as np

from kb.index.exact_words import (EARLY_PROBES, MAX_PROBES, _holds_phrases, LowerTexts, query_phrases, rare_word_max,
                                  wait_for_word_counts)
from kb.index.fusion import Candidate
from kb.index.dense import _dense, _exact_dense
from kb.index.search import _bm25, _probe, _rare_word_passages, search, warm_up
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS, IndexModelMismatch
from kb.index.passage_rows import PassageRows

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


def chunk(tweet_id: str, position: int, text: str, *, source: str = "post", author: str = "alice",
          created_at: datetime = T0, ref: str | None = None, **extra) -> dict:
    return {"chunk_id": f"{tweet_id}-{source}-{position}", "tweet_id": tweet_id,
            "url": f"https://x.com/{author}/status/{tweet_id}", "author": author, "created_at": created_at,
            "source": source, "ref": ref or f"https://x.com/{author}/status/{tweet_id}", "position": position,
            "text": text, **extra}


def index_rows(index: ChunkIndex, rows: list[dict], embedder: Embedder) -> None:
    tweet_ids = sorted({r["tweet_id"] for r in rows})
    index.replace_chunks(tweet_ids, rows, embedder)


@pytest.fixture
def index() -> ChunkIndex:
    return ChunkIndex.from_settings()


CORPUS = [
    chunk("1", 0, "Rust ownership and the borrow checker explained with small examples", author="Alice"),
    chunk("2", 0, "Sourdough bread: feeding the starter and shaping the loaf", author="bob",
          created_at=T0 + timedelta(days=3)),
    chunk("3", 0, "Kubernetes operators reconcile the cluster state in a control loop", author="carol",
          created_at=T0 - timedelta(days=3)),
    chunk("4", 0, "A talk on the Rust borrow checker and lifetimes", source="video", author="dave",
          created_at=T0 + timedelta(days=10), ref="https://youtube.com/watch?v=abc"),
    chunk("5", 0, "Espresso extraction: grind size, dose and water temperature", author="bob",
          created_at=T0 + timedelta(days=20)),
]


@pytest.fixture
def small_index(index, hasher) -> ChunkIndex:
    index_rows(index, CORPUS, hasher)
    index.upsert_bookmark_cards([
        {"tweet_id": "4", "url": "https://x.com/dave/status/4", "author": "dave", "author_name": "Dave",
         "created_at": T0 + timedelta(days=10), "text": "watch this", "lang": "en",
         "media": [{"kind": "video", "url": "https://video.twimg.com/4.mp4"}],
         "last_sync": T0 + timedelta(days=30)},
    ])
    return index


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_ranking_on_a_small_corpus(small_index, hasher, mode):
    response = search("sourdough starter loaf", mode=mode, index=small_index, embedder=hasher)
    assert response.hits[0].tweet_id == "2"
    response = search("borrow checker", mode=mode, index=small_index, embedder=hasher, limit=2)
    assert {h.tweet_id for h in response.hits} == {"1", "4"}


def test_hit_fields_and_card_data(small_index, hasher):
    response = search("borrow checker talk lifetimes", index=small_index, embedder=hasher)
    hit = response.hits[0]
    assert hit.tweet_id == "4"
    assert hit.best_source == "video" and hit.best_ref == "https://youtube.com/watch?v=abc"
    assert hit.author == "dave" and hit.created_at == (T0 + timedelta(days=10)).isoformat()
    assert hit.media == [{"kind": "video", "url": "https://video.twimg.com/4.mp4"}]
    assert hit.chunk_count == 1 and hit.word_count == 9
    assert response.model == "hash:bow-256"
    assert response.last_sync == (T0 + timedelta(days=30)).isoformat()
    as_dict = response.to_dict()
    for name in ("tweet_id", "url", "author", "created_at", "score", "best_source", "best_chunk", "best_ref",
                 "chunk_count", "word_count", "media", "lang", "best_source_text"):
        assert name in as_dict["hits"][0]


def test_filters(small_index, hasher):
    def ids(**filters):
        return [h.tweet_id for h in search("rust borrow checker bread espresso kubernetes", index=small_index,
                                           embedder=hasher, **filters).hits]

    assert sorted(ids(author="ALICE")) == ["1"]  # case-insensitive, stored as "Alice"
    assert sorted(ids(author="@bob")) == ["2", "5"]
    assert ids(source="video") == ["4"]
    # after is inclusive, before exclusive, on the post date (UTC).
    assert sorted(ids(after="2024-03-01")) == ["1", "2", "4", "5"]
    assert sorted(ids(before="2024-03-01")) == ["3"]
    assert sorted(ids(after="2024-03-04", before="2024-03-11T00:00:00Z")) == ["2"]
    assert sorted(ids(after=T0 + timedelta(days=10), before=T0 + timedelta(days=10, seconds=1))) == ["4"]


def test_filters_apply_before_ranking(index, hasher):
    # 300 posts match the query well; 3 videos match it weakly. A filter
    # applied after ranking would find no video in the top passages.
    rows = [chunk(f"p{i}", 0, f"postgres index tuning guide part {i}") for i in range(300)]
    rows += [chunk(f"v{i}", 0, f"a video about gardening and postgres number {i}", source="video")
             for i in range(3)]
    rows += [chunk("v9", 0, "cooking show with no match at all", source="video")]
    index_rows(index, rows, hasher)
    for mode in ("bm25", "dense", "hybrid"):
        hits = search("postgres index tuning guide", source="video", limit=3, mode=mode,
                      index=index, embedder=hasher).hits
        assert len(hits) == 3, mode
        assert all(h.best_source == "video" for h in hits)


def test_one_passage_per_bookmark(index, hasher):
    long_page = [chunk("7", i, f"compiler optimization pass {i} inlining loop unrolling", source="article",
                       ref="https://blog.example/compilers") for i in range(5)]
    index_rows(index, long_page + [chunk("8", 0, "compiler optimization inlining basics")], hasher)
    response = search("compiler optimization inlining", index=index, embedder=hasher)
    assert [h.tweet_id for h in response.hits].count("7") == 1
    hit = next(h for h in response.hits if h.tweet_id == "7")
    assert hit.chunk_count == 5 and hit.word_count == 5 * 7

    # Reading one document gives its passages, best first.
    passages = search("loop unrolling pass 3", tweet_id="7", index=index, embedder=hasher).hits
    assert len(passages) == 5 and passages[0].best_position == 3


def test_a_page_shared_by_two_bookmarks_is_found_from_each(index, hasher):
    page = "https://blog.example/shared"
    rows = [chunk("a", 0, "vector clocks and causal ordering", source="link", ref=page, author="ann"),
            chunk("b", 0, "vector clocks and causal ordering", source="link", ref=page, author="ben")]
    index_rows(index, rows, hasher)
    hasher.embed_documents(["warm"])
    assert hasher.stats["embedded"] <= 2  # the second copy came from the cache
    assert [h.tweet_id for h in search("vector clocks", author="ben", index=index, embedder=hasher).hits] == ["b"]
    # Reading the page by URL gives it once, not once per bookmark.
    assert len(search("causal ordering", ref=page, index=index, embedder=hasher).hits) == 1
    assert len(index.passages(ref=page)) == 1


def test_replace_chunks_twice_makes_no_duplicates(index, hasher):
    rows = [chunk("1", i, f"passage {i} of the first bookmark") for i in range(3)]
    index_rows(index, rows, hasher)
    index_rows(index, rows, hasher)
    table = index.table(CHUNKS)
    assert table.count_rows() == 3
    # A shorter new version removes the stale passages of that bookmark only.
    index_rows(index, [chunk("2", 0, "another bookmark")], hasher)
    index.replace_chunks(["1"], rows[:1], hasher)
    ids = sorted(table.to_arrow().column("chunk_id").to_pylist())
    assert ids == ["1-post-0", "2-post-0"]
    # A bookmark with no passages left leaves the index.
    index.replace_chunks(["1"], [], hasher)
    assert table.to_arrow().column("chunk_id").to_pylist() == ["2-post-0"]


def test_replace_chunks_rejects_bad_rows(index, hasher):
    with pytest.raises(ValueError, match="occurs twice"):
        index.replace_chunks(["1"], [chunk("1", 0, "a"), chunk("1", 0, "b")], hasher)
    with pytest.raises(ValueError, match="not in tweet_ids"):
        index.replace_chunks(["1"], [chunk("2", 0, "a")], hasher)
    with pytest.raises(ValueError, match="created_at"):
        index.replace_chunks(["1"], [chunk("1", 0, "a", created_at="last tuesday")], hasher)


def test_remove_bookmarks_and_sources(small_index, hasher):
    small_index.remove_bookmarks(["2"])
    small_index.remove_sources(["video"])
    hits = search("sourdough borrow checker", mode="bm25", index=small_index, embedder=hasher).hits
    assert {h.tweet_id for h in hits} == {"1"}
    assert small_index.table(CHUNKS).count_rows("source = 'video'") == 0
    assert small_index.bookmark("4") is not None and small_index.bookmark("2") is None


def test_readers_see_new_data_without_a_restart(small_index, hasher):
    reader = ChunkIndex.from_settings()
    assert search("zeppelin", index=reader, embedder=hasher, mode="bm25").hits == []
    writer = ChunkIndex.from_settings()
    index_rows(writer, [chunk("9", 0, "zeppelin airship history")], hasher)
    assert [h.tweet_id for h in search("zeppelin", index=reader, embedder=hasher, mode="bm25").hits] == ["9"]
    assert search("zeppelin", index=reader, embedder=hasher).hits[0].tweet_id == "9"


def test_a_reader_sees_changed_columns_of_rows_that_it_read_before(small_index, hasher):
    # A search keeps the rows of a table version in memory. Removing the
    # video passage of bookmark 4 changes the chunk count of its row that
    # stays, so the reader must not keep the rows that it read before.
    rows = [chunk("4", 1, "Lifetimes and the borrow checker, part two", author="dave")]
    index_rows(small_index, [*[r for r in CORPUS if r["tweet_id"] == "4"], *rows], hasher)
    reader = ChunkIndex.from_settings()
    before = search("lifetimes part two", index=reader, embedder=hasher, mode="bm25").hits
    assert before[0].tweet_id == "4" and before[0].chunk_count == 2
    small_index.remove_sources(["video"])
    after = search("lifetimes part two", index=reader, embedder=hasher, mode="bm25").hits
    assert after[0].tweet_id == "4" and after[0].chunk_count == 1 and after[0].best_source == "post"


def test_a_reader_sees_a_rebuilt_index_with_the_same_version_number(index, hasher):
    index_rows(index, [chunk("1", 0, "first index about zeppelins")], hasher)
    reader = ChunkIndex.from_settings()
    assert search("zeppelins", index=reader, embedder=hasher).hits[0].best_chunk == "first index about zeppelins"
    version = reader.dataset(CHUNKS).version
    # The same writes on a new table give it the same version number again.
    index.rebuild()
    index_rows(index, [chunk("1", 0, "second index about zeppelins")], hasher)
    assert reader.dataset(CHUNKS).version == version
    assert search("zeppelins", index=reader, embedder=hasher).hits[0].best_chunk == "second index about zeppelins"


def test_a_reader_uses_its_open_table_again_until_a_commit(index, hasher):
    """A local reader opens a table again only when its commit folder
    changed. The folder's time is set back 10 s: a commit of long ago."""
    index_rows(index, [chunk("1", 0, "first note about zeppelins")], hasher)
    reader = ChunkIndex.from_settings()
    versions = Path(reader.table_uri(CHUNKS)) / "_versions"
    # Just after a commit the folder time can still change in the same clock
    # tick, so the reader opens the latest version each time.
    assert reader.dataset(CHUNKS) is not reader.dataset(CHUNKS)
    old = time.time_ns() - 10 * 10**9
    os.utime(versions, ns=(old, old))
    opened = reader.dataset(CHUNKS)
    assert reader.dataset(CHUNKS) is opened
    index_rows(index, [chunk("2", 0, "second note about airships")], hasher)
    # The next search comes 5 s after this commit: its stamp has settled too.
    later = time.time_ns() - 5 * 10**9
    os.utime(versions, ns=(later, later))
    assert reader.dataset(CHUNKS).version == opened.version + 1
    assert search("airships", index=reader, embedder=hasher, mode="bm25").hits[0].tweet_id == "2"


@pytest.mark.slow
def test_search_while_another_thread_writes(index, hasher):
    base = [chunk(f"b{i}", 0, f"distributed systems consensus raft paxos note {i}") for i in range(50)]
    index_rows(index, base, hasher)
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        writer = ChunkIndex.from_settings()
        round_ = 0
        try:
            while not stop.is_set():
                round_ += 1
                rows = [chunk(f"b{i}", p, f"raft consensus leader election round {round_} part {p}")
                        for i in range(0, 50, 5) for p in range(round_ % 3 + 1)]
                writer.replace_chunks([f"b{i}" for i in range(0, 50, 5)], rows, hasher)
                if round_ % 4 == 0:
                    writer.maintain()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        searches = 0
        while searches < 40 or thread.is_alive() and searches < 40:
            response = search("raft consensus", limit=20, index=ChunkIndex.from_settings(), embedder=hasher)
            assert len(response.hits) == 20
            assert len({h.tweet_id for h in response.hits}) == 20
            searches += 1
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors


def test_maintain_folds_rows_into_the_indexes(index, hasher):
    small = ChunkIndex.from_settings(vector_index_min_rows=200)
    rows = [chunk(f"m{i}", 0, f"note {i} about graph databases and query planners") for i in range(260)]
    index_rows(small, rows, hasher)
    index_rows(small, [chunk("late", 0, "a late note about query planners")], hasher)
    assert small.counts()["fts_unindexed_rows"] == 1
    small.maintain()
    counts = small.counts()
    assert counts["fts_unindexed_rows"] == 0 and counts["vector_index"] is True
    assert counts["chunks"] == 261 and counts["indexed_bookmarks"] == 261
    assert counts["model"] == "hash:bow-256" and counts["dim"] == 256
    hits = search("late note query planners", index=small, embedder=hasher).hits
    assert hits[0].tweet_id == "late"


def test_a_small_table_searches_its_vectors_in_memory_as_lance_does(index, hasher):
    # Without a vector index, Lance compares every vector; the search does
    # the same in numpy from the vectors in memory. Same rows, same order.
    rows = [chunk(f"v{i}", 0, f"note {i} on {'graphs' if i % 3 else 'sourdough'} and {'rust' if i % 2 else 'go'}")
            for i in range(60)]
    index_rows(index, rows, hasher)
    index.remove_bookmarks(["v7"])  # a deleted row must not come back
    table = index.dataset(CHUNKS)
    passages = index.passage_rows(table)
    assert passages.vectors is not None and len(passages.vectors[0]) == 59
    for query in ("graphs and rust", "sourdough", "note 12"):
        vector = hasher.embed_query(query)
        exact = _exact_dense(passages.vectors, vector, 20)
        lance = _dense(table, passages, vector, None, 20, table.count_rows())
        assert [r for r, _ in exact] == [r for r, _ in lance]
        assert np.allclose([d for _, d in exact], [d for _, d in lance], atol=1e-6)
    hits = search("note 7 on graphs", index=index, embedder=hasher, mode="dense", limit=100).hits
    assert "v7" not in {h.tweet_id for h in hits} and len(hits) == 59
    # A source filter, as the MCP server sets when the index holds wiki pages.
    index_rows(index, [chunk(f"w{i}", 0, f"wiki page {i} on graphs", source="wiki") for i in range(5)], hasher)
    table = index.dataset(CHUNKS)
    passages = index.passage_rows(table)
    vector = hasher.embed_query("graphs and rust")
    exact = _exact_dense(passages.vectors, vector, 30, ["wiki", "video"])
    lance = _dense(table, passages, vector, "source IN ('wiki', 'video')", 30, table.count_rows())
    assert [r for r, _ in exact] == [r for r, _ in lance]
    assert len(exact) == 5
    hits = search("graphs", index=index, embedder=hasher, mode="dense", source="post", limit=100).hits
    assert len(hits) == 59 and all(h.best_source == "post" for h in hits)


def test_a_table_with_a_vector_index_is_searched_by_lance(index, hasher):
    small = ChunkIndex.from_settings(vector_index_min_rows=200)
    index_rows(small, [chunk(f"m{i}", 0, f"note {i} about graph databases") for i in range(260)], hasher)
    assert small.passage_rows(small.dataset(CHUNKS)).vectors is None  # too many rows for an exact search
    small.maintain()
    assert small.counts()["vector_index"] is True
    assert small.passage_rows(small.dataset(CHUNKS)).vectors is None


def test_a_word_looked_up_before_is_looked_up_again_on_a_new_table_version(small_index, hasher):
    # The look-up of a query word is kept per table version. "zygote" is
    # absent at first; a new passage holds it. The passage must count as
    # holding the rare word ("mango" is absent), which only the look-up on
    # the new version can show: the query is no exact phrase of the text.
    reader = ChunkIndex.from_settings()
    assert search("zygote mango", index=reader, embedder=hasher).hits[0].exact_match is False
    assert reader.passage_rows(reader.dataset(CHUNKS)).word_holders[(None, "zygote")] is None
    index_rows(small_index, [chunk("z", 0, "the zygote divides")], hasher)
    hit = search("zygote mango", index=reader, embedder=hasher).hits[0]
    assert hit.tweet_id == "z" and hit.exact_match is True
    holders = reader.passage_rows(reader.dataset(CHUNKS)).word_holders
    assert len(holders[(None, "zygote")]) == 1 and holders[(None, "mango")] is None
    # The same search again takes the stored look-ups: the same answer.
    again = search("zygote mango", index=reader, embedder=hasher).hits[0]
    assert again.tweet_id == "z" and again.exact_match is True


def test_a_look_up_is_kept_per_filter(index, hasher):
    # A filter changes what a look-up finds: the look-up with a filter must
    # not answer a search without it. "zygote" is rare; "mango" is absent, so
    # the query is no exact phrase and only the rare-word rule marks a hit.
    index_rows(index, [chunk("z1", 0, "the zygote divides"), chunk("z2", 0, "zygote cells", source="video"),
                       *CORPUS], hasher)
    video = search("zygote mango", index=index, embedder=hasher, source="video").hits
    assert [(h.tweet_id, h.exact_match) for h in video] == [("z2", True), ("4", False)]
    everything = {h.tweet_id: h.exact_match for h in search("zygote mango", index=index, embedder=hasher).hits}
    assert everything["z1"] is True and everything["z2"] is True
    kept = index.passage_rows(index.dataset(CHUNKS)).word_holders
    assert len(kept[(None, "zygote")]) == 2 and [len(v) for (w, word), v in kept.items() if w and word == "zygote"] == [1]


def test_look_ups_started_early_give_the_answer_of_the_count(index, hasher):
    # On a large table (rare_max >= depth) the look-ups of up to EARLY_PROBES
    # words start before the lexical list. With more than MAX_PROBES words,
    # the count in the lexical list then chooses which look-ups to use: the
    # answer and the order of the new candidates must be those of the
    # look-ups started after the count. table_rows=100,000 gives the rare_max
    # of such a table (100) on a small one.
    words = {"alpha": 1, "beta": 2, "gamma": 4, "delta": 7, "omega": 11}
    rows = [chunk(f"w{i}", 0, " ".join(["note", str(i), *(w for w, n in words.items() if i < n)]))
            for i in range(14)]
    index_rows(index, rows, hasher)
    query = " ".join(words)
    assert len(words) == EARLY_PROBES > MAX_PROBES and rare_word_max(100_000) >= 100

    def rare_passages(early: bool):
        table = index.dataset(CHUNKS)
        passages = PassageRows.read(table, ("test",), None)  # nothing looked up before
        lexical = _bm25(table, query, None, 100)
        probes = _probe(table, passages, 100_000, list(words), None) if early else None
        candidates = {row_id: Candidate(row_id) for row_id, _ in lexical[:3]}
        found = _rare_word_passages(table, passages, 100_000, query, None, lexical, candidates, probes,
                                    LowerTexts(passages))
        return found, list(candidates), passages.word_holders

    late_found, late_order, late_kept = rare_passages(early=False)
    early_found, early_order, _ = rare_passages(early=True)
    assert early_found == late_found and len(late_found) == 1  # "w0" holds alpha, beta and gamma
    assert early_order == late_order
    assert sorted(word for _, word in late_kept) == ["alpha", "beta", "gamma"]  # the 3 fewest


def full_text_words(monkeypatch) -> list[str]:
    """The words of each full-text query that a search sends to Lance (a spy
    on the Lance dataset's scanner, which its to_table() calls too: it
    records the query and runs it)."""
    words: list[str] = []
    scanner = lance.LanceDataset.scanner

    def spy(self, *args, **kwargs):
        text_query = kwargs.get("full_text_query")
        if isinstance(text_query, dict):
            words.append(text_query["query"])
        return scanner(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "scanner", spy)
    return words


@pytest.mark.parametrize("source", [None, "post,link"])
def test_after_warm_up_a_common_word_is_not_looked_up(index, hasher, monkeypatch, source):
    # warm_up() counts the words of each passage. "kettle" is in 150 posts
    # and "teapot" in 100 others: the lexical list holds only "teapot"
    # passages (the rarer word scores more), so it cannot show that "kettle"
    # is common, and a reader without counts looks it up. The counts show
    # it: no look-up, and the same answer. Also with a filter of sources
    # alone (the wiki pages, left out so, hold "kettle" too).
    rows = [chunk(f"k{i}", 0, f"kettle note {i}") for i in range(150)]
    rows += [chunk(f"t{i}", 0, f"teapot note {i}") for i in range(100)]
    rows += [chunk(f"w{i}", 0, f"kettle page {i}", source="wiki") for i in range(3)]
    index_rows(index, rows, hasher)
    assert warm_up(index, mode="bm25") is not None
    assert wait_for_word_counts(index, timeout=30)  # they run on a thread of their own
    sent = full_text_words(monkeypatch)
    counted = search("kettle teapot", index=index, embedder=hasher, source=source).hits
    assert sent == ["kettle teapot"]  # the lexical query alone
    reader = ChunkIndex.from_settings()  # no warm-up: no word counts
    sent.clear()
    looked_up = search("kettle teapot", index=reader, embedder=hasher, source=source).hits
    assert sent == ["kettle teapot", "kettle"]
    assert [(h.tweet_id, h.score, h.exact_match) for h in counted] == \
        [(h.tweet_id, h.score, h.exact_match) for h in looked_up]


def test_a_word_that_deletions_made_rare_is_looked_up(index, hasher):
    # The counts of a data fragment stay from version to version; rows that
    # a new version deletes in it lower what the counts can show. "kettle"
    # was in 5 passages; after 3 of them change, 2 hold it: it is rare, and
    # the passages that hold it rank first ("mango" is absent).
    index_rows(index, [chunk(f"k{i}", 0, f"the kettle boils, note {i}") for i in range(5)], hasher)
    warm_up(index, mode="bm25")
    assert wait_for_word_counts(index, timeout=30)
    before = search("kettle mango", index=index, embedder=hasher).hits
    assert not any(h.exact_match for h in before)
    index_rows(index, [chunk(f"k{i}", 0, f"the pot boils, note {i}") for i in range(3)], hasher)
    rows = index.passage_rows(index.dataset(CHUNKS))
    assert rows.words_of is not None and rows.least_holders("kettle") <= 2
    hits = search("kettle mango", index=index, embedder=hasher).hits
    assert sorted((h.tweet_id, h.exact_match) for h in hits[:2]) == [("k3", True), ("k4", True)]
    # The search started the count of the new fragment (the changed passages)
    # on a thread of its own.
    deadline = time.monotonic() + 10
    while rows.uncounted() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows.least_holders("pot") == 3


def test_the_word_counts_keep_to_a_source_filter(index, hasher):
    # "kettle" is in 150 videos and 2 posts. For a search of posts it is
    # rare: the 2 posts that hold it rank first ("mango" is absent).
    rows = [chunk(f"v{i}", 0, f"kettle note {i}", source="video") for i in range(150)]
    index_rows(index, [*rows, chunk("p1", 0, "kettle memo"), chunk("p2", 0, "kettle list"), *CORPUS], hasher)
    warm_up(index, mode="bm25")
    assert wait_for_word_counts(index, timeout=30)
    rows = index.passage_rows(index.dataset(CHUNKS))
    assert rows.least_holders("kettle") == 152 and rows.least_holders("kettle", ["post"]) == 2
    hits = search("kettle mango", index=index, embedder=hasher, source="post").hits
    assert sorted((h.tweet_id, h.exact_match) for h in hits[:2]) == [("p1", True), ("p2", True)]


def test_bad_input(small_index, hasher):
    with pytest.raises(ValueError, match="query is empty"):
        search("   ", index=small_index, embedder=hasher)
    with pytest.raises(ValueError, match="after="):
        search("rust", after="next week", index=small_index, embedder=hasher)
    with pytest.raises(ValueError, match="before="):
        search("rust", before="2024-13-45", index=small_index, embedder=hasher)
    with pytest.raises(ValueError, match="mode="):
        search("rust", mode="fuzzy", index=small_index, embedder=hasher)
    assert search("rust", limit=500, index=small_index, embedder=hasher).limit == 100
    # An MCP client sends lines of JSON up to 64 MB: a filter of 10 MB took
    # 0.6 s and 200 MB in each search. Each filter has at most 1,000 characters.
    for name in ("author", "folder", "tweet_id", "ref"):
        with pytest.raises(ValueError, match=f"{name} has 1,001 characters: a filter has at most 1,000"):
            search("rust", index=small_index, embedder=hasher, **{name: "a" * 1001})
    assert search("rust", author="a" * 1000, index=small_index, embedder=hasher).hits == []


def test_empty_index_gives_no_hits(index, hasher):
    assert search("anything", index=index, embedder=hasher).hits == []


def test_bm25_needs_no_embedder(small_index, monkeypatch):
    monkeypatch.setenv("KB_EMBED_BACKEND", "ollama")
    monkeypatch.setenv("OLLAMA_URL", "http://127.0.0.1:9")
    hits = search("espresso grind", mode="bm25", index=small_index).hits
    assert hits[0].tweet_id == "5"


# --- with the bundled local model ------------------------------------------------
SEMANTIC_NEIGHBOURS = [
    "Supply chain attacks on open source compression libraries are a growing threat.",
    "How a malicious maintainer slipped a backdoor into a widely used Linux package.",
    "Lessons from the SolarWinds supply chain compromise for software vendors.",
    "Why signed releases and reproducible builds stop tampered open source packages.",
    "A timeline of the most damaging open source supply chain attacks.",
    "Detecting backdoors in compression code with binary analysis.",
    "OpenSSH hardening: what to check after a suspected supply chain attack.",
    "Open source maintainers burn out, and attackers exploit that to gain trust.",
    "The anatomy of a backdoor hidden in build scripts of a Linux library.",
    "Security teams should audit transitive dependencies for supply chain risk.",
    "Social engineering of open source maintainers: a new attack pattern.",
    "Why compression libraries make attractive targets for backdoors.",
]
RARE = "Homelab log: patched CVE-2024-3094 on all my Debian boxes today; it took ten minutes."


@pytest.fixture(scope="module")
def local_index(tmp_path_factory) -> tuple[ChunkIndex, Embedder]:
    # Module scope: the passages are embedded once for the tests that only read.
    folder = tmp_path_factory.mktemp("local_index")
    embedder = Embedder.from_settings(backend="local", cache_dir=str(folder / "cache"))
    rows = [chunk(f"n{i}", 0, text) for i, text in enumerate(SEMANTIC_NEIGHBOURS)]
    rows.append(chunk("rare", 0, RARE))
    index = ChunkIndex.from_settings(path=str(folder / "index"))
    index_rows(index, rows, embedder)
    return index, embedder


@pytest.mark.parametrize("query", [
    "CVE-2024-3094 open source backdoor supply chain attack",
    "CVE-2024-3094",
    '"CVE-2024-3094" backdoor',
])
def test_a_rare_exact_keyword_keeps_its_hit(local_index, query):
    index, embedder = local_index
    hits = search(query, limit=3, index=index, embedder=embedder).hits
    assert "rare" in [h.tweet_id for h in hits]


def test_exact_phrase_ranks_first(local_index):
    index, embedder = local_index
    hits = search("patched CVE-2024-3094", index=index, embedder=embedder).hits
    assert hits[0].tweet_id == "rare" and hits[0].exact_match


@pytest.mark.parametrize(("text", "holds"), [
    ("Patched: CVE-2024-3094, at last", True),  # only punctuation between the words
    ("patched\ncve 2024\t3094", True),
    ("unpatched cve-2024-3094", False),  # "patched" is part of a longer word
    ("patched cve-2024-30945", False),
    ("patched_cve-2024-3094", False),  # "_" is a word character
    ("cve-2024-3094 patched", False),  # the words in another order
])
def test_a_phrase_is_whole_words_in_order(text, holds):
    # The exact-phrase rule, alone: exact_match of a hit also holds for a
    # passage with every rare query word.
    assert _holds_phrases(text, query_phrases('"patched CVE-2024-3094"')) is holds


def test_another_model_gives_a_clear_error(index, hasher):
    local = Embedder.from_settings(backend="local")
    index_rows(index, [chunk("n1", 0, SEMANTIC_NEIGHBOURS[1])], local)
    with pytest.raises(IndexModelMismatch, match=r"local:bge-small-en-v1.5.*hash:bow-256.*kb index --rebuild"):
        search("backdoor", index=index, embedder=hasher)
    with pytest.raises(IndexModelMismatch, match="kb index --rebuild"):
        index.replace_chunks(["x"], [chunk("x", 0, "text")], hasher)
    # bm25 needs no vectors, so it still answers.
    assert search("backdoor", mode="bm25", index=index).hits[0].tweet_id == "n1"
    # After a rebuild the index takes the new model.
    index.rebuild()
    index_rows(index, [chunk("x", 0, "backdoor text")], hasher)
    assert search("backdoor", index=index, embedder=hasher).hits[0].tweet_id == "x"


@pytest.mark.parametrize("text", ["kalo", "x kalo.", "kalomi kalo", "mikalo", "kalo_x", "_kalo", "kalo9", "ékalo",
                                  "kalo é", "ka lo", "", "kal", "(kalo)", "kalokalo kalo", "mi-kalo-ne", "kaloé"])
def test_the_whole_word_test_is_that_of_a_regular_expression(text):
    # The rare-word count tests whole words with str.find; the rule is re's \b.
    import re

    from kb.index.exact_words import _holds_word

    assert _holds_word(text, "kalo") is bool(re.search(r"\bkalo\b", text))


def test_an_index_of_the_old_local_model_keeps_working_until_the_rebuild_beside_it(index, monkeypatch):
    """Issue 58: bge-small-en-v1.5 is the local model now. An index made
    with all-MiniLM-L6-v2 (real models, real LanceDB files) keeps its model
    for searches and writes, `kb status` names the rebuild, and the rebuild
    beside the old table changes the model while searches go on."""
    from kb.index import model_choice
    from kb.index.model_choice import model_note, rebuild_beside

    monkeypatch.setenv("KB_EMBED_BACKEND", "local")  # KB_LOCAL_MODEL unset: the default, bge-small-en-v1.5
    old = Embedder.from_settings(local_model="all-MiniLM-L6-v2")
    index_rows(index, [chunk(f"n{i}", 0, text) for i, text in enumerate(SEMANTIC_NEIGHBOURS[:6])], old)
    index_rows(index, [chunk("bread", 0, "A beginner's guide to baking your own loaf in a home oven.")], old)
    assert index.model_info() == ("local:all-MiniLM-L6-v2", 384)

    # Searches and writes keep the model of the index (both models have 384 dimensions:
    # a query of the new model would find nonsense, not an error).
    default = Embedder.from_settings()
    assert default.model_name == "local:bge-small-en-v1.5"
    assert index.embedder_for(default).model_name == "local:all-MiniLM-L6-v2"
    assert search("how do I make bread at home", limit=1, index=index).hits[0].tweet_id == "bread"
    index_rows(index, [chunk("kiln", 0, "A kiln fires the glaze of a clay pot overnight.")], default)
    assert index.model_info()[0] == "local:all-MiniLM-L6-v2"
    assert "local:bge-small-en-v1.5 is ready" in model_note(index.model_info()[0]) and \
        "kb index --rebuild" in model_note(index.model_info()[0])

    # The rebuild embeds in parts beside the old table; a search between two parts reads the old one.
    monkeypatch.setattr(model_choice, "REBUILD_PART", 3)
    during = []

    def between(done, total):
        during.append((index.model_info()[0], search("pottery kiln glaze", limit=1, index=index).hits[0].tweet_id))

    result = rebuild_beside(index, Embedder.from_settings(), on_progress=between)
    assert result == {"passages": 8, "swapped": True, "model": "local:bge-small-en-v1.5"}
    assert during and set(during) == {("local:all-MiniLM-L6-v2", "kiln")}
    assert index.model_info() == ("local:bge-small-en-v1.5", 384)
    assert search("how do I make bread at home", limit=1, index=index).hits[0].tweet_id == "bread"
    assert search("pottery kiln glaze", limit=1, index=index).hits[0].tweet_id == "kiln"
    assert model_note(index.model_info()[0]) == ""


def test_a_local_model_that_the_owner_names_is_not_replaced_by_the_index_model(monkeypatch):
    """keeping_to changes the local model only while the setting is the
    default: a model that the owner names stays, and the index refuses it
    with the rebuild hint (test_another_model_gives_a_clear_error)."""
    owner = Embedder(backend="local", ollama_url="", ollama_model="", local_model="all-MiniLM-L6-v2",
                     batch_size=8, cache_dir="")
    assert owner.keeping_to("local:bge-small-en-v1.5") is owner
    default = Embedder(backend="auto", ollama_url="", ollama_model="", local_model="bge-small-en-v1.5",
                       batch_size=8, cache_dir="")
    assert default.keeping_to("local:all-MiniLM-L6-v2").local_model == "all-MiniLM-L6-v2"
    assert default.keeping_to("local:some-folder-model").local_model == "bge-small-en-v1.5"
    assert Embedder(backend="ollama", ollama_url="", ollama_model="", local_model="bge-small-en-v1.5",
                    batch_size=8, cache_dir="").keeping_to("local:all-MiniLM-L6-v2").backend == "ollama"


@pytest.mark.parametrize("read", [{}, {"tweet_id": "doc"}])
def test_the_choice_reads_the_keys_of_the_candidates_that_it_looks_at(index, hasher, monkeypatch, read):
    # A search of many candidates (here about 150: the dense and the lexical
    # list) reads the key of a candidate (its tweet id; when one document is
    # read, source, ref and position) only when the choice of the hits comes
    # to it: one block of PICK_BLOCK for 5 hits. The hits must be those of a
    # choice that reads every key first (a block larger than the list).
    from kb.index import passage_rows, search as search_module

    rows = [chunk(f"b{i // 3}", i % 3, f"kettle and pot number {i} of the kitchen") for i in range(150)]
    rows += [chunk("doc", i, f"a kitchen kettle, part {i} of a long page") for i in range(120)]
    index_rows(index, rows, hasher)
    asked: list[tuple[str, int]] = []
    column = passage_rows.PassageRows.column

    def spy(self, name, row_ids):
        asked.append((name, len(row_ids)))
        return column(self, name, row_ids)

    monkeypatch.setattr(passage_rows.PassageRows, "column", spy)
    found = [(h.tweet_id, h.best_position, h.score) for h in
             search("kettle kitchen", index=index, embedder=hasher, limit=5, **read).hits]
    keys = [n for name, n in asked if name in ("tweet_id", "source", "ref", "position")]
    assert len(found) == 5 and keys and max(keys) <= search_module.PICK_BLOCK
    block = search_module.PICK_BLOCK
    monkeypatch.setattr(search_module, "PICK_BLOCK", 10_000)
    asked.clear()
    assert [(h.tweet_id, h.best_position, h.score) for h in
            search("kettle kitchen", index=index, embedder=hasher, limit=5, **read).hits] == found
    assert max(n for name, n in asked if name in ("tweet_id", "position")) > block  # every key at once


def test_the_rare_passage_moved_into_the_top_gets_its_key():
    # keep_rare_in_top() moves the best passage with every rare word into
    # the first RARE_SLOT hits, and leaves out the other passage of its
    # bookmark. The choice did not read that passage's key: the rule must
    # read it, else the bookmark shows twice.
    from kb.index.exact_words import RARE_SLOT, keep_rare_in_top

    ranked = [Candidate(i, key=f"t{i}") for i in range(10)] + [Candidate(i) for i in range(10, 80)]
    best = ranked[70]
    best.rare = True
    chosen = ranked[:10]
    keys = {70: "t6"}  # the bookmark of the 7th hit

    def with_keys(cands):
        for cand in cands:
            if cand.key is None:
                cand.key = keys.get(cand.row_id, f"t{cand.row_id}")

    top = keep_rare_in_top(ranked, chosen, 10, with_keys)
    assert top[RARE_SLOT - 1] is best
    assert [c.key for c in top] == ["t0", "t1", "t6", "t2", "t3", "t4", "t5", "t7", "t8", "t9"]


def test_the_phrase_test_leaves_out_the_ascii_passages_that_a_look_up_of_a_phrase_word_did_not_find(
        index, hasher, monkeypatch):
    # A passage with an ASCII text that holds the phrase "kiwi mango" holds
    # the words "kiwi" and "mango", and Lance's look-up of each rare word
    # finds it. So the phrase test leaves out the candidates with an ASCII
    # text that a look-up of a phrase word did not find. A text with other
    # characters keeps the test: "İkiwi" is "i̇kiwi" in Python (the dot is
    # no word character, so "kiwi" is a word there), and one word to
    # Lance's tokenizer (its look-up of "kiwi" does not find it). The marks
    # must be those of the test of each candidate. A depth of 3 cuts the
    # lists (each candidate is looked at); RARE_MIN 20 makes both words rare.
    from kb.index import exact_words, search as search_module, search_request

    monkeypatch.setattr(search_request, "MIN_DEPTH", 3)
    monkeypatch.setattr(search_request, "DEPTH_PER_HIT", 1)
    monkeypatch.setattr(exact_words, "RARE_MIN", 20)
    rows = [chunk(f"k{i}", 0, f"a kiwi tart, number {i}") for i in range(8)]
    rows += [chunk(f"m{i}", 0, f"a mango pie, number {i}") for i in range(8)]
    rows += [chunk("both", 0, "we ate kiwi, mango and more"), chunk("dot", 0, "İkiwi mango tart"),
             chunk("other", 0, "a plain text without the words")]
    index_rows(index, rows, hasher)
    tested: list[int] = []
    lowered = exact_words.LowerTexts.lowered
    seen: dict = {}
    ranked = search_module._ranked

    def spy_lowered(self, row_ids):
        tested.extend(row_ids)
        return lowered(self, row_ids)

    def spy_ranked(request, scope, retrieved):
        chosen = ranked(request, scope, retrieved)
        seen["exact"] = {c.row_id: c.exact for c in retrieved.candidates.values()}
        return chosen

    monkeypatch.setattr(exact_words.LowerTexts, "lowered", spy_lowered)
    monkeypatch.setattr(search_module, "_ranked", spy_ranked)

    def marks(reader: ChunkIndex) -> tuple[dict, dict, set]:
        tested.clear()
        hits = search("kiwi mango", index=reader, embedder=hasher, limit=3).hits
        rows_in_memory = reader.passage_rows(reader.dataset(CHUNKS))
        ids = list(seen["exact"])
        tweet = dict(zip(ids, rows_in_memory.column("tweet_id", ids)))
        texts = dict(zip(ids, rows_in_memory.column("text", ids)))
        assert seen["exact"] == {r: _holds_phrases(texts[r], ["kiwi mango"]) for r in ids}
        return ({tweet[r]: e for r, e in seen["exact"].items()}, {h.tweet_id: h.exact_match for h in hits},
                {tweet[r] for r in tested})

    # Without the word counts (no ASCII flags), each candidate is tested.
    exact, hits, looked_at = marks(ChunkIndex.from_settings())
    assert exact["both"] and exact["dot"] and {"k0", "m0"} <= set(exact) and looked_at == set(exact)
    # With them (a server counts the words), the passages of one word are not.
    reader = ChunkIndex.from_settings()
    reader.passage_rows(reader.dataset(CHUNKS)).count_words(exact_words.lowered_words)
    exact_counted, hits_counted, looked_at = marks(reader)
    assert exact_counted == exact and hits_counted == hits
    assert looked_at == {"both", "dot"}


def test_the_word_counts_flag_the_ascii_texts_and_a_new_version_keeps_them(index, hasher):
    from kb.index.exact_words import lowered_words

    index_rows(index, [chunk("a", 0, "plain words"), chunk("b", 0, "café au lait")], hasher)
    rows = index.passage_rows(index.dataset(CHUNKS))
    ids = sorted(rows.rows_of_bookmarks(["a"])["a"] + rows.rows_of_bookmarks(["b"])["b"])
    assert rows.ascii_texts(ids) is None  # no counts yet
    rows.count_words(lowered_words)
    by_tweet = dict(zip(rows.column("tweet_id", ids), rows.ascii_texts(ids)))
    assert by_tweet == {"a": True, "b": False}
    index_rows(index, [chunk("c", 0, "more plain words")], hasher)
    newer = index.passage_rows(index.dataset(CHUNKS))
    held = newer.rows_of_bookmarks(["a", "b", "c"])
    ids = sorted(held["a"] + held["b"])
    assert dict(zip(newer.column("tweet_id", ids), newer.ascii_texts(ids))) == {"a": True, "b": False}
    assert newer.ascii_texts(held["c"]) is None  # the new fragment: not counted yet
