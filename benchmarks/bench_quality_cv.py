"""Hybrid fusion on the SciFact train split: 5-fold cross-validation.

Issue 14, goal 4: nDCG@10 at least 0.745 with the bundled local model, and
no weight tuned on the split alone. This script chooses each weight or rule
on four folds of the train queries and measures it on the fifth.

Steps (each result is cached in --cache, so a second run is fast):

1. The index: kb's own code (chunk_text, Embedder(backend="local"),
   ChunkIndex.replace_chunks, maintain), as kb.apps.eval_retrieval does.
2. The candidates of each query, through kb.search's own functions
   (_dense, _bm25, _rare_word_passages, _phrases, _holds_phrases), at depth
   300. The replay uses the first 200 of each list, as search(limit=100).
3. Data for the leads that need more than the two lists:
   - a BM25 list over whole documents (a full-text-only LanceDB table of
     the corpus, with kb's fts_config());
   - RM3-style expansion lists: a second full-text query with the top terms
     of the first k passages (of the BM25 list or of the fused list);
   - the share of the query words (idf-weighted) that a passage holds.
4. The fusion is replayed offline: min-max per list, a weighted sum, the
   exact-phrase and rare-word rules, one passage per document. The replay of
   the default gives the same nDCG@10 as evaluate() (0.7347).
5. Cross-validation: queries shuffled with seed 14, 5 folds. For each
   family of settings, the best setting on 4 folds is scored on the fifth.
   Plain reciprocal rank fusion (k=60, no rules) is the floor per fold.

The final figure of a change must come from evaluate() through search():
this script only chooses.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_quality_cv.py

It reads ../shared/eval/scifact next to the repository (or KB_SHARED_DIR).
Without it, it exits with status 2 and says why. The first run embeds the
corpus (8,219 passages; 40 minutes on the 2 loaded cores of the development
machine, a few minutes on a quiet one).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import os
import pickle
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("KB_SHARED_DIR", REPO.parent / "shared"))
DATA = SHARED / "eval" / "scifact"
SPLIT = "train"
COLLECT_DEPTH = 300
DEPTH = 200  # search(limit=100): depth = min(MAX_DEPTH, max(MIN_DEPTH, 2 * 100))
SEED = 14
FOLDS = 5
RM3_SETTINGS = [(src, k, m) for src in ("bm25", "hybrid") for k in (3, 10) for m in (10, 25)]


# --- collection (kb's own code) ---------------------------------------------
def collect(cache: Path) -> dict:
    path = cache / f"cands200_{COLLECT_DEPTH}.pkl"
    if path.exists():
        return pickle.load(path.open("rb"))
    import kb.search as S
    from kb.apps.eval_retrieval import build_index, load_beir
    from kb.embedder import Embedder
    from kb.lance_index import CHUNKS, ChunkIndex, vector_probes

    corpus, queries, qrels = load_beir(DATA, SPLIT)
    embedder = Embedder.from_settings(backend="local", cache_dir=str(cache / "home" / "lancedb"))
    index_dir = cache / "index200"
    index = ChunkIndex.from_settings(path=str(index_dir))
    if not (index_dir / "done").exists():
        started = time.time()
        index.rebuild()
        build_index(corpus, index, embedder)
        (index_dir / "done").write_text("ok")
        print(f"index built in {time.time() - started:.0f} s", flush=True)
    table = index.snapshot(CHUNKS)
    arrow = (table.search().select(["chunk_id", "tweet_id", "position", "text", "vector"]).with_row_id(True)
             .limit(None).to_arrow().to_pydict())
    passages = {rid: {"chunk_id": c, "doc": t, "pos": p, "text": x} for rid, c, t, p, x in
                zip(arrow["_rowid"], arrow["chunk_id"], arrow["tweet_id"], arrow["position"], arrow["text"])}
    rows = table.count_rows()
    out = {}
    for qid, text in queries.items():
        text = " ".join(text.split())
        vector = embedder.embed_query(text)
        dense = S._dense(table, vector, None, COLLECT_DEPTH, vector_probes(rows))
        lexical = S._bm25(table, text, None, COLLECT_DEPTH)
        cands: dict = {}
        for rid, distance in dense:
            cands.setdefault(rid, S._Candidate(rid)).dense = 1 - distance
        for rid, score in lexical:
            cands.setdefault(rid, S._Candidate(rid)).bm25 = score
        rare = S._rare_word_passages(table, rows, text, None, lexical, cands, None)
        phrases = S._phrases(text)
        exact = {rid for rid in cands if phrases and S._holds_phrases(passages[rid]["text"], phrases)}
        out[qid] = {"text": text, "vec": vector, "dense": dense, "bm25": lexical, "rare": rare, "exact": exact}
    data = {"passages": passages, "vec": np.array(arrow["vector"], dtype=np.float32),
            "rowids": np.array(arrow["_rowid"]), "queries": out, "qrels": {q: qrels[q] for q in queries},
            "qids": list(queries)}
    pickle.dump(data, path.open("wb"))
    return data


def document_bm25(cache: Path) -> dict:
    """BM25 over whole documents (title and abstract in one row)."""
    path = cache / "docbm25.pkl"
    if path.exists():
        return pickle.load(path.open("rb"))
    import lancedb
    import pyarrow as pa

    from kb.apps.eval_retrieval import load_beir
    from kb.lance_index import fts_config

    corpus, queries, _ = load_beir(DATA, SPLIT)
    ids = list(corpus)
    texts = [f"{corpus[d].get('title', '').strip()}\n\n{corpus[d].get('text', '').strip()}".strip() for d in ids]
    table = lancedb.connect(str(cache / "docdb")).create_table("docs", pa.table({"doc": ids, "text": texts}),
                                                               mode="overwrite")
    table.create_index("text", config=fts_config(), replace=True)
    out = {}
    for qid, text in queries.items():
        result = (table.search(" ".join(text.split()), query_type="fts", fts_columns="text")
                  .select(["doc", "_score"]).limit(COLLECT_DEPTH).to_arrow())
        out[qid] = list(zip(result.column("doc").to_pylist(), result.column("_score").to_pylist()))
    pickle.dump(out, path.open("wb"))
    return out


def content_tokens(text: str, stop: frozenset) -> list[str]:
    return [t for t in re.findall(r"\w+", text.lower()) if t not in stop and len(t) > 2 and not t.isdigit()]


def expansion_lists(cache: Path, data: dict, queries: list) -> dict:
    """RM3-style second full-text query per query and setting (source, k, m):
    the m terms with the highest sum over the first k passages of
    weight(passage) * tf / length * idf, each term boosted by its share."""
    path = cache / "rm3.pkl"
    if path.exists():
        return pickle.load(path.open("rb"))
    import kb.search as S
    from kb.lance_index import CHUNKS, ChunkIndex
    from lancedb.query import BooleanQuery, MatchQuery, Occur

    stop = S.STOP_WORDS | S.FTS_STOP_WORDS
    tokens = {rid: content_tokens(p["text"], stop) for rid, p in data["passages"].items()}
    df = collections.Counter()
    for words in tokens.values():
        df.update(set(words))
    n = len(tokens)
    table = ChunkIndex.from_settings(path=str(cache / "index200")).snapshot(CHUNKS)
    out = {}
    for q in queries:
        query_words = set(re.findall(r"\w+", q.text.lower()))
        lists = {}
        for src, k, m in RM3_SETTINGS:
            scores = np.nan_to_num(q.bm25, nan=-1.0) if src == "bm25" else convex(q)
            top = [i for i in np.argsort(-scores)[:k] if scores[i] > 0]
            if not top:
                continue
            weights = scores[top] / scores[top].sum()
            terms = collections.Counter()
            for weight, i in zip(weights, top):
                words = tokens[q.ids[i]]
                for term, count in collections.Counter(words).items():
                    if term not in query_words and df[term] >= 2:
                        terms[term] += weight * count / len(words) * math.log(n / df[term])
            chosen = terms.most_common(m)
            if not chosen:
                continue
            top_weight = chosen[0][1]
            query = BooleanQuery([(Occur.SHOULD, MatchQuery(t, "text", boost=float(v / top_weight))) for t, v in chosen])
            result = table.search(query, query_type="fts").select([S.ROW_ID, "_score"]).limit(COLLECT_DEPTH).to_arrow()
            lists[(src, k, m)] = list(zip(result.column(S.ROW_ID).to_pylist(), result.column("_score").to_pylist()))
        out[q.qid] = lists
    pickle.dump(out, path.open("wb"))
    return out


# --- replay ------------------------------------------------------------------
class Query:
    """The candidates of one query as arrays (NaN: the list lacks it)."""


def prepare(data: dict, doc_lists: dict) -> list[Query]:
    import kb.search as S

    passages = data["passages"]
    stop = S.STOP_WORDS | S.FTS_STOP_WORDS
    words_of = {rid: {t[:6] for t in content_tokens(p["text"], stop)} for rid, p in passages.items()}
    df = collections.Counter()
    for words in words_of.values():
        df.update(words)
    n = len(passages)
    queries = []
    for qid in data["qids"]:
        x = data["queries"][qid]
        q = Query()
        q.qid, q.text, q.judged = qid, x["text"], data["qrels"][qid]
        dense, lexical = x["dense"][:DEPTH], x["bm25"][:DEPTH]
        rare = x["rare"] or set()
        q.ids = list(dict.fromkeys([rid for rid, _ in dense + lexical] + sorted(rare)))
        slot = {rid: i for i, rid in enumerate(q.ids)}
        q.dense, q.bm25 = np.full(len(q.ids), np.nan), np.full(len(q.ids), np.nan)
        q.dense_rank, q.bm25_rank = np.full(len(q.ids), np.nan), np.full(len(q.ids), np.nan)
        for rank, (rid, distance) in enumerate(dense):
            q.dense[slot[rid]], q.dense_rank[slot[rid]] = 1 - distance, rank
        for rank, (rid, score) in enumerate(lexical):
            q.bm25[slot[rid]], q.bm25_rank[slot[rid]] = score, rank
        q.doc = [passages[rid]["doc"] for rid in q.ids]
        q.exact = np.array([rid in x["exact"] for rid in q.ids])
        q.rare = np.array([rid in rare for rid in q.ids])
        q.keyword = len(S._content_words(q.text)) <= S.KEYWORD_QUERY_WORDS
        by_doc = dict(doc_lists[qid][:DEPTH])
        q.doc_bm25 = np.array([by_doc.get(d, np.nan) for d in q.doc])
        # idf-weighted share of the query words (6-letter prefixes) that a passage holds
        words = list(dict.fromkeys(t[:6] for t in content_tokens(q.text, stop)))
        idf = np.array([math.log(1 + n / (1 + df[w])) for w in words])
        held = np.array([[w in words_of[rid] for w in words] for rid in q.ids], dtype=float)
        q.coverage = held @ idf / idf.sum() if words else np.zeros(len(q.ids))
        q.both = (~np.isnan(q.dense) & ~np.isnan(q.bm25)).astype(float)
        q.norm_dense, q.norm_bm25, q.norm_doc = min_max(q.dense), min_max(q.bm25), min_max(q.doc_bm25)
        queries.append(q)
    return queries


def min_max(x: np.ndarray) -> np.ndarray:
    """As kb.search._min_max: the list's best is 1, its worst 0, absent 0."""
    out = np.zeros(len(x))
    present = ~np.isnan(x)
    if present.any():
        low, high = x[present].min(), x[present].max()
        out[present] = (x[present] - low) / ((high - low) or 1.0)
    return out


def convex(q: Query, w: float = 0.5) -> np.ndarray:
    return w * q.norm_dense + (1 - w) * q.norm_bm25


def peak_weighted(q: Query, top: int, alpha: float) -> np.ndarray:
    """Dense weight p_d^alpha / (p_d^alpha + p_b^alpha), where p = 1 - the
    mean min-max score of the list's first `top` entries: a list whose best
    stands far above the rest weighs more. alpha 0: the default."""
    def peak(scores: np.ndarray, present: np.ndarray) -> float:
        if not present.any():
            return 1e-6
        return max(1e-6, 1.0 - float(np.sort(scores[present])[::-1][:top].mean()))
    p_dense, p_bm25 = peak(q.norm_dense, ~np.isnan(q.dense)), peak(q.norm_bm25, ~np.isnan(q.bm25))
    w = p_dense ** alpha / (p_dense ** alpha + p_bm25 ** alpha)
    return w * q.norm_dense + (1 - w) * q.norm_bm25


def rrf(q: Query, k: int = 60) -> np.ndarray:
    score = np.zeros(len(q.ids))
    for ranks in (q.dense_rank, q.bm25_rank):
        present = ~np.isnan(ranks)
        score[present] += 1.0 / (k + ranks[present] + 1)
    return score


def ranking(q: Query, score: np.ndarray, rules: bool = True, limit: int = 100, extra_docs=()) -> list[str]:
    """Document ids in the order of search(): the exact-phrase and rare-word
    rules, one passage per document, the rare-word slot."""
    import kb.search as S

    docs = list(q.doc) + list(extra_docs)
    exact = np.concatenate([q.exact, np.zeros(len(extra_docs), bool)])
    rare = np.concatenate([q.rare, np.zeros(len(extra_docs), bool)])
    idx = range(len(docs))
    if not rules:
        ranked = sorted(idx, key=lambda i: score[i], reverse=True)
    elif q.keyword:
        ranked = sorted(idx, key=lambda i: (exact[i], rare[i], score[i]), reverse=True)
    else:
        ranked = sorted(idx, key=lambda i: (exact[i], score[i]), reverse=True)
    chosen, seen = [], set()
    for i in ranked:
        if docs[i] not in seen:
            seen.add(docs[i])
            chosen.append(i)
            if len(chosen) == limit:
                break
    if rules and not q.keyword:
        best = next((i for i in ranked if rare[i]), None)
        if best is not None:
            at = next((j for j, i in enumerate(chosen) if docs[i] == docs[best]), None)
            if at is None or at >= S.RARE_SLOT:
                rest = [i for i in chosen if docs[i] != docs[best]]
                slot = min(S.RARE_SLOT - 1, len(rest))
                chosen = (rest[:slot] + [best] + rest[slot:])[:limit]
    return [docs[i] for i in chosen]


def ndcg(ranked: list[str], judged: dict[str, int], k: int = 10) -> float:
    from kb.apps.eval_retrieval import ndcg_at

    return ndcg_at(ranked, judged, k)


def per_query(queries: list[Query], score_fn, rules: bool = True) -> np.ndarray:
    return np.array([ndcg(ranking(q, score_fn(q), rules), q.judged) for q in queries])


def rm3_per_query(queries: list[Query], data: dict, lists: dict, key, beta: float, w: float = 0.5) -> np.ndarray:
    """BM25 side = (1 - beta) * first list + beta * expansion list (both
    min-max); passages that only the expansion list holds join."""
    passages = data["passages"]
    out = []
    for q in queries:
        expansion = dict(lists[q.qid].get(key, [])[:DEPTH])
        slot = set(q.ids)
        new = [rid for rid in expansion if rid not in slot]
        ids = q.ids + new
        pad = np.full(len(new), np.nan)
        dense, bm25 = np.concatenate([q.dense, pad]), np.concatenate([q.bm25, pad])
        exp = np.array([expansion.get(rid, np.nan) for rid in ids])
        score = w * min_max(dense) + (1 - w) * ((1 - beta) * min_max(bm25) + beta * min_max(exp))
        out.append(ndcg(ranking(q, score, extra_docs=[passages[rid]["doc"] for rid in new]), q.judged))
    return np.array(out)


# --- cross-validation --------------------------------------------------------
def folds(n: int) -> list[list[int]]:
    order = list(range(n))
    random.Random(SEED).shuffle(order)
    return [sorted(order[i::FOLDS]) for i in range(FOLDS)]


def cross_validate(title: str, settings: dict[str, np.ndarray], floor: np.ndarray) -> dict:
    names = list(settings)
    matrix = np.stack([settings[name] for name in names])
    parts = folds(matrix.shape[1])
    print(f"\n#### {title} ({len(names)} settings)\n")
    print("| fold | chosen on the other 4 folds | held-out nDCG@10 | plain RRF | difference |")
    print("|---|---|---|---|---|")
    held, rrf_held = [], []
    for number, test in enumerate(parts, 1):
        train = sorted(set(range(matrix.shape[1])) - set(test))
        best = int(np.argmax(matrix[:, train].mean(axis=1)))
        held.append(matrix[best, test].mean())
        rrf_held.append(floor[test].mean())
        print(f"| {number} | {names[best]} | {held[-1]:.4f} | {rrf_held[-1]:.4f} | {held[-1] - rrf_held[-1]:+.4f} |")
    held, rrf_held = np.array(held), np.array(rrf_held)
    print(f"| mean (sd) | | {held.mean():.4f} ({held.std(ddof=1):.4f}) | {rrf_held.mean():.4f} | "
          f"{(held - rrf_held).mean():+.4f} (lowest {(held - rrf_held).min():+.4f}) |")
    best_all = max(names, key=lambda name: settings[name].mean())
    print(f"\nBest on all {matrix.shape[1]} queries (not a held-out figure): {best_all} "
          f"{settings[best_all].mean():.4f}")
    return {"mean": held.mean(), "sd": held.std(ddof=1), "lowest_margin": (held - rrf_held).min()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default="/tmp/kb-quality-cv", help="folder for the index and the lists")
    parser.add_argument("--no-rm3", action="store_true", help="skip the expansion lists (a full-text query each)")
    args = parser.parse_args(argv)
    if not (DATA / "corpus.jsonl").is_file():
        print(f"{DATA} is missing: the SciFact data lives in ../shared/eval/scifact next to the repository "
              f"(or set KB_SHARED_DIR). Nothing measured.")
        return 2
    sys.path.insert(0, str(REPO))
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    data = collect(cache)
    queries = prepare(data, document_bm25(cache))
    print(f"{len(queries)} queries, {len(data['passages'])} passages")

    floor = per_query(queries, rrf, rules=False)
    default = per_query(queries, convex)
    print(f"plain RRF {floor.mean():.4f}; RRF with the rules {per_query(queries, rrf).mean():.4f}; "
          f"default (w 0.5, min-max, rules) {default.mean():.4f}; "
          f"default without the rules {per_query(queries, convex, rules=False).mean():.4f}")

    cross_validate("The default, nothing chosen (w 0.5, min-max, rules)", {"default": default}, floor)

    weights = (0.4, 0.45, 0.5, 0.55, 0.6)
    fusion = {}
    for w, bonus in itertools.product(weights, (0.0, 0.02, 0.05)):
        fusion[f"w {w}, both {bonus}"] = per_query(
            queries, lambda q, w=w, bonus=bonus: convex(q, w) + bonus * q.both)
    cross_validate("Weights and a bonus for a passage in both lists (no new data)", fusion, floor)

    peaked = {}
    for top, alpha in itertools.product((10, 20), (0.0, 0.5, 1.0)):
        peaked[f"peak of the first {top}, alpha {alpha}"] = per_query(
            queries, lambda q, top=top, alpha=alpha: peak_weighted(q, top, alpha))
    cross_validate("A weight per query: the more peaked list weighs more (no new data)", peaked, floor)

    coverage = dict(fusion)
    for w, gamma in itertools.product(weights, (0.05, 0.1, 0.2)):
        coverage[f"w {w}, coverage {gamma}"] = per_query(
            queries, lambda q, w=w, gamma=gamma: convex(q, w) + gamma * q.coverage)
    cross_validate("Same, or + gamma x idf-weighted share of the query words (needs the text of each candidate)",
                   coverage, floor)

    document = dict(fusion)
    for w, share, bonus in itertools.product(weights, (0.25, 0.5, 0.75), (0.0, 0.02, 0.05)):
        document[f"w {w}, document BM25 {share}, both {bonus}"] = per_query(
            queries, lambda q, w=w, share=share, bonus=bonus:
            w * q.norm_dense + (1 - w) * ((1 - share) * q.norm_bm25 + share * q.norm_doc) + bonus * q.both)
    cross_validate("Same, or the BM25 side mixed with a BM25 over whole documents (needs a document-level index)",
                   document, floor)

    if not args.no_rm3:
        lists = expansion_lists(cache, data, queries)
        rm3 = {"w 0.5 (default)": default}
        for key, beta in itertools.product(RM3_SETTINGS, (0.1, 0.2, 0.3)):
            rm3[f"RM3 {key[0]} k {key[1]} m {key[2]}, beta {beta}"] = rm3_per_query(queries, data, lists, key, beta)
        cross_validate("Default, or RM3 expansion on the BM25 side (a second full-text query)", rm3, floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
