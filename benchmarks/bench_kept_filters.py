"""The timed searches of bench_index.py (hybrid and its 7 filters) on an index
that `bench_index.py --keep DIR` built, without a write to it.

bench_index.py with --keep searches a kept index, but it first makes the
corpus again (about 5 minutes at 1,000,000 passages), counts the words of
every passage (about 2.5 minutes) and writes the two folders. This script
makes only the 200 queries and their vectors (the same draws as
make_corpus(), without the texts: about 1 minute at 1,000,000), keeps the
word counts in --cache, and reads the folders that the kept index holds.
So the code of two trees can be timed one after the other on one index.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_kept_filters.py \\
        --index /work/bench1m/1000000 --cache /tmp/kept-cache --out FILE [--sql]

--sql: the filters take Lance's SQL filter, as before issue 58 (no row
allowlist, no vector query without the filter). FILE holds the figures
and the top 10 (bookmark, score) of each search, to compare two runs
(--same-as FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_index import DIM, FILTERS, vocabulary  # noqa: E402
from kb.index import search as search_module  # noqa: E402
from kb.index.client import ChunkIndex  # noqa: E402
from kb.index.exact_words import lowered_words  # noqa: E402
from kb.index.store import CHUNKS  # noqa: E402


def queries_of(size: int, cache: Path) -> tuple[list[str], np.ndarray]:
    """make_corpus(size)'s queries and query vectors: the same draws of its
    generator, without the texts of the passages."""
    path = cache / f"queries-{size}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    rng = np.random.default_rng(7)
    vocab = vocabulary(30_000, rng)
    vectors = np.empty((size, DIM), dtype=np.float32)
    for at in range(0, size, 10_000):  # one draw in parts gives the same numbers
        count = min(10_000, size - at)
        vectors[at:at + count] = rng.standard_normal(count * DIM).reshape(count, DIM)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for _ in range(size):
        rng.random(int(rng.integers(40, 200)))
    queries = [" ".join(vocab[w] for w in rng.integers(50, 5000, size=int(rng.integers(2, 6)))) for _ in range(200)]
    picks = rng.integers(0, size, size=len(queries))
    noise = rng.standard_normal((len(queries), DIM)).astype(np.float32) * 0.05
    query_vectors = vectors[picks] + noise
    query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)
    path.write_bytes(pickle.dumps((queries, query_vectors)))
    return queries, query_vectors


# The word counts (WordCounts) keep the hash of each word, and Python gives
# str another hash in each process unless PYTHONHASHSEED is set: counts
# kept from an earlier process found no word (least_holders() gave 0), so
# each search looked up words that a server skips. main() runs the script
# with this seed, and the file of the counts holds it in its name.
HASH_SEED = "0"


def open_index(folder: Path, cache: Path) -> ChunkIndex:
    """The kept index, with its vector index in the cache and the word counts
    of a server (from --cache after the first run, made with HASH_SEED)."""
    index = ChunkIndex.from_settings(path=str(folder / "lancedb"), rows_dir=str(folder / "rows"))
    table = index.dataset(CHUNKS)
    search_module.prewarm_indexes(table)
    rows = index.passage_rows(table)
    assert os.environ.get("PYTHONHASHSEED") == HASH_SEED, "kept word counts need the same hash of str"
    # With the ASCII flags of the texts, which count_words() makes with the counts.
    counts = cache / f"word-counts-ascii-{folder.name}-{table.version}-hashseed{HASH_SEED}.pkl"
    if counts.exists():
        rows.word_counts, rows.ascii_rows = pickle.loads(counts.read_bytes())
        rows.words_of, rows.counting_started = lowered_words, True
    else:
        rows.count_words(lowered_words)
        counts.write_bytes(pickle.dumps((rows.word_counts, rows.ascii_rows)))
    assert not rows.uncounted()
    return index


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # the same hash of str in each run (open_index())
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="KEEP/SIZE of bench_index.py --keep")
    parser.add_argument("--cache", type=Path, required=True, help="a folder for the queries and the word counts")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sql", action="store_true", help="the SQL filter, as before issue 58")
    parser.add_argument("--same-as", type=Path, default=None, help="compare the top 10 lists with this run")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.sql:
        from kb.index import dense

        search_module.ROW_ALLOWLIST_MAX_ROWS = -1
        search_module.WIDE_SOURCE_ALLOWLIST = False
        dense.WIDE_MAX_OVERFETCH = 0
    queries, query_vectors = queries_of(int(args.index.name), args.cache)
    index = open_index(args.index, args.cache)
    pairs = list(zip(queries, query_vectors))
    figures: dict = {"load_average_before": os.getloadavg()}
    hits: dict = {}
    for name, arguments in (("hybrid", lambda i: {}),) + FILTERS:
        for i, (query, vector) in enumerate(pairs[:5]):  # warm the caches, as bench_index.py
            search_module.search(query, index=index, query_vector=vector, **arguments(i))
        times, tops = [], []
        cpu = time.process_time()
        for i, (query, vector) in enumerate(pairs):
            started = time.perf_counter()
            response = search_module.search(query, index=index, query_vector=vector, **arguments(i))
            times.append((time.perf_counter() - started) * 1000)
            tops.append([(h.tweet_id, h.score) for h in response.hits])
        cpu_ms = (time.process_time() - cpu) * 1000 / len(pairs)
        ordered = sorted(times)
        figures[name] = {"p50_ms": round(statistics.median(ordered), 2),
                         "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
                         "cpu_ms_per_query": round(cpu_ms, 2)}
        hits[name] = tops
        print(name, json.dumps(figures[name]), file=sys.stderr, flush=True)
    figures["load_average_after"] = os.getloadavg()
    if args.same_as:
        figures["same_as"] = {name: compare(lists, json.loads(args.same_as.read_text())["hits"][name])
                              for name, lists in hits.items()}
    args.out.write_text(json.dumps({"figures": figures, "hits": hits}) + "\n")
    print(json.dumps(figures, indent=1))


def compare(now: list, saved: list) -> dict:
    """Top 10 lists against a saved run: identical (bookmarks and scores),
    the same scores with equal scores in another order, or other."""
    kinds = {"identical": 0, "ties_in_another_order": 0, "other": 0}
    for a, b in zip(now, saved):
        a, b = [tuple(x) for x in a], [tuple(x) for x in b]
        if a == b:
            kinds["identical"] += 1
        elif [s for _, s in a] == [s for _, s in b]:
            kinds["ties_in_another_order"] += 1
        else:
            kinds["other"] += 1
    return kinds


if __name__ == "__main__":
    main()
