"""The upkeep of the LanceDB serving index: the full-text, scalar and vector
indexes, folding new rows into them, compaction and the pruning of old
versions (IndexMaintenance, a mixin of ChunkIndex in kb/index/client.py).
Also the configuration of the vector index and of its queries
(vector_index_config(), vector_probes()), which search.py shares.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pyarrow as pa

from kb.index.chunk_schema import AUTHOR_KEY_COLUMN, NGRAM_COLUMN, author_key
from kb.index.chunking import unspaced_runs
from kb.index.store import BOOKMARKS, CHUNKS, KEEP_VERSIONS, META

# maintain() folds new rows into the indexes without compaction until the
# passages table has this many data files; then it compacts them. Each sync
# that adds rows adds one file and one segment to each index. A search reads
# each file and segment, so many of them make it slower.
COMPACT_FRAGMENTS = 16
# At a compaction, merge up to this many segments of an index: all of them.
MERGE_EVERY_SEGMENT = 1 << 16

# The full-text index keeps no token positions: with them its build took 4
# times longer and each query 2 times longer (benchmarks/index_and_retrieval.md).
# search.py finds a quoted phrase by an AND query of its words and an exact
# check on the text. English stemming and stop words, as in LanceDB's
# default: the `text` column is English (translated when needed).
def fts_config():
    from lancedb.index import FTS

    return FTS(with_position=False, base_tokenizer="simple", language="English",
               stem=True, remove_stop_words=True, lower_case=True, ascii_folding=True)


def ngram_fts_config():
    from lancedb.index import FTS

    return FTS(with_position=False, base_tokenizer="ngram", ngram_min_length=1, ngram_max_length=2,
               lower_case=False, stem=False, remove_stop_words=False, ascii_folding=False)

def vector_partitions(rows: int) -> int:
    """Partitions of the IVF vector index for a table of `rows` rows: about
    the square root, so partitions and rows per partition grow alike.
    search.py scans the nearest ones (vector_probes())."""
    return max(1, round(math.sqrt(rows)))


# A dense search compares at least this many vectors (every vector of a
# smaller table), and scans at least a tenth of the partitions: the MiniLM
# vectors of one topic lie in many partitions. On 104,732 real passages
# (benchmarks/real_passages.py, 324 partitions, 4-bit PQ codes, 4 x k
# re-ranked by the stored vectors) recall@10 against an exact search was
# 0.937 / 0.950 / 0.963 / 0.972 at 31 / 47 / 64 / 100 partitions, 2.5 / 2.7
# / 3.0 / 3.5 ms of CPU (goal 0.95): 64 leaves a margin for another build's
# k-means. On 1,000,000 vectors made from them (1,000 partitions), 100
# partitions: see benchmarks/index_and_retrieval.md, "Issue 49, third
# session".
MIN_COMPARED_VECTORS = 20_000


def vector_probes(rows: int) -> int:
    """Partitions that a dense query scans: the nearest to the query vector.
    At least 20, at least a tenth of them, and enough to hold
    MIN_COMPARED_VECTORS vectors. At 100,000 rows: 64 of 316 partitions;
    at 1,000,000: 100 of 1,000; below 20,000 rows: every partition."""
    partitions = vector_partitions(rows)
    compared = math.ceil(partitions * MIN_COMPARED_VECTORS / max(rows, 1))
    return max(20, partitions // 10, compared)


def vector_index_stats(dataset) -> dict | None:
    """Lance's statistics of the vector index of a dataset (None: no index):
    "indices" has one entry per segment (num_partitions ...), and
    num_unindexed_rows the rows that it does not cover. Without the
    centroids: with them they cost 78 ms of CPU at 100,000 passages and 290
    ms at 1,000,000; without them 6 ms (Lance 13 reads this variable at
    each call)."""
    os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")
    name = vector_index_name(dataset)
    return dataset.stats.index_stats(name) if name else None


def vector_index_name(dataset) -> str | None:
    """The name of the vector index of a Lance dataset (None: no index)."""
    return next((ix.name for ix in dataset.describe_indices() if ix.field_names == ["vector"]), None)


# The vector index keeps one 4-bit PQ code for each PQ_DIMS_PER_CODE
# dimensions of a vector: 48 bytes for 384 dimensions. A search process
# holds the codes of the partitions that it read in Lance's index cache, so
# the codes set the memory of a server: at 1,000,000 passages the 8-bit
# scalar codes of IVF_SQ (384 bytes a vector) took about 400 MB there, and
# the process 681 MB after 300 searches (goal 400). The codes give coarse
# distances only: search.py orders VECTOR_REFINE x k of them by the stored
# vectors (benchmarks/index_and_retrieval.md, "Issue 49, third session").
# Why 4-bit codes of 4 dimensions, not 8-bit codes of 8 (the same bytes):
# on 104,732 real passages the same recall (0.958 against 0.956 at 48
# partitions), and a scan of half the CPU (2.0 against 3.8 ms).
PQ_DIMS_PER_CODE = 4
PQ_BITS = 4
VECTOR_INDEX_TYPE = "IvfPq"  # as LanceDB's list_indices() names it


def pq_codes(dim: int) -> int:
    """PQ codes per vector: dim / PQ_DIMS_PER_CODE, or the nearest count
    below it that divides dim (Lance needs equal sub-vectors)."""
    codes = max(1, dim // PQ_DIMS_PER_CODE)
    while dim % codes:
        codes -= 1
    return codes


def vector_index_config(rows: int, dim: int):
    """The vector index for a table of `rows` rows of `dim` dimensions.
    "dot": the embedder gives unit vectors, so dot equals cosine and skips
    the norms; search.py queries with the same type. The k-means sample (at
    most about 20k vectors) and its 20 rounds bound the build time as the
    table grows. IVF_PQ: see PQ_DIMS_PER_CODE. Lance 13 makes fewer
    partitions of an IVF_PQ index when the table holds fewer rows than
    partitions x sample rate (1,983 rows, 45 partitions asked at a rate of
    256: 7 partitions), so the rate is at most rows / partitions.

    Lance 13's optimize() joins the partitions of this index into few
    large ones: ChunkIndex._compact() keeps them."""
    from lancedb.index import IvfPq

    partitions = vector_partitions(rows)
    return IvfPq(distance_type="dot", num_partitions=partitions, num_sub_vectors=pq_codes(dim), num_bits=PQ_BITS,
                 max_iterations=20, sample_rate=max(1, min(256, max(16, 20_000 // partitions), rows // partitions)))


def vector_dim(table) -> int:
    """The dimensions of the vector column of a table."""
    return table.schema.field("vector").type.list_size


class IndexMaintenance:
    """The indexes and compaction of ChunkIndex. A mixin: it needs the
    store of IndexStore (kb/index/store.py)."""

    def _create_fts(self, table) -> None:
        table.create_index("text", config=fts_config(), replace=True)
        self._create_ngram_fts(table)

    def _create_ngram_fts(self, table) -> None:
        if NGRAM_COLUMN not in table.schema.names:
            self._add_ngram_column(table)
        table.create_index(NGRAM_COLUMN, config=ngram_fts_config(), replace=True)

    def _add_ngram_column(self, table) -> None:
        """Give a passages table from before issue 29 its NGRAM_COLUMN, made
        from the text of each row (one new data file per fragment; the rows
        keep their ids and vectors)."""
        import lance

        @lance.batch_udf()
        def runs(batch: pa.RecordBatch) -> pa.RecordBatch:
            values = [unspaced_runs(text, source) for text, source in
                      zip(batch.column("text").to_pylist(), batch.column("source_text").to_pylist())]
            return pa.RecordBatch.from_arrays([pa.array(values, pa.string())], names=[NGRAM_COLUMN])

        dataset = lance.dataset(table.uri, storage_options=self.storage_options() or None)
        dataset.add_columns(runs, read_columns=["text", "source_text"])

    def _add_author_key_column(self, table) -> None:
        """Give a passages table from before issue 49 its AUTHOR_KEY_COLUMN,
        made from the author of each row, as _add_ngram_column() does."""
        import lance

        @lance.batch_udf()
        def keys(batch: pa.RecordBatch) -> pa.RecordBatch:
            values = [author_key(author) for author in batch.column("author").to_pylist()]
            return pa.RecordBatch.from_arrays([pa.array(values, pa.string())], names=[AUTHOR_KEY_COLUMN])

        dataset = lance.dataset(table.uri, storage_options=self.storage_options() or None)
        dataset.add_columns(keys, read_columns=["author"])

    def maintain(self, *, skip_if_current: bool = False) -> dict:
        """Fold new rows into the indexes, build the vector index once the
        table is large, compact files and prune old versions.

        skip_if_current: leave the passages table as it is when every index
        covers every row. The caller sets it when it deleted no passages: then
        nothing waits for an index or for pruning."""
        with self.writing():
            return self._maintain(skip_if_current=skip_if_current)

    def _maintain(self, *, skip_if_current: bool) -> dict:
        from lancedb.index import Bitmap, BTree

        report: dict[str, Any] = {}
        table = self.table(CHUNKS)
        if table is not None:
            rows = table.count_rows()
            indexed = {tuple(ix.columns): ix.index_type for ix in table.list_indices()}
            if ("text",) not in indexed:
                self._create_fts(table)
                report["fts"] = "created"
            elif (NGRAM_COLUMN,) not in indexed:
                self._create_ngram_fts(table)
                report["ngram_fts"] = "created"
            if AUTHOR_KEY_COLUMN not in table.schema.names and rows:
                self._add_author_key_column(table)
                table = self.table(CHUNKS)
            # The filters of a search test these columns (kb.index.search._where()).
            # BTree for the many values of a handle or an id, Bitmap for the
            # few kinds of source.
            for column, config in (("tweet_id", BTree()), ("source", Bitmap()), ("created_at", BTree()),
                                   (AUTHOR_KEY_COLUMN, BTree())):
                if (column,) not in indexed and rows:
                    table.create_index(column, config=config)
            # Exact (flat) vector search is exact and fast enough below this
            # size. Above it: an IVF index with PQ codes (vector_index_config()).
            # Its build is a k-means over a sample, where the HNSW-SQ index
            # that it replaced cost 75 s per 100k rows on 2 cores; a query
            # scans the nearest partitions (vector_probes()). An index of
            # another type (IVF_SQ, before issue 49) is made again once.
            if ("vector",) not in indexed and rows >= self._vector_index_min_rows():
                table.create_index("vector", config=vector_index_config(rows, vector_dim(table)))
                report["vector_index"] = "created"
            elif indexed.get(("vector",), VECTOR_INDEX_TYPE) != VECTOR_INDEX_TYPE:
                table.create_index("vector", config=vector_index_config(rows, vector_dim(table)), replace=True)
                report["vector_index"] = f"made again as {VECTOR_INDEX_TYPE}"
            # _compact(): compaction, new rows into every index, prune versions.
            # Its compaction rewrites every fragment below a million rows that
            # lies next to another one, so on a table of that size each call
            # rewrites the whole table (about 100 s at 1,000,000 passages),
            # and it makes the vector index again. When nothing is new, skip
            # it. Else fold the new rows into the indexes and leave the files
            # as they are (deleted rows too), until they are many small files.
            if skip_if_current and not report and not self._unindexed_rows(table):
                report["optimize"] = "skipped: every row is indexed"
            elif self._fold_new_rows(table):
                report["indexes"] = "new rows folded in, files not compacted"
            else:
                self._compact(table)
            report["chunks"] = rows
        cards = self.table(BOOKMARKS)
        if cards is not None:
            if ("tweet_id",) not in {tuple(ix.columns) for ix in cards.list_indices()} and cards.count_rows():
                cards.create_index("tweet_id", config=BTree())
            cards.optimize(cleanup_older_than=KEEP_VERSIONS)
        meta = self.table(META)
        if meta is not None:
            meta.optimize(cleanup_older_than=KEEP_VERSIONS)
        return report

    def _compact(self, table) -> None:
        """What lancedb's optimize() does (bring every index up to date,
        compact the files, prune old versions), except for the vector index.

        Why not optimize(): Lance 13 merges the segments of an IVF index and
        then joins partitions that are small by its own measure (about 32,000
        rows for IVF_SQ). A new build of 1,000,000 passages kept 31 of its 995
        partitions, 100,000 kept 4 of 316: a search of vector_probes()
        partitions then read every vector (hybrid p95 277 ms at 1,000,000,
        benchmarks/index_and_retrieval.md). So the vector index is made again,
        with vector_index_config() for the rows of now, when it has more than
        one segment or misses rows: at most once per COMPACT_FRAGMENTS syncs.

        The indexes come first: Lance compacts only files that the same
        index segments cover, and each fold gives its file segments of its
        own. (optimize() compacted nothing after 15 folds: 16 files stayed.)
        The compaction after it keeps the partitions."""
        dataset = self._lance(table)
        vector = vector_index_name(dataset)
        others = [ix.name for ix in dataset.describe_indices() if ix.name != vector]
        if others:
            # Every segment into one (the default merges only the newest).
            dataset.optimize.optimize_indices(index_names=others, num_indices_to_merge=MERGE_EVERY_SEGMENT)
        table.checkout_latest()
        if self._vector_index_is_stale(table):
            table.create_index("vector", config=vector_index_config(table.count_rows(), vector_dim(table)),
                               replace=True)
        self._lance(table).optimize.compact_files()
        self._lance(table).cleanup_old_versions(older_than=KEEP_VERSIONS)
        table.checkout_latest()

    def _vector_index_is_stale(self, table) -> bool:
        """True when the vector index has more than one segment or misses rows."""
        stats = vector_index_stats(self._lance(table))
        return stats is not None and (len(stats["indices"]) > 1 or stats["num_unindexed_rows"] > 0)

    def _fold_new_rows(self, table) -> bool:
        """Add the unindexed rows to every index and prune old versions,
        with no compaction: only the index files of the new rows are written.
        False when the table has COMPACT_FRAGMENTS files or more: then
        _compact() must compact them."""
        if table.stats()["fragment_stats"]["num_fragments"] >= COMPACT_FRAGMENTS:
            return False
        # num_indices_to_merge=0: the new rows get an index segment of their
        # own. Merging it into the full-text index rewrote that index: 4 s
        # of the 4.2 s that 1% new rows cost at 100k passages. The segments
        # add up until _compact() merges them, with the files. (It keeps
        # the partitions of the vector index, see _compact().)
        self._lance(table).optimize.optimize_indices(num_indices_to_merge=0)
        self._lance(table).cleanup_old_versions(older_than=KEEP_VERSIONS)
        return True

    @staticmethod
    def _unindexed_rows(table) -> int:
        """Rows that at least one index of the table does not cover yet."""
        most = 0
        for ix in table.list_indices():
            stats = table.index_stats(ix.name)
            most = max(most, getattr(stats, "num_unindexed_rows", 0) or 0)
        return most
