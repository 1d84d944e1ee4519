"""The passage rows as memory-mapped Arrow files (PassageRows.read() with
ChunkIndex.rows_dir), on real LanceDB files.

The search service (kb web) reads the rows of each data fragment from one
file that a child process writes, so the rows take no room in the heap of
the searching process, and processes that map the same file share its pages.
The answers must be those of the rows in memory, field for field."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS
from kb.index.search import search

pytestmark = pytest.mark.slow  # slow: a kb process writes each rows file

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
# Texts with characters of 2, 3 and 4 bytes in UTF-8: a file's strings are
# read by byte offsets.
TEXTS = ["Rust ownership and the borrow checker, déjà vu", "Sourdough starter: 面包 and the loaf",
         "Kubernetes operators reconcile 🚀 the cluster state", "Espresso grind size, dose and water",
         "The borrow checker in a talk about lifetimes"]
QUERIES = [("borrow checker", {}), ("sourdough 面包", {}), ("cluster state", {"source": "post"}),
           ("espresso", {"author": "user1"}), ("lifetimes", {"mode": "bm25"}), ("loaf", {"mode": "dense"}),
           ("borrow", {"tweet_id": "3"})]


def rows_of(first: int, count: int) -> list[dict]:
    rows = []
    for number in range(first, first + count):
        tweet_id = str(number // 2)
        rows.append({"chunk_id": f"c{number}", "tweet_id": tweet_id, "url": f"https://x.com/u/status/{tweet_id}",
                     "author": f"user{number % 3}", "created_at": T0 + timedelta(days=number),
                     "source": ("post", "link")[number % 2], "ref": f"https://example.com/{tweet_id}",
                     "position": number % 2, "text": f"{TEXTS[number % len(TEXTS)]} {number}"})
    return rows


def write(index: ChunkIndex, rows: list[dict], hasher: Embedder) -> None:
    index.replace_chunks(sorted({r["tweet_id"] for r in rows}), rows, hasher)


def answers(index: ChunkIndex, hasher: Embedder) -> list:
    return [[h.to_dict() for h in search(query, index=index, embedder=hasher, **filters).hits]
            for query, filters in QUERIES]


@pytest.fixture
def store(tmp_path, hasher) -> Path:
    folder = tmp_path / "lancedb"
    write(ChunkIndex.from_settings(path=str(folder)), rows_of(0, 30), hasher)
    return folder


def test_rows_from_files_give_the_answers_of_rows_in_memory(store, tmp_path, hasher):
    rows_dir = tmp_path / "rows"
    mapped = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=0)
    in_memory = ChunkIndex.from_settings(path=str(store))
    assert answers(mapped, hasher) == answers(in_memory, hasher)
    assert all(answers(mapped, hasher))  # every query has hits
    files = sorted(rows_dir.glob("*.arrow"))
    assert len(files) == len(mapped.dataset(CHUNKS).get_fragments())
    rows = mapped.passage_rows(mapped.dataset(CHUNKS))
    assert type(rows._columns["text"][0]).__name__ == "_MappedStrings"


def test_a_rows_file_maps_the_stored_vectors_of_its_rows(store, tmp_path, hasher):
    """The re-rank of the dense search and the exact search of a narrow
    filter read the stored vectors from the rows files: they must be
    Lance's vectors, row for row, in any order asked, without a copy of
    the file in the heap."""
    import numpy as np

    write(ChunkIndex.from_settings(path=str(store)), rows_of(30, 12), hasher)  # a second fragment
    mapped = ChunkIndex.from_settings(path=str(store), rows_dir=str(tmp_path / "rows"), rows_file_min_rows=0)
    table = mapped.dataset(CHUNKS)
    rows = mapped.passage_rows(table)
    assert rows.keeps_vectors and len(table.get_fragments()) == 2
    stored = table.to_table(columns=["vector"], with_row_id=True)
    ids = stored.column("_rowid").to_numpy()
    matrix = np.stack(stored.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    order = np.random.default_rng(3).permutation(len(ids))  # rows of both fragments, mixed
    assert np.array_equal(rows.vectors_of(ids[order]), matrix[order])
    assert all(not part.flags.owndata for part in rows._vectors)  # views of the mapped files
    with pytest.raises(KeyError):
        rows.vectors_of(np.array([ids.max() + 1], dtype=np.uint64))


def test_a_rows_file_gives_the_columns_of_rows_in_memory_in_any_order(store, tmp_path, hasher):
    """The rules read the text and the tweet id of each candidate through
    column(): from a mapped file they are read many at a time
    (_MappedStrings.take()), and is_in() tests a column in Arrow. They must
    give the values of the rows in memory, in the order asked, across two
    data fragments."""
    import numpy as np

    write(ChunkIndex.from_settings(path=str(store)), rows_of(30, 12), hasher)  # a second fragment
    mapped = ChunkIndex.from_settings(path=str(store), rows_dir=str(tmp_path / "rows"), rows_file_min_rows=0)
    in_memory = ChunkIndex.from_settings(path=str(store))
    table = mapped.dataset(CHUNKS)
    rows, plain = mapped.passage_rows(table), in_memory.passage_rows(in_memory.dataset(CHUNKS))
    assert type(rows._columns["text"][1]).__name__ == "_MappedStrings"
    ids = table.to_table(columns=[], with_row_id=True).column("_rowid").to_numpy()
    order = ids[np.random.default_rng(5).permutation(len(ids))].tolist() + ids[:3].tolist()  # mixed, some twice
    for name in ("text", "tweet_id", "chunk_id", "source", "ref", "position"):
        assert rows.column(name, order) == plain.column(name, order), name
    first = [i for i in order if i < (1 << 32)]  # the rows of one fragment only
    assert rows.column("text", first) == plain.column("text", first)
    assert {t.split(" ")[-1] for t in rows.column("text", order)} == {str(n) for n in range(42)}
    # The test of the source kinds (dense._coarse()) reads the mapped Arrow array.
    kinds = [kind == "post" for kind in plain.column("source", order)]
    assert rows.is_in("source", order, ["post"]) == plain.is_in("source", order, ["post"]) == kinds
    assert any(kinds) and not all(kinds)
    # A column that is not LISTED (an Arrow array in both forms) answers too.
    langs = plain.column("lang", order)
    assert rows.is_in("lang", order, [langs[0]]) == plain.is_in("lang", order, [langs[0]]) == [
        lang == langs[0] for lang in langs]


def test_rows_in_memory_read_no_vectors_that_the_search_cannot_use(store, hasher, monkeypatch):
    """Without rows files, a large fragment keeps no vectors, and the search
    then asks Lance for all of them: a sync's small fragment must not read
    its vectors into memory for nothing. A table of small fragments only
    keeps them."""
    import kb.index.passage_rows as passage_rows_module

    write(ChunkIndex.from_settings(path=str(store)), rows_of(30, 12), hasher)  # 30 rows, then 12
    monkeypatch.setattr(passage_rows_module, "VECTORS_IN_MEMORY_MAX_ROWS", 20)
    index = ChunkIndex.from_settings(path=str(store))
    rows = index.passage_rows(index.dataset(CHUNKS))
    assert not rows.keeps_vectors and rows._vectors == [None, None]
    monkeypatch.setattr(passage_rows_module, "VECTORS_IN_MEMORY_MAX_ROWS", 40)
    index = ChunkIndex.from_settings(path=str(store))
    assert index.passage_rows(index.dataset(CHUNKS)).keeps_vectors


def test_a_sync_reads_its_small_fragment_into_memory(store, tmp_path, hasher):
    """A sync's new fragment of fewer than rows_file_min_rows rows is read
    into memory: no child process, no file; the known files stay as they
    are, and the answers are those of the rows in memory."""
    rows_dir = tmp_path / "rows"
    mapped = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=10)
    search("borrow", index=mapped, embedder=hasher)
    first = {path: path.stat().st_mtime_ns for path in rows_dir.glob("*.arrow")}
    assert first
    write(mapped, rows_of(100, 4), hasher)
    assert search("borrow 102", index=mapped, embedder=hasher, mode="bm25").hits[0].tweet_id == "51"
    assert {path: path.stat().st_mtime_ns for path in rows_dir.glob("*.arrow")} == first
    assert answers(mapped, hasher) == answers(ChunkIndex.from_settings(path=str(store)), hasher)


def test_a_new_version_writes_only_its_new_fragment_and_sees_its_rows(store, tmp_path, hasher):
    rows_dir = tmp_path / "rows"
    mapped = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=0)
    search("borrow", index=mapped, embedder=hasher)
    first = {path: path.stat().st_mtime_ns for path in rows_dir.glob("*.arrow")}
    write(mapped, rows_of(100, 4), hasher)  # a sync: one new fragment
    hits = search("borrow 102", index=mapped, embedder=hasher, mode="bm25").hits
    assert hits[0].tweet_id == "51"
    now = {path: path.stat().st_mtime_ns for path in rows_dir.glob("*.arrow")}
    assert len(now) == len(first) + 1
    assert all(now[path] == stamp for path, stamp in first.items()), "a known fragment's file was written again"
    assert answers(mapped, hasher) == answers(ChunkIndex.from_settings(path=str(store)), hasher)


def test_a_deleted_row_is_never_found_through_an_older_file(store, tmp_path, hasher):
    rows_dir = tmp_path / "rows"
    mapped = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=0)
    assert any(h.tweet_id == "2" for h in search("cluster state", index=mapped, embedder=hasher).hits)
    mapped.remove_bookmarks(["2"])  # the file of its fragment still holds its rows
    again = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=0)
    assert not any(h.tweet_id == "2" for h in search("cluster state", index=again, embedder=hasher).hits)
    assert answers(again, hasher) == answers(ChunkIndex.from_settings(path=str(store)), hasher)


CHILD = """
import json, sys
from pathlib import Path
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.index.search import search
index = ChunkIndex.from_settings(path=sys.argv[1], rows_dir=sys.argv[2], rows_file_min_rows=0)
hasher = Embedder.from_settings(backend="hash", cache_dir=sys.argv[1])
hits = [h.tweet_id for h in search("borrow checker", index=index, embedder=hasher).hits]
maps = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(".arrow")]
print(json.dumps({"hits": hits, "mapped": sorted(set(maps))}))
"""


def test_two_processes_share_the_files_of_one_version(store, tmp_path, hasher):
    """The second process maps the files that the first made: no file is
    written again, both map the same files, and the answers are equal."""
    rows_dir = tmp_path / "rows"
    env = {"PYTHONPATH": str(REPO), "KB_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", CHILD, str(store), str(rows_dir)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        runs.append((json.loads(done.stdout.strip().splitlines()[-1]),
                     {path: path.stat().st_mtime_ns for path in rows_dir.glob("*.arrow")}))
    (first, files_after_first), (second, files_after_second) = runs
    assert files_after_first == files_after_second
    assert first["mapped"] == second["mapped"] == sorted(str(path) for path in files_after_first)
    assert first["hits"] == second["hits"] == [h.tweet_id for h in search(
        "borrow checker", index=ChunkIndex.from_settings(path=str(store)), embedder=hasher).hits]


def test_a_damaged_file_falls_back_to_rows_in_memory(store, tmp_path, hasher, caplog):
    """A file cut short (a full disk, a crash of the writer) is not used:
    the rows are read into memory, with a warning that names the folder."""
    rows_dir = tmp_path / "rows"
    first = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=0)
    search("borrow", index=first, embedder=hasher)
    for path in rows_dir.glob("*.arrow"):
        path.write_bytes(path.read_bytes()[:200])
    damaged = ChunkIndex.from_settings(path=str(store), rows_dir=str(rows_dir), rows_file_min_rows=0)
    with caplog.at_level(logging.WARNING, logger="kb.index.passage_rows"):
        assert answers(damaged, hasher) == answers(ChunkIndex.from_settings(path=str(store)), hasher)
    assert any("read into memory" in r.message and str(rows_dir) in r.message for r in caplog.records)
