"""Dense recall of kb's vector index on real text (issue 49, point 1).

bench_index.py measures the index on random vectors. Random vectors have no
neighbour structure, so their recall says little about real embeddings. This
benchmark uses real passages and real queries:

- passages: the SciFact corpus (KB_SHARED_DIR/eval/scifact; by default the
  folder `shared` next to the repository), cut as kb cuts
  a document (kb.apps.eval_retrieval.document_chunks(): the title as first
  paragraph, at most 200 words per passage): 8,219 passages. --passages N
  takes the first N.
- vectors: the local model of the settings (kb.index.embedder.Embedder,
  backend "local"), through kb's embedding cache in --cache. The first run
  embeds; a later run reads the cache. Keep --cache outside the repository.
- queries: the SciFact train queries (--queries of them), embedded as kb
  embeds a query. Their vectors are kept in --cache too.
- the index: kb's own (ChunkIndex.replace_chunks() and maintain(), so
  vector_index_config() and its partitions), also below
  kb_vector_index_min_rows, so that a small run has an index to measure.

For each number of partitions scanned (the curve: kb's vector_probes() and
a range around it, up to every partition) it gives recall@10 and
recall@100 of the index query against an exact search of every vector
(the share of the exact top k that the index query finds), and the query
time (p50 / p95 wall, CPU per query). The query is the one that
kb.index.search._nearest() makes (dot distance, no refine).

    KB_SHARED_DIR=/work/shared PYTHONPATH=$PWD:$PWD/benchmarks HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_recall.py \\
        --passages 2000 --queries 100 --cache ~/.cache/kb-bench-recall --out FILE

What it does not do yet: 100,000 real passages (SciFact holds 8,219; the
WCXB pages, the extraction pages and the X fixtures would add to them), and
a 1,000,000 set whose neighbour structure follows the real one. See
benchmarks/index_and_retrieval.md, "Issue 49, point 1".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_index import PrecomputedEmbedder, percentiles
from bench_quality_cv import DATA, SPLIT  # the shared SciFact set (KB_SHARED_DIR), one copy of its place
from run_facts import run_facts

CURVE = (5, 10, 20, 40, 80, 160, 320)


def real_passages(count: int | None) -> list[dict]:
    """The first `count` passage rows of the SciFact corpus, as kb cuts them."""
    from kb.apps.eval_retrieval import document_chunks, load_beir

    corpus, _, _ = load_beir(DATA, SPLIT)
    rows: list[dict] = []
    for doc_id, doc in corpus.items():
        rows.extend(document_chunks(doc_id, doc))
        if count is not None and len(rows) >= count:
            break
    return rows[:count] if count is not None else rows


def real_queries(count: int) -> list[str]:
    from kb.apps.eval_retrieval import load_beir

    _, queries, _ = load_beir(DATA, SPLIT)
    return list(queries.values())[:count]


def embedder(cache: Path):
    from kb.index.embedder import Embedder

    return Embedder.from_settings(backend="local", cache_dir=str(cache))


def passage_vectors(rows: list[dict], cache: Path) -> np.ndarray:
    """The vectors of the passages, through kb's embedding cache in `cache`."""
    model = embedder(cache)
    texts = [r["text"] for r in rows]
    out = []
    started = time.perf_counter()
    for at in range(0, len(texts), 256):
        out.append(np.asarray(model.embed_documents(texts[at:at + 256]), dtype=np.float32))
        done = at + len(out[-1])
        print(f"embedded {done} of {len(texts)} passages ({time.perf_counter() - started:.0f} s, "
              f"{model.stats})", file=sys.stderr, flush=True)
    return np.concatenate(out)


def query_vectors(queries: list[str], cache: Path) -> np.ndarray:
    """The query vectors, kept in `cache` by the hash of the query texts and
    the model (kb's embedding cache holds passages only)."""
    model = embedder(cache)
    key = hashlib.sha256("\n".join([model.model_name, *queries]).encode()).hexdigest()[:16]
    path = cache / f"queries-{key}.npy"
    if path.is_file():
        return np.load(path)
    vectors = np.stack([np.asarray(model.embed_query(q), dtype=np.float32) for q in queries])
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def build(rows: list[dict], vectors: np.ndarray, folder: Path):
    """kb's index of these rows, with its vector index at any size."""
    from kb.index.client import ChunkIndex

    index = ChunkIndex(path=str(folder / "lancedb"), vector_index_min_rows=min(len(rows), 5000))
    by_text = {r["text"]: v for r, v in zip(rows, vectors)}
    fake = PrecomputedEmbedder(by_text)
    fake.model_name, fake.dim = "bench:real-vectors", vectors.shape[1]
    started = time.perf_counter()
    for at in range(0, len(rows), 5000):
        part = rows[at:at + 5000]
        index.replace_chunks(sorted({r["tweet_id"] for r in part}), [dict(r) for r in part], fake)
    index.maintain()
    print(f"{len(rows)} passages: index built in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return index


def top(table, vector: np.ndarray, k: int, probes: int | None, refine: int | None = None) -> list[int]:
    """Row ids of the k nearest: through the index (probes partitions) or,
    with probes None, exact (every vector, no index). refine: the best
    refine x k of the index's 8-bit distances, ordered by the stored vectors."""
    nearest = {"column": "vector", "q": vector, "k": k, "metric": "dot"}
    if probes is None:
        nearest["use_index"] = False
    else:
        nearest["minimum_nprobes"] = nearest["maximum_nprobes"] = probes
    if refine:
        nearest["refine_factor"] = refine
    result = table.to_table(columns=["_distance"], with_row_id=True, nearest=nearest,
                            disable_scoring_autoprojection=True)
    return result.column("_rowid").to_pylist()


def curve(index, queries: np.ndarray) -> dict:
    from kb.index.maintenance import vector_index_stats, vector_probes
    from kb.index.store import CHUNKS
    from kb.index.search import EXACT_REFINE

    table = index.dataset(CHUNKS)
    rows = table.count_rows()
    stats = vector_index_stats(table)
    partitions = sum(s["num_partitions"] for s in stats["indices"]) if stats else 0
    exact = [top(table, q, 100, None) for q in queries]
    kb_probes = min(vector_probes(rows), partitions)  # Lance scans at most every partition
    # Each point without refine, as kb's search scans fewer than every
    # partition; the last point as kb scans every partition: with refine
    # (kb.index.search._dense()), an exact search.
    points_wanted = [(p, None) for p in sorted({p for p in CURVE if p < partitions} | {kb_probes, partitions})]
    points_wanted.append((partitions, EXACT_REFINE))
    points = []
    for probes, refine in points_wanted:
        for q in queries[:5]:  # warm the caches
            top(table, q, 100, probes, refine)
        found10 = found100 = 0
        times = []
        cpu = time.process_time()
        for q, truth in zip(queries, exact):
            t = time.perf_counter()
            got = top(table, q, 100, probes, refine)
            times.append((time.perf_counter() - t) * 1000)
            found10 += len(set(got[:10]) & set(truth[:10]))
            found100 += len(set(got) & set(truth))
        point = {"probes": probes, "refine": refine, "recall_at_10": round(found10 / (10 * len(queries)), 4),
                 "recall_at_100": round(found100 / (100 * len(queries)), 4), **percentiles(times),
                 "cpu_ms_per_query": round((time.process_time() - cpu) * 1000 / len(queries), 2),
                 "kb_default": probes == kb_probes and (refine is not None) == (kb_probes == partitions)}
        points.append(point)
        print(json.dumps(point), file=sys.stderr, flush=True)
    return {"passages": rows, "partitions": partitions, "kb_probes": kb_probes, "curve": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=None, help="the first N passages (default: all 8,219)")
    parser.add_argument("--queries", type=int, default=100, help="train queries to measure with (at most 809)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kb-bench-recall",
                        help="kb's embedding cache and the query vectors (not in the repository)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    if args.passages is not None and args.passages < 100:
        parser.error(f"--passages {args.passages}: give 100 or more (an index needs rows for its partitions)")
    if not (DATA / "corpus.jsonl").is_file():
        parser.error(f"{DATA} holds no corpus.jsonl: this benchmark needs the shared SciFact set")
    before = run_facts()
    rows = real_passages(args.passages)
    vectors = passage_vectors(rows, args.cache)
    queries = query_vectors(real_queries(args.queries), args.cache)
    with tempfile.TemporaryDirectory(prefix="kb-recall-") as tmp:
        result = curve(build(rows, vectors, Path(tmp)), queries)
    after = run_facts()
    out = {"commit": before["commit"], "load_average_before": before["load_average"],
           "load_average_after": after["load_average"], "queries": len(queries), **result}
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
