"""The folder filter of the search: time of one search with and without it.

    .venv/bin/python benchmarks/bench_folders.py [--passages 100000] [--folder-size 50 2000] [--queries 40]

A new KB_HOME in a temporary folder with N synthetic passages (the corpus of
bench_index.py, three passages per bookmark, random vectors recorded as the
hash embedder's: no model loads), and one bookmark folder of each size. The
filter becomes `tweet_id IN (...)` with one literal per bookmark of the
folder, as kb/index/search.py makes it. Each search is warm (the second and later
of the same process), in the hybrid mode and in bm25; the query vectors are
given, so the figures show the search alone. Figures go into
benchmarks/index_and_retrieval.md with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--folder-size", type=int, nargs="+", default=[50, 2000])
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()

    import numpy as np

    from bench_index import make_corpus
    from bench_serving import synthetic_home
    from kb.index.folders import folder_rows, replace_folders
    from kb.index.client import ChunkIndex
    from kb.index.search import search
    from kb.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "kb_home"
        os.environ.update(KB_HOME=str(home), KB_EMBED_BACKEND="hash", HF_HUB_OFFLINE="1")
        started = time.perf_counter()
        synthetic_home(args.passages, home)
        print(f"index of {args.passages} passages in {time.perf_counter() - started:.0f} s")
        index = ChunkIndex.from_settings(Settings(kb_home=home))
        bookmarks = args.passages // 3
        rng = np.random.default_rng(11)
        members = []
        for n, size in enumerate(args.folder_size):
            members += [(f"f{n}", str(t)) for t in rng.choice(bookmarks, size=size, replace=False)]
        replace_folders(index, folder_rows([(f"f{n}", f"size {size}") for n, size in enumerate(args.folder_size)],
                                           members))
        _, _, queries, query_vectors = make_corpus(min(args.passages, 3000))
        queries, query_vectors = queries[:args.queries], query_vectors[:args.queries]
        vectors = np.zeros((len(queries), 256), dtype=np.float32)
        vectors[:, :query_vectors.shape[1]] = query_vectors[:, :256]
        for mode in ("hybrid", "bm25"):
            for folder in [None] + [f"size {size}" for size in args.folder_size]:
                times = []
                for query, vector in zip(queries, vectors):
                    kwargs = {"query_vector": vector} if mode == "hybrid" else {}
                    begin = time.perf_counter()
                    search(query, limit=10, mode=mode, folder=folder, index=index, **kwargs)
                    times.append((time.perf_counter() - begin) * 1000)
                warm = times[1:]
                print(f"{mode:<7} folder {folder or 'none':<10} p50 {statistics.median(warm):6.1f} ms  "
                      f"p95 {sorted(warm)[int(0.95 * len(warm))]:6.1f} ms  (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
