"""Dense search under a filter, on a table with an IVF vector index.

Why: a prefilter that leaves few rows starves the nearest partitions. With
a fixed number of partitions (minimum_nprobes == maximum_nprobes ==
vector_probes(), kb before issue 29) Lance returns fewer than k rows, and
their order is not the exact one. Lance 13 has no middle way: for k > 10
and no fixed number, it raises the minimum to every partition (its legacy
heuristic: each partition within 81 times the nearest centroid distance).

For filters that leave 50 to 30,000 rows, this benchmark measures:

- fixed: vector_probes() partitions, as before;
- scaled: the partitions that hold about SAFETY x k rows of the filter, if
  the filter's rows lie evenly in the partitions (at least vector_probes());
- all: every partition, with the filter first: an exact search of the rows
  that the filter leaves (IVF_FLAT keeps the vectors whole);
- count: the scan that tells how many rows the filter leaves (row ids
  only, at most a limit), as kb.index.search does it before the query.

Each with the CPU time of the process (median of the queries; steadier than
the wall time on a shared machine), the rows returned and the recall
against an exact search. Synthetic data: clustered unit vectors of 384
dimensions (200 topics), and authors that own a given number of rows at
random places, so that the rows of one author lie in many partitions.

    .venv/bin/python benchmarks/bench_filters.py --rows 20000 100000
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

from kb.index.maintenance import vector_index_config, vector_partitions, vector_probes
from kb.index.store import _lancedb

DIM = 384
TOPICS = 200
DEPTH = 200  # the dense depth of a search with limit 100 (kb.index.search)
SIZES = (50, 200, 1000, 3000, 10000, 30000)
QUERIES = 15
SAFETY = 2
COUNT_LIMIT = 5000


def make_table(rows: int, folder: str, seed: int = 29):
    from lancedb.index import BTree

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(TOPICS, DIM)).astype(np.float32)
    vectors = centers[rng.integers(0, TOPICS, rows)] + 1.2 * rng.normal(size=(rows, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    authors = np.array(["crowd"] * rows, dtype=object)
    order = rng.permutation(rows)
    start = 0
    for size in SIZES:
        if start + size > rows:
            break
        authors[order[start:start + size]] = f"a{size}"
        start += size
    day0 = datetime(2020, 1, 1, tzinfo=timezone.utc)
    data = pa.table({
        "author": pa.array(authors.tolist()),
        "created_at": pa.array([day0 + timedelta(minutes=int(m)) for m in rng.permutation(rows)],
                               pa.timestamp("us", tz="UTC")),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM),
    })
    db = _lancedb().connect(folder)
    table = db.create_table("t", data=data)
    started = time.perf_counter()
    table.create_index("vector", config=vector_index_config(rows))
    build = time.perf_counter() - started
    table.create_index("created_at", config=BTree())
    import lance

    return lance.dataset(f"{folder}/t.lance"), centers, build, day0


def cpu_ms(run):
    started = time.process_time()
    out = run()
    return (time.process_time() - started) * 1000, out


def bench(rows: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="kb-bench-filters-") as folder:
        dataset, centers, build, day0 = make_table(rows, folder)
        probes, partitions = vector_probes(rows), vector_partitions(rows)
        for ix in dataset.describe_indices():
            dataset.prewarm_index(ix.name)
        rng = np.random.default_rng(1)
        queries = centers[rng.integers(0, TOPICS, QUERIES)] + 1.2 * rng.normal(size=(QUERIES, DIM))
        queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
        out = {"rows": rows, "build_s": round(build, 1), "probes": probes, "partitions": partitions, "filters": []}
        filters = [(f"author, {size} rows", f"lower(author) = 'a{size}'", size) for size in SIZES if size <= rows // 2]
        for size in (200, 3000, 30000):  # created_at holds minute i for row i: a window of `size` rows
            if size <= rows // 2:
                end = (day0 + timedelta(minutes=size)).strftime("%Y-%m-%dT%H:%M:%S.000000Z")
                filters.append((f"date, {size} rows", f"created_at < timestamp '{end}'", size))
        for label, where, size in filters:
            def run(vector, nprobes=None):
                spec = {"column": "vector", "q": vector, "k": DEPTH, "metric": "dot", "use_index": nprobes is not None}
                if nprobes is not None:
                    spec["minimum_nprobes"] = spec["maximum_nprobes"] = nprobes
                return dataset.to_table(columns=["_distance"], with_row_id=True, nearest=spec, filter=where,
                                        prefilter=True, disable_scoring_autoprojection=True)
            scaled = max(probes, min(partitions, math.ceil(partitions * DEPTH * SAFETY / size)))
            ways = {"fixed": probes, "scaled": scaled, "all": partitions}
            cpu = {k: [] for k in (*ways, "count")}
            found = {k: [] for k in ways}
            recall = {k: [] for k in ways}
            for q in queries:
                truth = run(q).column("_rowid").to_pylist()
                for name, nprobes in ways.items():
                    ms, result = cpu_ms(lambda: run(q, nprobes))
                    cpu[name].append(ms)
                    ids = result.column("_rowid").to_pylist()
                    found[name].append(len(ids))
                    recall[name].append(len(set(truth) & set(ids)) / max(1, len(truth)))
                    if name == "all":
                        assert ids == truth, "every partition must give the exact order"
                ms, _ = cpu_ms(lambda: dataset.to_table(columns=[], with_row_id=True, filter=where,
                                                        limit=COUNT_LIMIT + 1))
                cpu["count"].append(ms)
            out["filters"].append({
                "filter": label, "scaled_probes": scaled,
                **{f"{k}_cpu_ms": round(statistics.median(v), 2) for k, v in cpu.items()},
                **{f"{k}_rows": round(statistics.fmean(v), 1) for k, v in found.items()},
                **{f"{k}_recall": round(statistics.fmean(v), 3) for k, v in recall.items()},
            })
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--out", help="write the figures as JSON to this file")
    args = parser.parse_args()
    results = []
    for rows in args.rows:
        result = bench(rows)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "filters"}))
        print(f"{'filter':<20} {'fixed ms':>8} {'rows':>6} {'recall':>6} | {'probes':>6} {'ms':>6} {'rows':>6}"
              f" {'recall':>6} | {'all ms':>6} | {'count ms':>8}")
        for f in result["filters"]:
            print(f"{f['filter']:<20} {f['fixed_cpu_ms']:>8} {f['fixed_rows']:>6} {f['fixed_recall']:>6} |"
                  f" {f['scaled_probes']:>6} {f['scaled_cpu_ms']:>6} {f['scaled_rows']:>6} {f['scaled_recall']:>6} |"
                  f" {f['all_cpu_ms']:>6} | {f['count_cpu_ms']:>8}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
