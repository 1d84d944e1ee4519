"""Deep search (search(..., rerank=True)) on the SciFact train split, through
kb's own code, with the weight chosen by 5-fold cross-validation.

For each train query, with the query vector given (as evaluate() does):
1. search(limit=100): the hybrid list of today;
2. search(limit=100, fusion="rrf"): plain reciprocal rank fusion, the floor
   that no fold may fall below (issue 14, goal 4);
3. search(limit=100, rerank=True): the deep search, timed. It gives the
   cross-encoder score of each of its first RERANK_TOP hits.

nDCG@10 of each list on all queries. Then the cross-validation: on four
folds, choose the weight of kb.index.rerank.new_order() (0.1 to 1.0) that gives the
best mean; measure it on the fifth. The replay calls kb.index.rerank.new_order()
with the first hits of list 1 and the scores of list 3, so it uses the
product's rule; at the product's weight it must give list 3 exactly (the
script checks this for every query). The folds are those of
bench_quality_cv.py (seed 14).

The index is built once in --workdir with kb.apps.eval_retrieval's code; the
embedding cache (--cache) makes a second build embed nothing. Results per
query go to --out as JSON lines, so a stopped run goes on where it stopped.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_rerank.py \\
        --cache /tmp/kbq3/home/lancedb --workdir /tmp/kb-rerank --out /tmp/kb-rerank/queries.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quality_cv import DATA, SPLIT, folds  # noqa: E402  (the same folds, one copy)

WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def build(workdir: Path, cache: str | None):
    from kb.apps.eval_retrieval import build_index, load_beir
    from kb.index.embedder import Embedder
    from kb.index.client import ChunkIndex

    corpus, queries, qrels = load_beir(DATA, SPLIT)
    embedder = Embedder.from_settings(backend="local", **({"cache_dir": cache} if cache else {}))
    index = ChunkIndex.from_settings(path=str(workdir / "index"))
    done = workdir / "index.done"
    if not done.exists():
        started = time.time()
        index.rebuild()
        build_index(corpus, index, embedder)
        done.write_text("ok")
        print(f"index built in {time.time() - started:.0f} s", flush=True)
    return index, embedder, queries, qrels


def collect(out: Path, index, embedder, queries: dict, limit: int | None) -> dict[str, dict]:
    from kb.index.search import search

    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done[row["qid"]] = row
    todo = [qid for qid in queries if qid not in done][: None if limit is None else max(0, limit - len(done))]
    with out.open("a") as fh:
        for number, qid in enumerate(todo, 1):
            text = queries[qid]
            vector = embedder.embed_query(text)
            base = search(text, limit=100, index=index, query_vector=vector)
            floor = search(text, limit=100, index=index, query_vector=vector, fusion="rrf")
            started = time.perf_counter()
            deep = search(text, limit=100, index=index, query_vector=vector, rerank=True)
            seconds = time.perf_counter() - started
            row = {"qid": qid, "seconds": seconds,
                   "base": [[h.tweet_id, h.score, h.exact_match] for h in base.hits],
                   "floor": [h.tweet_id for h in floor.hits],
                   "deep": [[h.tweet_id, h.rerank_score] for h in deep.hits]}
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            done[qid] = row
            if number % 25 == 0 or number == len(todo):
                print(f"{len(done)} of {len(queries)} queries; deep search {seconds:.2f} s; "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
    return done


def replay(row: dict, query: str, weight: float, top: int | None = None) -> list[str]:
    """The deep order at another weight: kb.index.rerank.new_order() on the first
    hits of the hybrid list, with the cross-encoder scores of the deep search,
    and the hits kept in place as search() keeps them. top: sort only the
    first `top` hits again (at most RERANK_TOP: the run scored those)."""
    from kb.index.rerank import RERANK_TOP, new_order
    from kb.index.deep_search import exact_words_lead

    base = row["base"]
    model = {tweet_id: score for tweet_id, score in row["deep"] if score is not None}
    top = RERANK_TOP if top is None else min(top, RERANK_TOP)
    head = base[:top]
    keep = exact_words_lead(query)
    order = new_order([model[t] for t, _, _ in head], [s for _, s, _ in head], [keep and exact for _, _, exact in head],
                      weight)
    return [head[i][0] for i in order] + [t for t, _, _ in base[top:]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="folder for the index (kept for a second run)")
    parser.add_argument("--cache", help="embedding cache folder (default: the embedder's)")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per query (a second run goes on)")
    parser.add_argument("--max-queries", type=int, help="stop after this many queries (a quick check)")
    parser.add_argument("--tops", type=int, nargs="*", default=[],
                        help="also replay with only the first N hits sorted again (N below RERANK_TOP): the "
                             "cross-validation chooses the weight for each N")
    args = parser.parse_args(argv)
    from kb.apps.eval_retrieval import ndcg_at
    from kb.index.rerank import RERANK_TOP, RERANK_WEIGHT

    args.workdir.mkdir(parents=True, exist_ok=True)
    index, embedder, queries, qrels = build(args.workdir, args.cache)
    rows = collect(args.out, index, embedder, queries, args.max_queries)
    qids = [qid for qid in queries if qid in rows]
    # The replay at the product's weight must give the deep search's first
    # hits. Past them, both keep the hybrid order, where two searches can
    # order hits of equal score differently, so the rest is not compared.
    differ = [qid for qid in qids if replay(rows[qid], queries[qid], RERANK_WEIGHT)[:RERANK_TOP]
              != [t for t, _ in rows[qid]["deep"]][:RERANK_TOP]]
    print(f"Replay at weight {RERANK_WEIGHT} against search(rerank=True), first {RERANK_TOP} hits: "
          f"{len(qids) - len(differ)} of {len(qids)} queries the same" + (f"; differ: {differ[:10]}" if differ else ""))

    def scores(ranked_of) -> np.ndarray:
        return np.array([ndcg_at(ranked_of(rows[qid]), qrels[qid], 10) for qid in qids])

    hybrid = scores(lambda r: [t for t, _, _ in r["base"]])
    floor = scores(lambda r: r["floor"])
    deep = scores(lambda r: [t for t, _ in r["deep"]])
    grid = {w: scores(lambda r, w=w: replay(r, queries[r["qid"]], w)) for w in WEIGHTS}
    seconds = sorted(rows[qid]["seconds"] for qid in qids)
    print(f"\n{len(qids)} queries. nDCG@10 on all (not held out): hybrid {hybrid.mean():.4f}, plain RRF "
          f"{floor.mean():.4f}, deep search (weight {RERANK_WEIGHT}) {deep.mean():.4f}")
    print(f"Deep search time per query: p50 {statistics.median(seconds):.2f} s, "
          f"p95 {seconds[min(len(seconds) - 1, int(0.95 * len(seconds)))]:.2f} s")
    print("Weights on all queries: " + ", ".join(f"{w}: {grid[w].mean():.4f}" for w in WEIGHTS))
    print("\n| fold | weight chosen on the other 4 folds | held-out nDCG@10 | plain RRF | difference | hybrid |")
    print("|---|---|---|---|---|---|")
    held, margins = [], []
    for number, test in enumerate(folds(len(qids)), 1):
        train = sorted(set(range(len(qids))) - set(test))
        weight = max(WEIGHTS, key=lambda w: grid[w][train].mean())
        held.append(grid[weight][test].mean())
        margins.append(held[-1] - floor[test].mean())
        print(f"| {number} | {weight} | {held[-1]:.4f} | {floor[test].mean():.4f} | {margins[-1]:+.4f} | "
              f"{hybrid[test].mean():.4f} |")
    print(f"| mean (sd) | | {np.mean(held):.4f} ({np.std(held, ddof=1):.4f}) | {floor.mean():.4f} | "
          f"lowest {min(margins):+.4f} | {hybrid.mean():.4f} |")
    # Fewer hits for the cross-encoder: its time grows with the number of
    # windows it reads. The same folds; the weight chosen on 4 folds per N.
    for top in args.tops:
        grid_top = {w: scores(lambda r, w=w: replay(r, queries[r["qid"]], w, top)) for w in WEIGHTS}
        held_top = []
        for test in folds(len(qids)):
            train = sorted(set(range(len(qids))) - set(test))
            weight = max(WEIGHTS, key=lambda w: grid_top[w][train].mean())
            held_top.append(grid_top[weight][test].mean())
        print(f"first {top} hits sorted again: held-out nDCG@10 {np.mean(held_top):.4f} "
              f"({np.std(held_top, ddof=1):.4f}); per fold " + ", ".join(f"{h:.4f}" for h in held_top)
              + f"; at weight {RERANK_WEIGHT} on all: {grid_top[RERANK_WEIGHT].mean():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
