"""What a sync writes to the LanceDB index when little is new.

Each sync captures the top page of bookmarks again. Their passages are
stored already, and writing them again costs more than the rows: LanceDB
marks the old rows deleted, and the next optimize() rewrites the whole table
(benchmarks/bench_sync.py). These tests hold the index to "unchanged
passages are not written, and an index with nothing new is not optimized"."""

from __future__ import annotations

from datetime import datetime

import pytest

from kb.index.search import search
from kb.index.client import ChunkIndex
from kb.index.maintenance import COMPACT_FRAGMENTS, vector_partitions
from kb.index.store import CHUNKS

T0 = "2024-03-01T08:00:00+00:00"


def passage(tweet_id: str, position: int, text: str, **extra) -> dict:
    return {"chunk_id": f"{tweet_id}-{position}", "tweet_id": tweet_id, "url": f"https://x.com/a/status/{tweet_id}",
            "author": "alice", "created_at": T0, "source": "post", "ref": f"https://x.com/a/status/{tweet_id}",
            "position": position, "text": text, **extra}


def bookmark_rows() -> list[dict]:
    return [passage("1", 0, "raft consensus and leader election"),
            passage("1", 1, "log replication in raft"),
            passage("2", 0, "sourdough starter feeding schedule"),
            passage("3", 0, "roman roads and the grain fleet")]


@pytest.fixture
def built(hasher) -> ChunkIndex:
    index = ChunkIndex.from_settings()
    index.replace_chunks(["1", "2", "3"], bookmark_rows(), hasher)
    index.maintain()
    return index


def test_unchanged_passages_make_no_commit(built, hasher):
    table = built.table(CHUNKS)
    version = table.version
    # The same passages, with the time as a naive datetime: the same instant.
    again = [dict(r, created_at=datetime(2024, 3, 1, 8, 0)) for r in bookmark_rows()]
    result = built.replace_chunks(["1", "2", "3"], again, hasher)
    assert result == {"written": 0, "embedded": 0, "unchanged_bookmarks": 3, "deleted": 0}
    assert table.version == version
    report = built.maintain(skip_if_current=True)
    assert report["optimize"].startswith("skipped")
    assert table.version == version


def test_only_changed_bookmarks_are_written(built, hasher):
    table = built.table(CHUNKS)
    rows = bookmark_rows()
    rows[2] = passage("2", 0, "rye sourdough with a stiff starter")  # new text
    rows[3] = passage("3", 0, "roman roads and the grain fleet", author="bob")  # same text, new author
    result = built.replace_chunks(["1", "2", "3"], rows, hasher)
    assert (result["written"], result["unchanged_bookmarks"], result["deleted"]) == (2, 1, 0)
    assert result["embedded"] == 1  # the author changed, not the text: its vector comes from the cache
    assert table.count_rows() == 4
    assert search("rye", mode="bm25", index=built, embedder=hasher).hits[0].tweet_id == "2"
    assert built.passages(tweet_id="3")[0]["author"] == "bob"
    # New rows wait for the full-text index: maintain() folds them in even when asked to skip.
    assert built.counts()["fts_unindexed_rows"] > 0
    report = built.maintain(skip_if_current=True)
    assert "optimize" not in report and built.counts()["fts_unindexed_rows"] == 0


def test_stale_passages_still_leave(built, hasher):
    rows = [r for r in bookmark_rows() if r["chunk_id"] != "1-1"]
    result = built.replace_chunks(["1", "2", "3"], rows, hasher)
    assert (result["written"], result["deleted"], result["unchanged_bookmarks"]) == (1, 1, 2)
    assert sorted(built.table(CHUNKS).to_arrow().column("chunk_id").to_pylist()) == ["1-0", "2-0", "3-0"]
    assert [p["bookmark_chunks"] for p in built.passages(tweet_id="1")] == [1]
    # A bookmark with no passages left leaves the index.
    result = built.replace_chunks(["3"], [], hasher)
    assert result["deleted"] == 1 and built.passages(tweet_id="3") == []


def data_files(index: ChunkIndex) -> set[str]:
    return {p.name for p in (index.db_path() / f"{CHUNKS}.lance" / "data").iterdir()}


def test_new_bookmarks_are_folded_in_without_a_rewrite(built, hasher):
    before = data_files(built)
    built.replace_chunks(["4"], [passage("4", 0, "zeppelin airship mooring masts")], hasher)
    report = built.maintain(skip_if_current=True)
    # Every index covers the new row, and the files written before are kept:
    # only the new row's data file is new. A compaction would write them all again.
    assert report.get("indexes", "").startswith("new rows folded in")
    assert built.counts()["fts_unindexed_rows"] == 0
    after = data_files(built)
    assert before <= after and len(after - before) == 1
    assert search("zeppelin", mode="bm25", index=built, embedder=hasher).hits[0].tweet_id == "4"
    assert search("zeppelin airship", index=built, embedder=hasher).hits[0].tweet_id == "4"


def test_a_changed_bookmark_is_folded_in_without_a_rewrite(built, hasher):
    """A sync that changes a bookmark deletes its old passages, and the wiki
    index calls maintain() after each change. Neither may rewrite the table
    (at 1,000,000 passages a compaction writes 3.6 GB and makes the vector
    index again): the files stay until COMPACT_FRAGMENTS of them."""
    before = data_files(built)
    built.replace_chunks(["1"], [passage("1", 0, "raft consensus, leader election and log compaction")], hasher)
    report = built.maintain()
    assert report.get("indexes", "").startswith("new rows folded in")
    assert before <= data_files(built)
    assert search("compaction", mode="bm25", index=built, embedder=hasher).hits[0].tweet_id == "1"


def test_a_card_that_a_caller_changes_stays_the_same_in_the_index(built, hasher):
    built.upsert_bookmark_cards([{"tweet_id": "2", "url": "https://x.com/a/status/2", "author": "alice",
                                  "media": [{"kind": "photo", "url": "https://pbs.twimg.com/a.jpg"}]}])
    # The index keeps the cards that it read in memory; a caller's change to
    # its copy must not reach them.
    first = built.bookmark("2")
    first["media"][0]["url"] = "changed"
    first["author"] = "changed"
    again = built.bookmark("2")
    assert again["media"][0]["url"] == "https://pbs.twimg.com/a.jpg" and again["author"] == "alice"


def test_a_search_sees_a_changed_bookmark_card(built, hasher):
    card = {"tweet_id": "2", "url": "https://x.com/a/status/2", "author": "alice", "text": "bread",
            "media": [{"kind": "photo", "url": "https://pbs.twimg.com/old.jpg"}]}
    built.upsert_bookmark_cards([card])
    assert search("sourdough", index=built, embedder=hasher).hits[0].media[0]["url"].endswith("old.jpg")
    built.upsert_bookmark_cards([dict(card, media=[{"kind": "photo", "url": "https://pbs.twimg.com/new.jpg"}])])
    # The cards of the old table version that the first search kept are not served.
    assert search("sourdough", index=built, embedder=hasher).hits[0].media[0]["url"].endswith("new.jpg")


def test_an_index_of_8_bit_vectors_is_made_again_with_pq_codes(tmp_path, hasher):
    """A table from before issue 49 has an IVF_SQ index: 384 bytes a vector
    in the cache of a search process. maintain() makes it again once as
    IVF_PQ, and the next maintain() leaves it."""
    from lancedb.index import IvfSq

    from kb.index.maintenance import VECTOR_INDEX_TYPE

    def vector_index_type(table) -> str:
        return next(ix.index_type for ix in table.list_indices() if ix.columns == ["vector"])

    index = ChunkIndex(path=str(tmp_path / "lancedb"), vector_index_min_rows=1000)
    rows = [passage(f"a{i}", 0, f"old index passage {i} about topic {i % 37}") for i in range(1200)]
    index.replace_chunks([r["tweet_id"] for r in rows], rows, hasher)
    index.table(CHUNKS).create_index("vector", config=IvfSq(distance_type="dot", num_partitions=10))
    assert vector_index_type(index.table(CHUNKS)) == "IvfSq"
    assert index.maintain(skip_if_current=True).get("vector_index") == f"made again as {VECTOR_INDEX_TYPE}"
    assert vector_index_type(index.table(CHUNKS)) == VECTOR_INDEX_TYPE == "IvfPq"
    assert "vector_index" not in index.maintain(skip_if_current=True)
    assert search("topic 5", index=index, embedder=hasher, mode="dense").hits


def test_a_compaction_keeps_the_partitions_of_the_vector_index(tmp_path, hasher):
    """Lance's optimize() merges the segments of the IVF index and joins its
    partitions into a few large ones (a table of 1,000,000 passages kept 31
    of 995): a search of some partitions then reads every vector. After the
    compaction that COMPACT_FRAGMENTS syncs bring, the vector index must have
    the partitions that vector_partitions() gives for the rows of now, in one
    segment, and every other index one segment that covers every row."""
    index = ChunkIndex(path=str(tmp_path / "lancedb"), vector_index_min_rows=1000)
    first = [passage(f"a{i}", 0, f"first batch passage {i} about topic {i % 37}") for i in range(1200)]
    index.replace_chunks([r["tweet_id"] for r in first], first, hasher)
    assert index.maintain(skip_if_current=True).get("vector_index") == "created"
    syncs = COMPACT_FRAGMENTS - 1  # each adds a data file: the last one compacts
    for sync in range(syncs):
        rows = [passage(f"s{sync}-{i}", 0, f"sync {sync} passage {i} zeppelin{sync}") for i in range(20)]
        index.replace_chunks([r["tweet_id"] for r in rows], rows, hasher)
        report = index.maintain(skip_if_current=True)
        assert ("indexes" in report) == (sync < syncs - 1), (sync, report)
    table = index.dataset(CHUNKS)
    assert len(table.get_fragments()) == 1
    total = 1200 + 20 * syncs
    vector = table.stats.index_stats("vector_idx")
    assert [s["num_partitions"] for s in vector["indices"]] == [vector_partitions(total)]
    assert vector["num_unindexed_rows"] == 0
    for ix in table.describe_indices():
        stats = table.stats.index_stats(ix.name)
        assert stats["num_indices"] == 1 and stats["num_unindexed_rows"] == 0, ix.name
    assert search("zeppelin3", mode="bm25", index=index, embedder=hasher).hits[0].tweet_id.startswith("s3-")
