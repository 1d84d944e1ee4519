"""The passages of one table version in memory (PassageRows), by row id,
one part per data fragment: read through Lance, or mapped from Arrow IPC
files that processes share (the rows files). ChunkIndex.passage_rows()
(kb/index/client.py) keeps the rows of the last version read; search.py
reads the columns of its candidates here, and their stored vectors where
a part has them (PassageRows.vectors_of())."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kb.index.chunk_schema import CHUNK_FIELDS

log = logging.getLogger(__name__)


# A fragment with fewer rows is read into memory also when the index has a
# rows_dir: the child process that writes a file costs 1 to 3 s (its
# imports), and a sync's small fragment costs little memory (see
# PassageRows.read()).
ROWS_FILE_MIN_ROWS = 10_000
# The stored vectors of a part, for the exact distances of search.py
# (PassageRows.vectors_of()): a rows file maps them (page cache, shared by
# the processes, no heap), and a fragment read into memory keeps them when
# it has fewer rows than this (a sync's new rows: 15 MB at most for 10,000
# passages of 384 dimensions). A larger fragment read into memory (no rows
# files: `kb search`) keeps none, and search.py asks Lance. Why not Lance:
# a read of stored vectors through Lance costs 8 to 13 us of CPU per row
# (5,000 rows of one author: 40 to 56 ms at 1,000,000 passages), a read
# from the mapped file about 0.1 us (benchmarks/index_and_retrieval.md).
VECTORS_IN_MEMORY_MAX_ROWS = ROWS_FILE_MIN_ROWS
VECTOR_COLUMN = "vector"


def dataset_identity(dataset) -> tuple:
    """The table version and its first data file. The version number alone
    is not enough: a table dropped and made again (kb index --rebuild) counts
    its versions from 1 again, and its files have new names."""
    fragments = dataset.get_fragments()
    first = fragments[0].metadata.files[0].path if fragments and fragments[0].metadata.files else ""
    return dataset.version, first


def _fragment_key(fragment) -> tuple:
    """What the rows of a fragment depend on: its id, its data files and its
    column overlays. kb's writes do not change a fragment: an update, and a
    merge of some columns, delete the old rows and write new rows in a new
    fragment (tried on lance 13). Lance can also rewrite columns of a
    fragment in place (alter_columns, update_columns), and then its files
    change. A deletion does not count: a deleted row is never a search
    result, so its row in memory is never read."""
    meta = fragment.metadata
    return fragment.fragment_id, tuple(f.path for f in meta.files), repr(getattr(meta, "overlays", None))


class PassageRows:
    """The passages of one table version without vectors (vectors only for
    a table without a vector index: see ChunkIndex._exact_search()), by row
    id, one part per data fragment. The columns that ranking reads of each
    candidate (tweet_id, source, ref, position, chunk_id, and the text for the
    phrase test and the rare-word count) are Python lists: a search reads
    them for about 200 rows, and from lists that costs 0.4 ms where an Arrow
    take cost 1.5 ms at 100,000 passages (the text: 0.65 ms against 1.4 ms
    with the lowering). The texts take about the memory of their Arrow
    column when they are ASCII (49 bytes more each); a text with an emoji
    takes 4 bytes per character. The other columns stay Arrow arrays of one
    chunk each (a take across chunks first copies the whole column: 30 ms
    for 100 texts)."""

    COLUMNS = list(CHUNK_FIELDS)
    LISTED = ("chunk_id", "tweet_id", "source", "ref", "position", "text")

    def __init__(self, identity: tuple, parts: dict[tuple, tuple[np.ndarray, dict]]):
        self.identity = identity
        self._parts = parts
        keys = list(parts)
        ids = [parts[k][0] for k in keys]
        self._columns = {name: [parts[k][1][name] for k in keys] for name in self.COLUMNS}
        self._vectors: list[np.ndarray | None] = [parts[k][1].get(VECTOR_COLUMN) for k in keys]
        # True when every part keeps its stored vectors (vectors_of()).
        self.keeps_vectors = all(v is not None for v in self._vectors)
        # Per table version (a new version makes a new object), so they stay
        # correct: the look-ups of query words that search.py made on this
        # version ({word: row ids, or None for a word that is not rare}),
        # and the vectors of a table too small for a vector index
        # (ChunkIndex.passage_rows()).
        self.word_holders: dict[tuple, Any] = {}  # (filter, word): array("Q") of row ids, or None
        self.word_ids_kept = 0
        # Per data fragment, once a search asked for them (count_words()):
        # {source: {word: passages of the fragment and source that hold it}}.
        # A fragment keeps its counts from version to version, as its rows.
        # words_of: the rule that gives the words of a text (kb.index.exact_words.lowered_words).
        self.word_counts: dict[tuple, dict[str, WordCounts]] = {}
        # Per data fragment, made with its word counts: True for each row
        # whose text is ASCII only (ascii_texts()).
        self.ascii_rows: dict[tuple, np.ndarray] = {}
        self.words_of: Callable[[str], set[str]] | None = None
        self.counting_started = False
        # Per data fragment: its rows in memory that this version deleted.
        self._deleted_since_read: dict[tuple, int] = {}
        self.vectors: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.word_rarity: Any = None  # kb.index.rerank.WordRarity of this version, made at the first deep search
        self._rows_by_bookmark: dict[str, list[int]] | None = None
        sizes = np.array([len(i) for i in ids], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        all_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint64)
        self._order = np.argsort(all_ids, kind="stable")
        self._sorted = all_ids[self._order]

    @classmethod
    def read(cls, dataset, identity: tuple, previous: PassageRows | None,
             exact_vectors: bool = False, rows_dir: Path | None = None, file_min_rows: int = 0) -> PassageRows:
        """The rows of `dataset`; the fragments that `previous` holds are
        not read again. rows_dir: the rows of each fragment of at least
        file_min_rows rows come from a memory-mapped Arrow file there (made
        once, by a child process: write_rows_files()), so they cost this
        process no heap, and the processes that map the same file share its
        pages. A smaller fragment (a sync's new rows) is read into memory:
        a sync then costs no child process, and a compaction puts its rows
        into a file."""
        known = previous._parts if previous is not None else {}
        parts = {}
        live_rows = {}
        new = []
        for fragment in dataset.get_fragments():
            key = _fragment_key(fragment)
            # From the manifest: no read of the deletion file (object storage).
            live_rows[key] = fragment.metadata.physical_rows - fragment.metadata.num_deletions
            if key in known:
                parts[key] = known[key]
            else:
                new.append((key, fragment))
        large = [(key, f) for key, f in new if f.metadata.physical_rows >= file_min_rows]
        mapped = cls._map_files(dataset, large, rows_dir) if rows_dir is not None and large else None
        if mapped is not None:
            parts.update(mapped)
            new = [(key, f) for key, f in new if key not in mapped]
        # search.py uses the stored vectors only when every part keeps
        # them: a small fragment reads them only when no part lacks them
        # (a large fragment read into memory keeps none).
        with_vectors = (all(part[1].get(VECTOR_COLUMN) is not None for part in parts.values())
                        and all(f.metadata.physical_rows < VECTORS_IN_MEMORY_MAX_ROWS for _, f in new))
        if new:
            for key, fragment in new:
                table = fragment.to_table(columns=cls.COLUMNS + [VECTOR_COLUMN] * with_vectors,
                                          with_row_id=True).combine_chunks()
                columns = {name: (table.column(name).to_pylist() if name in cls.LISTED else table.column(name).chunk(0))
                           for name in cls.COLUMNS} if table.num_rows else {name: [] for name in cls.COLUMNS}
                columns[VECTOR_COLUMN] = _vector_matrix(table, copy=True) if with_vectors else None
                parts[key] = (table.column("_rowid").to_numpy(), columns)
            # The texts are Python strings now; without this, Arrow's pool keeps
            # the freed text buffers (at 100,000 passages: 55 MB more memory).
            pa.default_memory_pool().release_unused()
        rows = cls(identity, parts)
        rows._deleted_since_read = {key: len(parts[key][0]) - live for key, live in live_rows.items()}
        if previous is not None and previous.words_of is not None:
            rows.words_of = previous.words_of
            rows.word_counts = {key: previous.word_counts[key] for key in parts if key in previous.word_counts}
            rows.ascii_rows = {key: previous.ascii_rows[key] for key in parts if key in previous.ascii_rows}
        if exact_vectors:
            rows.vectors = _live_vectors(dataset)
        return rows

    @classmethod
    def _map_files(cls, dataset, new: list[tuple], rows_dir: Path) -> dict | None:
        """{fragment key: (row ids, columns)} of the new fragments from their
        rows files, made first when missing. None when a file cannot be
        made or read: then the rows are read into memory, as without files."""
        files = {key: rows_file(rows_dir, dataset.uri, key) for key, _ in new}
        try:
            missing = [fragment.fragment_id for key, fragment in new if not files[key].exists()]
            if missing:
                write_rows_files(dataset.uri, dataset.version, missing, rows_dir)
                prune_rows_files(rows_dir, keep={rows_file(rows_dir, dataset.uri, _fragment_key(f))
                                                 for f in dataset.get_fragments()})
            parts = {}
            for key, fragment in new:
                table = pa.ipc.open_file(pa.memory_map(str(files[key]))).read_all()
                # The file holds the rows that were live when it was made: at
                # least those live now (a fragment only loses rows), at most all.
                meta = fragment.metadata
                if not meta.physical_rows - meta.num_deletions <= table.num_rows <= meta.physical_rows:
                    raise OSError(f"{files[key]} holds {table.num_rows} rows: not the rows of fragment "
                                  f"{fragment.fragment_id}")
                parts[key] = (table.column("_rowid").to_numpy(), cls._mapped_columns(table))
            return parts
        except (RuntimeError, OSError, pa.ArrowException) as exc:
            log.warning("The passage rows are read into memory, not from files in %s: %s", rows_dir, exc)
            return None

    @classmethod
    def _mapped_columns(cls, table: pa.Table) -> dict:
        """The columns of a memory-mapped rows file, without a copy: the
        string columns that ranking reads by row as _MappedStrings, the
        position as a list (small ints are shared objects), the others as
        Arrow arrays."""
        columns = {}
        for name in cls.COLUMNS:
            column = table.column(name)
            array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
            if name == "position":
                columns[name] = array.to_pylist()
            elif name in cls.LISTED:
                columns[name] = _MappedStrings(array) if array.null_count == 0 else array.to_pylist()
            else:
                columns[name] = array
        columns[VECTOR_COLUMN] = _vector_matrix(table, copy=False)
        return columns

    def __len__(self) -> int:
        return len(self._sorted)

    def count_words(self, words_of: Callable[[str], set[str]] | None = None) -> None:
        """Count, in each data fragment not counted yet, the passages of each
        source that hold each word (words_of(text): the words of a text).
        Why: search.py need not look up a word that more than a few passages
        surely hold. Per source: a search that leaves out some sources (the
        wiki pages) can use them too. The cost at 100,000 passages of 120
        words: 7 to 10 s of CPU on 2 loaded cores, and 15 to 22 MB of memory
        (a new version counts only its new fragments).
        A word that only one passage of a fragment and source holds is not
        kept: most words of a corpus are such words. Without them the sum is
        lower, but it stays a number of passages that surely hold the word
        (least_holders()). The counts keep no copy of the words (WordCounts)."""
        self.words_of = words_of or self.words_of
        for key, (_, columns) in self._parts.items():
            if key not in self.word_counts:
                texts_by_source: dict[str, list[str]] = {}
                ascii_rows = []
                for source, text in zip(columns["source"], columns["text"]):
                    texts_by_source.setdefault(source, []).append(text)
                    ascii_rows.append(text.isascii())  # a flag of the str: no pass over the text
                self.ascii_rows[key] = np.array(ascii_rows, dtype=bool)
                self.word_counts[key] = {source: _passages_per_word(texts, self.words_of)
                                         for source, texts in texts_by_source.items()}

    def uncounted(self) -> bool:
        """True when a search asked for word counts and a fragment has none yet."""
        return self.words_of is not None and any(key not in self.word_counts for key in self._parts)

    def least_holders(self, word: str, sources: list[str] | None = None) -> int:
        """At least this many passages of this version (of these sources,
        when given) hold `word`: the sum over the counted fragments (another
        thread may count the others), less the rows that this version
        deleted in each since it was read (a deleted row may hold the word)."""
        total = 0
        for key, deleted in self._deleted_since_read.items():
            by_source = self.word_counts.get(key)
            if by_source:
                held = sum(counts.get(word, 0) for source, counts in by_source.items()
                           if sources is None or source in sources)
                total += max(0, held - deleted)
        return total

    def ascii_texts(self, row_ids: list[int]) -> list[bool] | None:
        """For each of these rows, in their order: True when its text is
        ASCII only. None when a data fragment of these rows has no word
        counts yet (count_words() makes the flags with them)."""
        if not row_ids:
            return []
        _, part, local = self._locate(row_ids)
        flags = [self.ascii_rows.get(key) for key in self._parts]
        if any(flags[p] is None for p in np.unique(part).tolist()):
            return None
        return _by_part(part, local, lambda p, at: flags[p][at].tolist())

    def _locate(self, row_ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row ids, part, index in the part) of these rows. KeyError for a
        row id that this version does not hold."""
        wanted = np.asarray(row_ids, dtype=np.uint64)
        at = np.minimum(np.searchsorted(self._sorted, wanted), max(len(self._sorted) - 1, 0))
        if not len(self._sorted) or not np.array_equal(self._sorted[at], wanted):
            raise KeyError(f"row ids not in table version {self.identity[0]}")
        position = self._order[at]
        part = np.searchsorted(self._starts, position, side="right") - 1
        return wanted, part, position - self._starts[part]

    def column(self, name: str, row_ids: list[int]) -> list:
        """The values of one column for these rows, in their order. Why not
        get(): a dict per row cost more than the search's other Python work
        (about 1 ms for 200 candidates). An Arrow column is taken once per
        data fragment, in native code."""
        if not row_ids:
            return []
        _, part, local = self._locate(row_ids)
        values = self._columns[name]
        if name in self.LISTED:
            return _by_part(part, local, lambda p, at: _values_at(values[p], at))
        return _by_part(part, local, lambda p, at: values[p].take(pa.array(at)).to_pylist())

    def is_in(self, name: str, row_ids: list[int], values: list[str]) -> list[bool]:
        """For each of these rows, in their order: True when its value of
        the string column `name` is one of `values`. Why not column(): the
        dense search under a filter of source kinds tests about 2,000 rows,
        and a Python string per row cost 2 to 3 ms at 1,000,000 passages;
        a mapped part tests its Arrow array in native code."""
        if not row_ids:
            return []
        _, part, local = self._locate(row_ids)
        out = np.zeros(len(row_ids), dtype=bool)
        wanted = set(values)
        for p in np.unique(part).tolist():
            at = np.flatnonzero(part == p)
            column = self._columns[name][p]
            if isinstance(column, _MappedStrings):
                column = column.arrow()
            if isinstance(column, pa.Array):  # a mapped part, or a column that is not LISTED
                taken = column.take(pa.array(local[at]))
                out[at] = pc.is_in(taken, value_set=pa.array(values, type=taken.type)).to_numpy(zero_copy_only=False)
            else:  # a LISTED column of rows in memory: a Python list
                out[at] = [column[i] in wanted for i in local[at].tolist()]
        return out.tolist()

    def vectors_of(self, row_ids) -> np.ndarray | None:
        """The stored vectors of these rows (float32, one row each, in their
        order), or None when a part that holds one of them keeps no vectors
        (then search.py asks Lance). KeyError for a row id that this version
        does not hold."""
        if not len(row_ids):
            return None
        _, part, local = self._locate(row_ids)
        needed = np.unique(part).tolist()
        if any(self._vectors[p] is None for p in needed):
            return None
        if len(needed) == 1:
            return np.asarray(self._vectors[needed[0]][local])
        out = np.empty((len(local), self._vectors[needed[0]].shape[1]), dtype=np.float32)
        for p in needed:
            at = np.flatnonzero(part == p)
            out[at] = self._vectors[p][local[at]]
        return out

    def texts(self) -> list[str]:
        """The text of every passage of this version (no copy of a text)."""
        return [text for part in self._columns["text"] for text in part]

    def rows_of_bookmarks(self, tweet_ids: list[str]) -> dict[str, list[int]]:
        """{tweet id: row ids of all its passages}. The map of the whole
        version is made at the first call (about 30 ms at 100,000 passages)."""
        if self._rows_by_bookmark is None:
            by_bookmark: dict[str, list[int]] = {}
            for ids, part in zip(self._part_ids(), self._columns["tweet_id"]):
                for row_id, tweet_id in zip(ids.tolist(), part):
                    by_bookmark.setdefault(tweet_id, []).append(row_id)
            self._rows_by_bookmark = by_bookmark
        return {tweet_id: self._rows_by_bookmark.get(tweet_id, []) for tweet_id in tweet_ids}

    def _part_ids(self) -> list[np.ndarray]:
        return [self._parts[key][0] for key in self._parts]

    def get(self, row_ids: list[int], columns: list[str]) -> dict[int, dict]:
        """{row id: {column: value}} of these rows. KeyError for a row id
        that this version does not hold."""
        if not row_ids:
            return {}
        wanted, part, local = self._locate(row_ids)
        local = local.tolist()
        listed = [(name, self._columns[name]) for name in columns if name in self.LISTED]
        arrow = [(name, self._columns[name]) for name in columns if name not in self.LISTED]
        out: dict[int, dict] = {}
        for row_id, p, i in zip(wanted.tolist(), part.tolist(), local):
            row = {name: values[p][i] for name, values in listed}
            for name, arrays in arrow:
                row[name] = arrays[p][i].as_py()
            out[row_id] = row
        return out


def _passages_per_word(texts: list[str], words_of: Callable[[str], set[str]]) -> "WordCounts":
    """The passages that hold each word of these texts, for the words that
    more than one passage holds (see PassageRows.count_words())."""
    counts = Counter(chain.from_iterable(map(words_of, texts)))
    return WordCounts({word: n for word, n in counts.items() if n > 1})


class WordCounts:
    """{word: passages that hold it} as two sorted arrays: the hash of each
    word and its count (12 bytes a word). Why not a dict of the words: at
    100,000 passages it cost 14.4 MB of memory in each search process
    (benchmarks/index_and_retrieval.md, "word counts").

    get() gives a number that is surely not too high, as least_holders()
    needs: of two words of one fragment with the same hash, it finds the
    lower count (the arrays are in the order of hash, then count). A query
    word that the fragment does not hold and whose hash is that of a word
    that it holds gets that word's count; with 64-bit hashes and about 10^5
    words, the chance is about 10^-14 per word."""

    __slots__ = ("_hashes", "_counts")

    def __init__(self, counts: dict[str, int]):
        hashes = np.fromiter(map(hash, counts), dtype=np.int64, count=len(counts))
        values = np.fromiter(counts.values(), dtype=np.uint32, count=len(counts))
        order = np.lexsort((values, hashes))
        self._hashes, self._counts = hashes[order], values[order]

    def get(self, word: str, default: int = 0) -> int:
        key = hash(word)
        at = int(np.searchsorted(self._hashes, key))
        if at < len(self._hashes) and self._hashes[at] == key:
            return int(self._counts[at])
        return default


class _MappedStrings:
    """A string column of a memory-mapped rows file, read by row without a
    copy of the column: value i is decoded from the file's bytes when it is
    asked for. Why not a Python list: a list holds one object per row in
    the heap of each process (at 100,000 passages about 230 MB with the
    other columns)."""

    __slots__ = ("_array", "_offsets", "_data")

    def __init__(self, array: pa.Array):
        self._array = array  # keeps the buffers (the mapping) alive
        width = np.int64 if pa.types.is_large_string(array.type) else np.int32
        _, offsets, data = array.buffers()
        self._offsets = np.frombuffer(offsets, dtype=width)[array.offset:array.offset + len(array) + 1]
        self._data = memoryview(data) if data is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> str:
        offsets = self._offsets
        return str(self._data[offsets[i]:offsets[i + 1]], "utf-8")

    def arrow(self) -> pa.Array:
        return self._array

    def take(self, indices: np.ndarray) -> list[str]:
        """The values at these indices, in their order. Why: one numpy
        look-up for all the offsets; __getitem__ makes two numpy scalars per
        value (at 1,000,000 passages a search of one source read the text
        and the tweet id of about 1,150 candidates: 2.6 ms)."""
        data = self._data
        return [str(data[start:end], "utf-8")
                for start, end in zip(self._offsets[indices].tolist(), self._offsets[indices + 1].tolist())]

    def __iter__(self):
        data, offsets = self._data, self._offsets.tolist()
        for start, end in zip(offsets, offsets[1:]):
            yield str(data[start:end], "utf-8")


def _by_part(part: np.ndarray, local: np.ndarray, read) -> list:
    """The values of rows that lie in several parts, in the rows' order:
    read(part, positions in that part) gives one part's values."""
    parts = np.unique(part)
    if len(parts) == 1:
        return read(int(parts[0]), local)
    out: list = [None] * len(part)
    for p in parts.tolist():
        at = np.flatnonzero(part == p)
        for j, value in zip(at.tolist(), read(p, local[at])):
            out[j] = value
    return out


def _values_at(values: "list | _MappedStrings", local: np.ndarray) -> list:
    """The values of one part's listed column at these indices, in their order."""
    if isinstance(values, _MappedStrings):
        return values.take(local)
    return [values[i] for i in local.tolist()]


# The columns of a rows file: the passage rows and their stored vectors.
FILE_COLUMNS = PassageRows.COLUMNS + [VECTOR_COLUMN]


def rows_file(rows_dir: Path, table_uri: str, key: tuple) -> Path:
    """The rows file of one data fragment: its name is a digest of the table
    and of what the fragment's rows depend on (_fragment_key), so a file
    never holds other rows than its name says."""
    import hashlib

    digest = hashlib.sha256(repr((table_uri, key, FILE_COLUMNS)).encode()).hexdigest()[:32]
    return rows_dir / f"{digest}.arrow"


# Rows files that no table version read for this long are removed. A reader
# that maps a removed file keeps its pages (Linux keeps the data of an open
# file), and a reader of an older version makes the file again.
ROWS_FILE_KEEP_S = 3600


def prune_rows_files(rows_dir: Path, keep: set[Path]) -> None:
    cutoff = time.time() - ROWS_FILE_KEEP_S
    for path in rows_dir.glob("*.arrow"):
        try:
            if path not in keep and path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            pass


def write_rows_files(table_uri: str, version: int, fragment_ids: list[int], rows_dir: Path) -> None:
    """Write the rows files of these fragments of a local table version, in
    a child process. Why a child: a read of the rows through Lance leaves
    50 to 80 MB of freed memory in the reading process (the allocators keep
    it) at 100,000 passages; the child gives it back when it ends."""
    import subprocess

    rows_dir.mkdir(parents=True, exist_ok=True)
    code = "import sys; from kb.index.passage_rows import _write_rows_files_here as w; w(*sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", code, table_uri, str(version), str(rows_dir),
                           *map(str, fragment_ids)], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the passage rows of {table_uri} (version {version}) could not be written to "
                           f"{rows_dir}: {done.stderr.strip()[-500:]}")


def _write_rows_files_here(table_uri: str, version: str, rows_dir: str, *fragment_ids: str) -> None:
    """In the child process: one Arrow IPC file per fragment, one record
    batch each, written to a temporary name and then renamed (a reader never
    sees half a file; two writers write the same rows)."""
    import lance

    dataset = lance.dataset(table_uri, version=int(version))
    wanted = {int(f) for f in fragment_ids}
    for fragment in dataset.get_fragments():
        if fragment.fragment_id not in wanted:
            continue
        path = rows_file(Path(rows_dir), table_uri, _fragment_key(fragment))
        table = fragment.to_table(columns=FILE_COLUMNS, with_row_id=True).combine_chunks()
        batches = table.to_batches()
        batch = batches[0] if len(batches) == 1 else pa.RecordBatch.from_pylist([], schema=table.schema)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_batch(batch)
        os.replace(temporary, path)


def _vector_matrix(table: pa.Table, *, copy: bool) -> np.ndarray | None:
    """The vector column of a part as a float32 matrix (a view of the
    mapped file when copy is False), or None when a row has no vector."""
    if VECTOR_COLUMN not in table.column_names:
        return None
    column = table.column(VECTOR_COLUMN)
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    dim = array.type.list_size
    if array.null_count or array.values.null_count:
        return None
    if not len(array):
        return np.zeros((0, dim), dtype=np.float32)
    values = array.values.slice(array.offset * dim, len(array) * dim)
    matrix = values.to_numpy(zero_copy_only=not copy).reshape(-1, dim)
    return np.array(matrix, dtype=np.float32) if copy else matrix


def _live_vectors(dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(row ids, vectors as one float32 matrix, source kinds) of the rows of
    this version that are not deleted, or None when a row has no vector."""
    table = dataset.to_table(columns=["vector", "source"], with_row_id=True)
    column = table.column("vector").combine_chunks()
    if column.null_count or not len(column):
        return None
    dim = column.type.list_size
    matrix = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(-1, dim)
    kinds = np.asarray(table.column("source").to_pylist(), dtype=object)
    return table.column("_rowid").to_numpy(), matrix, kinds
