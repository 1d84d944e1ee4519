"""Dense recall of kb's vector index on real text (issue 49, point 1).

bench_index.py measures the index on random vectors. Random vectors have no
neighbour structure, so their recall says little about real embeddings. This
benchmark uses real passages and real queries:

- passages: real text cut as kb cuts a document
  (benchmarks/real_passages.py: SciFact, the WCXB and extraction pages, the
  X fixtures, package READMEs, manual pages and docstrings; 104,732 in
  all). --passages N takes the first N.
- vectors: the local model of the settings (kb.index.embedder.Embedder,
  backend "local"), through kb's embedding cache in --cache. The first run
  embeds; a later run reads the cache. Keep --cache outside the repository.
- queries: SciFact train queries, WCXB page titles and first lines of
  docstrings (--queries of each kind), embedded as kb embeds a query.
  Their vectors are kept in --cache too.
- the index: kb's own (ChunkIndex.replace_chunks() and maintain(), so
  vector_index_config() and its partitions), also below
  kb_vector_index_min_rows, so that a small run has an index to measure;
  the passage rows and their vectors in mapped files, as `kb web` reads them.

For each number of partitions scanned (the curve: kb's vector_probes() and
a range around it, up to every partition) and each re-rank factor (0: the
order of the index's PQ distances; kb's VECTOR_REFINE: kb's search) it
gives recall@10 and recall@100 of the dense query against an exact search
of every vector (the share of the exact top k that the query finds), and
the query time (p50 / p95 wall, CPU per query).

--synthetic SIZE: a set of SIZE vectors whose neighbour structure follows
the real one (synthetic()); with --base N it is made from the first N real
passages only, so that its curve at the size of the real set can be
checked against the real curve (the check of --noise).

    KB_SHARED_DIR=/work/shared PYTHONPATH=$PWD:$PWD/benchmarks HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_recall.py \\
        --passages 110000 --queries 100 --cache ~/.cache/kb-bench-recall --out FILE
    ... --synthetic 1000000 --noise 0.3 --out FILE

Figures: benchmarks/index_and_retrieval.md, "Issue 49, third session".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_index import PrecomputedEmbedder, percentiles
from bench_quality_cv import DATA
import real_passages
from run_facts import run_facts

CURVE = (5, 10, 20, 40, 80, 160, 320)


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

    # rows_dir: the passage rows and their vectors in mapped files, as the
    # search service of `kb web` reads them (the re-rank reads the vectors there).
    index = ChunkIndex(path=str(folder / "lancedb"), vector_index_min_rows=min(len(rows), 5000),
                       rows_dir=str(folder / "rows"))
    by_text = {r["text"]: v for r, v in zip(rows, vectors)}
    fake = PrecomputedEmbedder(by_text)
    fake.model_name, fake.dim = "bench:real-vectors", vectors.shape[1]
    started = time.perf_counter()
    # Batches of about 50,000 rows that end at the end of a document: a
    # write replaces every passage of its documents.
    start = 0
    while start < len(rows):
        end = min(len(rows), start + 50_000)
        while end < len(rows) and rows[end]["tweet_id"] == rows[end - 1]["tweet_id"]:
            end += 1
        part = rows[start:end]
        index.replace_chunks(sorted({r["tweet_id"] for r in part}), [dict(r) for r in part], fake)
        start = end
    index.maintain()
    print(f"{len(rows)} passages: index built in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return index


def top(table, rows, vector: np.ndarray, k: int, probes: int | None, refine: int | None = None) -> list[int]:
    """Row ids of the k nearest: through the index (probes partitions) or,
    with probes None, exact (every vector, no index). refine: as kb's
    search (kb.index.dense._refined()): the best refine x k of the index's
    coarse distances, ordered by the stored vectors; without it, the order
    of the coarse distances."""
    from kb.index.dense import _nearest, _nearest_of

    if probes is None:
        nearest = {"column": "vector", "q": vector, "k": k, "metric": "dot", "use_index": False}
        result = table.to_table(columns=["_distance"], with_row_id=True, nearest=nearest,
                                disable_scoring_autoprojection=True)
        return result.column("_rowid").to_pylist()
    coarse = [row_id for row_id, _ in _nearest(table, vector, None, k * (refine or 1), probes)]
    if not refine:
        return coarse
    return [row_id for row_id, _ in _nearest_of(rows, vector, np.asarray(coarse, dtype=np.uint64), k)]


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int = 100) -> np.ndarray:
    """Row numbers (in `vectors`) of the exact k nearest (dot) of each
    query, by numpy in blocks."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for at in range(0, len(queries), 64):
        scores = queries[at:at + 64] @ vectors.T
        part = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.take_along_axis(scores, part, axis=1).argsort(axis=1)[:, ::-1]
        out[at:at + 64] = np.take_along_axis(part, order, axis=1)
    return out


def measure(table, rows, queries: np.ndarray, kinds: list[str], exact: np.ndarray, probes: int | None,
            refine: int | None, kb_default: bool = False) -> dict:
    """recall@10 and recall@100 (overall and per kind of query) and time of
    the index query at `probes` partitions."""
    for q in queries[:5]:  # warm the caches
        top(table, rows, q, 100, probes, refine)
    found10: dict[str, list[float]] = {}
    found100: dict[str, list[float]] = {}
    times = []
    cpu = time.process_time()
    for q, kind, truth in zip(queries, kinds, exact):
        t = time.perf_counter()
        got = top(table, rows, q, 100, probes, refine)
        times.append((time.perf_counter() - t) * 1000)
        found10.setdefault(kind, []).append(len(set(got[:10]) & set(truth[:10].tolist())) / 10)
        found100.setdefault(kind, []).append(len(set(got) & set(truth.tolist())) / 100)
    point = {"probes": probes, "refine": refine,
             "recall_at_10": round(float(np.mean([x for v in found10.values() for x in v])), 4),
             "recall_at_100": round(float(np.mean([x for v in found100.values() for x in v])), 4),
             "recall_at_10_by_kind": {k: round(float(np.mean(v)), 4) for k, v in found10.items()},
             **percentiles(times),
             "cpu_ms_per_query": round((time.process_time() - cpu) * 1000 / len(queries), 2),
             "kb_default": kb_default}
    print(json.dumps(point), file=sys.stderr, flush=True)
    return point


def curve(index, rows_written: list[dict], vectors: np.ndarray, queries: np.ndarray, kinds: list[str], probes_wanted=None,
          refines=None) -> dict:
    from kb.index.maintenance import vector_index_stats, vector_probes
    from kb.index.store import CHUNKS
    from kb.index.dense import VECTOR_REFINE

    table = index.dataset(CHUNKS)
    rows = index.passage_rows(table)
    assert rows.keeps_vectors, "the rows files keep no vectors: the re-rank would read them through Lance"
    count = table.count_rows()
    stats = vector_index_stats(table)
    partitions = sum(s["num_partitions"] for s in stats["indices"]) if stats else 0
    # Lance's row ids of the rows: a row id holds the data file of the row,
    # so it is the row number only in a table of one file.
    written = table.to_table(columns=["chunk_id"], with_row_id=True)
    by_chunk = dict(zip(written.column("chunk_id").to_pylist(), written.column("_rowid").to_pylist()))
    row_ids = np.array([by_chunk[r["chunk_id"]] for r in rows_written], dtype=np.uint64)
    del by_chunk, written
    exact = row_ids[exact_top(vectors, queries)]
    kb_probes = min(vector_probes(count), partitions)  # Lance scans at most every partition
    # Each number of partitions, with each re-rank factor (0: the order of
    # the index's coarse distances); kb's search is kb_probes with VECTOR_REFINE.
    wanted = sorted({p for p in (probes_wanted or CURVE) if p < partitions} | {kb_probes, partitions})
    points = [measure(table, rows, queries, kinds, exact, probes, refine,
                      kb_default=probes == kb_probes and refine == VECTOR_REFINE)
              for probes in wanted for refine in sorted(set(refines or (0, VECTOR_REFINE)))]
    return {"passages": count, "partitions": partitions, "kb_probes": kb_probes, "kb_refine": VECTOR_REFINE,
            "curve": points}


def synthetic(vectors: np.ndarray, size: int, noise: float, seed: int = 49) -> np.ndarray:
    """`size` vectors whose neighbour structure follows the real ones: each
    real vector gives size / len(vectors) copies, each moved by Gaussian
    noise of `noise` per unit length (then made unit length again). The
    check that it follows the real set: the curve of a synthetic set made
    this way from a tenth of the real vectors at the size of the real set
    (--synthetic with --base)."""
    rng = np.random.default_rng(seed)
    copies = -(-size // len(vectors))
    out = np.empty((size, vectors.shape[1]), dtype=np.float32)
    for at in range(0, size, 50_000):
        idx = np.arange(at, min(size, at + 50_000))
        block = vectors[idx // copies] + rng.standard_normal((len(idx), vectors.shape[1])).astype(np.float32) * (
            noise / np.sqrt(vectors.shape[1]))
        out[at:at + len(idx)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def synthetic_rows(count: int, rows: list[dict]) -> list[dict]:
    """Rows for synthetic vectors: the first 12 words of the real row the
    vector comes from, made unique (the bench embedder maps a text to its
    vector). Short texts: this benchmark measures the dense query, and the
    full-text index of 1,000,000 whole passages takes long to build."""
    copies = -(-count // len(rows))
    return [{**rows[i // copies], "chunk_id": f"s{i}", "tweet_id": f"s{i // 3}", "position": i % 3,
             "text": f"s{i} " + " ".join(rows[i // copies]["text"].split()[:12])} for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=8219,
                        help="the first N real passages (benchmarks/real_passages.py: SciFact first, 8,219)")
    parser.add_argument("--queries", type=int, default=100,
                        help="queries of each kind: SciFact train queries, WCXB titles, docstring first lines")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kb-bench-recall",
                        help="kb's embedding cache, the passages and the query vectors (not in the repository)")
    parser.add_argument("--embed-only", action="store_true", help="embed the passages into --cache, then stop")
    parser.add_argument("--base", type=int, default=None,
                        help="with --synthetic: make the synthetic set from BASE real passages only (spread evenly)")
    parser.add_argument("--synthetic", type=int, default=None,
                        help="measure a synthetic set of this many vectors made from the real ones (see synthetic())")
    parser.add_argument("--noise", type=float, default=0.3, help="the noise of --synthetic, per unit length")
    parser.add_argument("--probes", type=int, nargs="*", default=None, help="the points of the curve (partitions)")
    parser.add_argument("--refine", type=int, nargs="*", default=None,
                        help="re-rank factors of the curve (0: none; default 0 and kb's VECTOR_REFINE)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    if args.passages < 100:
        parser.error(f"--passages {args.passages}: give 100 or more (an index needs rows for its partitions)")
    if not (DATA / "corpus.jsonl").is_file():
        parser.error(f"{DATA} holds no corpus.jsonl: this benchmark needs the shared SciFact set")
    before = run_facts()
    rows = real_passages.passages(args.passages, args.cache)
    vectors = passage_vectors(rows, args.cache)
    if args.embed_only:
        return
    asked = real_passages.queries(args.queries, rows)
    queries = query_vectors([q for _, q in asked], args.cache)
    kinds = [k for k, _ in asked]
    if args.synthetic:
        # The base: real passages spread evenly over the set (every kind of
        # text, not the first kinds only).
        picked = np.linspace(0, len(vectors) - 1, args.base).astype(int) if args.base else np.arange(len(vectors))
        vectors = synthetic(vectors[picked], args.synthetic, args.noise)
        rows = synthetic_rows(args.synthetic, [rows[i] for i in picked])
    with tempfile.TemporaryDirectory(prefix="kb-recall-") as tmp:
        result = curve(build(rows, vectors, Path(tmp)), rows, vectors, queries, kinds, args.probes, args.refine)
    after = run_facts()
    out = {"commit": before["commit"], "load_average_before": before["load_average"],
           "load_average_after": after["load_average"], "real_passages": args.passages,
           "synthetic": args.synthetic, "base": args.base, "noise": args.noise if args.synthetic else None,
           "queries": len(queries), "query_kinds": sorted(set(kinds)), **result}
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
