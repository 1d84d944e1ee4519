"""The index on the local disk against the index in an S3 bucket, in one run.

The same synthetic corpus as bench_index.py (Zipf pseudo-words, 384-dimension
random unit vectors, about 3 passages per bookmark) goes once into a local
LanceDB folder and once into s3://kb-bench/lancedb on a loopback moto S3
server (tests/fake_s3.py). For each it measures the build (replace_chunks in
batches, then maintain(): the full-text index, the scalar indexes and, from
--vector-index-min-rows, the IVF vector index) and the query time of
kb.index.search.search() in hybrid, bm25 and dense modes.

moto keeps the objects in memory in one Python process on this host. The
S3 figures therefore show the cost of the object-store protocol (one HTTP
request per object read or write, no local page cache), not the network
delay of a real bucket: add that delay per request for AWS S3 or MinIO.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_object_storage.py --size 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_index import PrecomputedEmbedder, make_corpus, percentiles  # noqa: E402

from kb.index.client import ChunkIndex  # noqa: E402
from kb.index.search import search  # noqa: E402
from tests.fake_s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, s3_server  # noqa: E402

QUERIES = 60


def bench(index: ChunkIndex, rows, vectors, queries, query_vectors) -> dict:
    embedder = PrecomputedEmbedder(vectors)
    started = time.perf_counter()
    for at in range(0, len(rows), 20_000):
        part = rows[at:at + 20_000]
        index.replace_chunks(sorted({r["tweet_id"] for r in part}), [dict(r) for r in part], embedder)
    written = time.perf_counter()
    index.maintain()
    built = time.perf_counter()
    out = {"write_s": round(written - started, 2), "maintain_s": round(built - written, 2),
           "build_s": round(built - started, 2), "vector_index": index.counts()["vector_index"]}
    pairs = list(zip(queries, query_vectors))[:QUERIES]
    for mode in ("hybrid", "bm25", "dense"):
        for query, vector in pairs[:3]:  # warm the caches
            search(query, mode=mode, index=index, query_vector=vector)
        times = []
        for query, vector in pairs:
            t = time.perf_counter()
            response = search(query, mode=mode, index=index, query_vector=vector)
            times.append((time.perf_counter() - t) * 1000)
            assert response.hits or mode == "bm25", (mode, query)
        out[mode] = percentiles(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="passages")
    parser.add_argument("--vector-index-min-rows", type=int, default=50_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows, vectors, queries, query_vectors = make_corpus(args.size)
    results = {"size": args.size}
    with tempfile.TemporaryDirectory() as tmp:
        local = ChunkIndex(path=str(Path(tmp) / "lancedb"), vector_index_min_rows=args.vector_index_min_rows)
        results["local"] = bench(local, rows, vectors, queries, query_vectors)
    with s3_server(bucket="kb-bench") as endpoint:
        remote = ChunkIndex(path="s3://kb-bench/lancedb", vector_index_min_rows=args.vector_index_min_rows,
                            s3_endpoint=endpoint, s3_region=REGION, s3_access_key_id=ACCESS_KEY_ID,
                            s3_secret_access_key=SECRET_ACCESS_KEY, s3_allow_http=True)
        results["s3"] = bench(remote, rows, vectors, queries, query_vectors)
    print(f"{'store':<6} {'write s':>8} {'maintain s':>10} {'build s':>8} "
          + " ".join(f"{m + ' p50/p95 ms':>22}" for m in ("hybrid", "bm25", "dense")))
    for store in ("local", "s3"):
        r = results[store]
        print(f"{store:<6} {r['write_s']:>8} {r['maintain_s']:>10} {r['build_s']:>8} "
              + " ".join(f"{str(r[m]['p50_ms']) + ' / ' + str(r[m]['p95_ms']):>22}" for m in ("hybrid", "bm25", "dense")))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
