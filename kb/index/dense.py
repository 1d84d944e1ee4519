"""The dense retriever of a search (kb/index/search.py): the nearest
passages by their embedding vectors, as (row id, distance), nearest first.

Without a vector index Lance (or numpy, from the vectors in memory)
compares every vector: exact. With the IVF index, the index's coarse
distances choose candidates in the nearest partitions and the stored
vectors order them (_refined()). A filter that leaves few rows is searched
exactly from the stored vectors of its rows (_exact_rows()); a wider filter
scans enough partitions to fill the list (_dense()). The rows of a filter
are found once per table version (_filter_rows()). Figures:
benchmarks/index_and_retrieval.md and benchmarks/filters_and_scripts.md.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from kb.index.full_text import ROW_ID, _has_index
from kb.index.maintenance import vector_index_stats, vector_probes
from kb.index.passage_rows import PassageRows

# A dense search with a filter, on a table with a vector index (_dense()):
# when the filter leaves at most this many rows, the search compares the
# stored vectors of those rows, without the index: an exact search. At
# 100,000 passages that cost at most 2 times the CPU of the usual 20
# partitions (11 ms against 6 ms for 10,000 rows left, then through every
# partition; benchmarks/filters_and_scripts.md), and 20 partitions found
# only 65% of the exact top 200 there.
EXACT_FILTER_ROWS = 10_000
# A dense search through the vector index: the index's coarse distances (PQ
# codes, kb.index.maintenance.vector_index_config()) choose this many times
# k rows of the partitions that it scans, and the stored vectors order them
# (the passage rows' vectors, else Lance's refine). See
# benchmarks/index_and_retrieval.md, "Issue 49, third session".
VECTOR_REFINE = 4
# Above it: the partitions that hold about this many times k rows of the
# filter, if its rows lie evenly in them.
FILTER_PROBE_SAFETY = 2
# A dense query with this many partitions scans them all (Lance clips it).
ALL_PARTITIONS = 1 << 20
# A dense search under a wide filter of source kinds (_coarse()): the index
# query without the filter asks for this many times the rows that it must
# give of these kinds, divided by their share of the table; at most
# WIDE_MAX_OVERFETCH times, so for a share of at least half the table. At
# 1,000,000 passages 2,400 rows cost 11 ms of CPU, 1,000 rows 8 ms, and
# the query with the filter of 1 kind in 4 about 12 ms: no gain there.
WIDE_OVERFETCH = 1.5
WIDE_MAX_OVERFETCH = 3
ROWS_LEFT_KEPT = 64  # filters whose rows are kept per table version (_kept(): at most 80 kB each)


def _dense(table, rows: PassageRows, vector: np.ndarray, where: str | None, depth: int,
           table_rows: int, kinds: list[str] | None = None, allow: bytes | None = None) -> list[tuple[int, float]]:
    """(row id, distance) of the nearest passages, nearest first.

    Without a vector index, Lance compares every vector (of the rows that the
    filter leaves): the search is exact. With the IVF index, a search without
    a filter scans the nearest vector_probes() partitions (_refined()). A
    filter applies first (prefilter), so the nearest partitions can hold too
    few of its rows: with 20 of 141 partitions and 200 rows of one author
    among 20,000, a search found 29 of them (benchmarks/filters_and_scripts.md). So:
    - when the filter leaves at most EXACT_FILTER_ROWS rows: no vector index,
      the stored vectors of those rows only (the scalar indexes find them):
      an exact search (_exact_rows());
    - above that: enough partitions to hold about FILTER_PROBE_SAFETY times
      `depth` rows of the filter, and every partition when they still hold
      fewer than `depth`. So a filter never loses a hit that it leaves.
    kinds: the source kinds of `where` when they are its only test (then a
    wide filter can take the index's rows without the filter, _coarse()).
    allow: the rows of `where` as Lance's row allowlist (_row_allowlist()),
    when the search has it: the index query takes it in place of the SQL
    (at 1,000,000 passages, 1 kind of 4: 10.7 ms of CPU, not 12.0)."""
    probes = vector_probes(table_rows)
    if not _has_index(table, "vector"):
        return _nearest(table, vector, where, depth, probes)
    partitions = _vector_partitions_of(table)
    if not where:
        if partitions <= probes:
            # Every partition: every vector is read anyway, so the search
            # compares the stored vectors (at most about
            # MIN_COMPARED_VECTORS of them): exact, as without the index
            # (SciFact's 8,219 passages: dense nDCG@10 0.6533 through an
            # index of 8-bit vectors, 0.6550 exact).
            return _nearest(table, vector, None, depth, probes, use_index=False)
        return _refined(table, rows, vector, None, depth, probes)
    ids = _filter_rows(table, rows, where)
    if len(ids) <= EXACT_FILTER_ROWS:
        return _exact_rows(table, rows, vector, where, ids, depth)
    found = _refined(table, rows, vector, where, depth, _filter_probes(partitions, table_rows, len(ids), depth), kinds,
                     allow)
    if len(found) < depth:
        found = _refined(table, rows, vector, where, depth, ALL_PARTITIONS, kinds, allow)
    return found


def _refined(table, rows: PassageRows, vector: np.ndarray, where: str | None, depth: int,
             probes: int, kinds: list[str] | None = None, allow: bytes | None = None) -> list[tuple[int, float]]:
    """The nearest `depth` rows of the partitions that the index query
    scans: the index's coarse distances choose VECTOR_REFINE x depth rows,
    and their stored vectors order them. From the passage rows' vectors
    when they keep them (about 0.1 us a row); else Lance reads them
    (refine_factor: 8 to 13 us a row)."""
    if not rows.keeps_vectors:
        return _nearest(table, vector, where, depth, probes, refine=VECTOR_REFINE, allow=allow)
    coarse = _coarse(table, rows, vector, where, depth * VECTOR_REFINE, probes, kinds, allow)
    return _nearest_of(rows, vector, np.fromiter((r for r, _ in coarse), dtype=np.uint64, count=len(coarse)),
                       depth)


def _coarse(table, rows: PassageRows, vector: np.ndarray, where: str | None, count: int, probes: int,
            kinds: list[str] | None, allow: bytes | None = None) -> list[tuple[int, float]]:
    """The nearest `count` rows of `where` by the index's coarse distances,
    in the partitions that the query scans. kinds: the source kinds of
    `where`, when they are its only test. Then the index query runs without
    the filter, for about WIDE_OVERFETCH / share times `count` rows (share:
    the part of the table that the filter leaves), and the rows of other
    kinds are left out. The query chooses its partitions by the vector
    alone, so its first `count` rows of these kinds are the rows that the
    query with the filter gives, in the same order; when fewer come, the
    query with the filter runs. Why: at 1,000,000 passages Lance's
    prefilter of 3 of 4 kinds cost 15 ms of CPU, the query without it 9 to
    10 ms, for 400 or 2,000 rows alike (benchmarks/index_and_retrieval.md)."""
    if kinds and where:
        share = _share_of(table, rows, where)
        wanted = math.ceil(count * WIDE_OVERFETCH / share) if share else 0
        if 0 < wanted <= count * WIDE_MAX_OVERFETCH:
            found = _nearest(table, vector, None, wanted, probes)
            kept = [pair for pair, keep in zip(found, rows.is_in("source", [row for row, _ in found], kinds))
                    if keep][:count]
            if len(kept) == count:
                return kept
    return _nearest(table, vector, where, count, probes, allow=allow)


_SHARES: dict[tuple, float] = {}


def _share_of(table, rows: PassageRows, where: str) -> float:
    """The part of the rows of this table version that `where` leaves (0 to
    1). Kept per table version and filter, as _filter_rows()."""
    return _kept(_SHARES, (table.uri, rows.identity, where),
                 lambda: table.count_rows(filter=where) / max(1, table.count_rows()))


def _exact_rows(table, rows: PassageRows, vector: np.ndarray, where: str, ids: np.ndarray,
                depth: int) -> list[tuple[int, float]]:
    """The exact nearest `depth` of the rows `ids` (all the rows of the
    filter `where`): from the passage rows' vectors, else Lance compares
    the stored vectors of the rows that the filter leaves."""
    if rows.keeps_vectors:
        return _nearest_of(rows, vector, ids, depth)
    return _nearest(table, vector, where, depth, ALL_PARTITIONS, use_index=False)


def _nearest_of(rows: PassageRows, vector: np.ndarray, ids: np.ndarray, depth: int) -> list[tuple[int, float]]:
    """The nearest `depth` of the rows `ids` by their stored vectors, with
    Lance's dot distance (1 - dot product); equal distances in row id order,
    as Lance gives them."""
    if not len(ids):
        return []
    return _nearest_first(ids, 1.0 - _dot(rows.vectors_of(ids), vector), depth)


def _nearest_first(ids: np.ndarray, distance: np.ndarray, depth: int) -> list[tuple[int, float]]:
    """(row id, distance) of the `depth` nearest rows, nearest first; equal
    distances in row id order, as Lance gives them. Only the rows up to the
    depth-th distance (ties included) are sorted: a sort of 5,000 rows cost
    more than their distances."""
    if len(ids) > depth > 0:
        within = np.flatnonzero(distance <= np.partition(distance, depth - 1)[depth - 1])
        ids, distance = ids[within], distance[within]
    nearest = np.lexsort((ids, distance))[:depth]
    return list(zip(ids[nearest].tolist(), distance[nearest].tolist()))


def _nearest(table, vector: np.ndarray, where: str | None, depth: int, probes: int,
             refine: int | None = None, use_index: bool = True, allow: bytes | None = None) -> list[tuple[int, float]]:
    """One vector query: (row id, distance), nearest first. refine: Lance
    takes the best refine x depth rows by the index's coarse distances and
    orders them by the stored vectors (a read of each: 8 to 13 us of CPU)."""
    # Unit vectors: dot distance (1 - dot product) is cosine distance, cheaper.
    # probes: used only when the IVF index exists. Minimum and maximum
    # equal: Lance 13 raises any lower minimum to every partition when k > 10
    # (its heuristic for an open maximum).
    nearest = {"column": "vector", "q": np.asarray(vector, dtype=np.float32), "k": depth, "metric": "dot",
               "minimum_nprobes": probes, "maximum_nprobes": probes}
    if refine:
        nearest["refine_factor"] = refine
    if not use_index:  # every stored vector that the filter leaves: exact
        nearest["use_index"] = False
    if allow is not None:  # the rows of `where` (_row_allowlist()): Lance does not evaluate it again
        result = table.scanner(columns=["_distance"], with_row_id=True, nearest=nearest, prefilter=True,
                               row_addr_allowlist=allow, disable_scoring_autoprojection=True).to_table()
    else:
        result = table.to_table(columns=["_distance"], with_row_id=True, nearest=nearest, filter=where,
                                prefilter=bool(where), disable_scoring_autoprojection=True)
    return list(zip(result.column(ROW_ID).to_pylist(), result.column("_distance").to_pylist()))


def _filter_probes(partitions: int, table_rows: int, left: int, depth: int) -> int:
    """Partitions that hold about FILTER_PROBE_SAFETY x depth of the `left`
    rows of a filter, when they lie evenly in the partitions; at least
    vector_probes()."""
    wanted = math.ceil(partitions * depth * FILTER_PROBE_SAFETY / max(left, 1))
    return max(vector_probes(table_rows), min(partitions, wanted))


_PARTITIONS: dict[tuple, int] = {}


def _vector_partitions_of(table) -> int:
    """The most partitions of a segment of the vector index of this table
    version (an index made on fewer rows has fewer than vector_partitions()
    gives for the rows of now). Kept per table version (6 ms of CPU)."""
    def count() -> int:
        return max(int(s.get("num_partitions") or 0) for s in vector_index_stats(table)["indices"])

    return _kept(_PARTITIONS, (table.uri, table.version), count)


def _kept(kept: dict, key: tuple, count: Callable[[], Any]) -> Any:
    """count() once per key (a table, its version, and what is counted),
    with at most ROWS_LEFT_KEPT keys kept."""
    value = kept.get(key)
    if value is None:
        value = count()
        if len(kept) >= ROWS_LEFT_KEPT:
            kept.clear()
        kept[key] = value
    return value


_FILTER_ROWS: dict[tuple, np.ndarray] = {}


def _filter_rows(table, rows: PassageRows, where: str) -> np.ndarray:
    """The row ids that `where` leaves in this table version, at most
    EXACT_FILTER_ROWS + 1 of them (more: the filter is wide). A scan of row
    ids: the scalar indexes serve tweet_id, created_at, source and
    AUTHOR_KEY_COLUMN (before that column, the author test read the author
    of every row: at 1,000,000 passages about 17 ms of CPU). Kept per
    table and version (_kept()): the MCP server gives each search the same
    source filter. The key holds the version's identity (its first data
    file too), not only its number: a table made again counts its versions
    from 1 again, and its row ids must never come from the old table."""
    return _kept(_FILTER_ROWS, (table.uri, rows.identity, where), lambda: table.to_table(
        columns=[], with_row_id=True, filter=where, limit=EXACT_FILTER_ROWS + 1).column(ROW_ID).to_numpy())


_BLAS: list = []  # threadpoolctl's controller of numpy's BLAS, made at the first _dot()
# One product at a time sets and gives back the limit. threadpoolctl lets one
# thread control OpenBLAS at a time: two products that overlap could give
# back the limit that the other had set, and leave one thread for good.
_BLAS_LOCK = threading.Lock()


def _dot(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix @ vector (one dot product per row) in one BLAS thread. Why:
    OpenBLAS splits a product of more than about 9,000 values over each
    core, and on 2 busy cores its threads wait for each other. At 1,000,000
    passages, 5,000 rows of one author: 6.4 ms of CPU (27 ms wall) in 2
    threads, 1.3 ms in one, with the same values bit for bit (the threads
    share the rows, not a sum). numpy's own loop (einsum) costs less but
    sums in another order: other last bits, and so other ties. The limit
    holds for the process while the product runs; the products of other
    threads wait for it (each takes at most a few ms)."""
    with _BLAS_LOCK:
        if not _BLAS:
            from threadpoolctl import ThreadpoolController

            _BLAS.append(ThreadpoolController())
        with _BLAS[0].limit(limits=1, user_api="blas"):
            return matrix @ np.asarray(vector, dtype=np.float32)


def _exact_dense(vectors: tuple[np.ndarray, np.ndarray, np.ndarray], vector: np.ndarray, depth: int,
                 sources: list[str] | None = None) -> list[tuple[int, float]]:
    """(row id, distance) of the nearest passages, nearest first, from the
    vectors in memory: the exact search that Lance makes on a table without
    a vector index, with the same dot distance (1 - dot product), without
    the fixed cost of a Lance query (1 to 2 ms, also on 43 rows). sources:
    only the passages of these kinds, as the filter `source IN (...)` (the
    MCP server sets it when the index holds wiki pages)."""
    row_ids, matrix, kinds = vectors
    distance = 1.0 - _dot(matrix, vector)
    if sources is not None:
        keep = np.flatnonzero(np.isin(kinds, np.asarray(sources, dtype=object)))
        row_ids, distance = row_ids[keep], distance[keep]
    return _nearest_first(row_ids, distance, depth)
