"""Retrieval evaluation on a BEIR-format folder, through kb's own code.

Each corpus document becomes one "bookmark": its title and text are cut by
chunk_text(), embedded by the Embedder (with its cache), written by
ChunkIndex.replace_chunks() and searched by kb.index.search.search(). So the
figures measure the code that answers the owner, not a copy of it.

Folder layout (BEIR):
- corpus.jsonl: {"_id", "title", "text"} per line
- queries.<split>.jsonl: {"_id", "text"} per line
- qrels.<split>.tsv: query-id <TAB> corpus-id <TAB> score, with a header line

Metrics: nDCG@10 (linear gain, as trec_eval), Recall@100, and the median
and 95th percentile of the search time per query. The time does NOT include
the query embedding: queries are embedded first, so the figures compare the
index and the fusion, not the embedding model.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kb.index.chunking import DEFAULT_MAX_WORDS, chunk_text
from kb.index.fusion import DEFAULT_FUSION
from kb.index.search import search
from kb.index.search_request import MODES
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex

INDEX_BATCH = 1000  # documents per replace_chunks call


class EvalDataError(ValueError):
    """The BEIR folder is missing a file or has a bad line."""


def load_beir(folder: Path, split: str) -> tuple[dict[str, dict], dict[str, str], dict[str, dict[str, int]]]:
    """(corpus, queries, qrels) of a BEIR folder. Queries without a judged
    document are dropped: they cannot be scored."""
    folder = Path(folder)
    paths = {"corpus": folder / "corpus.jsonl", "queries": folder / f"queries.{split}.jsonl",
             "qrels": folder / f"qrels.{split}.tsv"}
    for kind, path in paths.items():
        if not path.is_file():
            raise EvalDataError(f"{path} is missing: a BEIR folder needs corpus.jsonl, "
                                f"queries.{split}.jsonl and qrels.{split}.tsv (split {split!r})")
    corpus = {str(d["_id"]): d for d in _jsonl(paths["corpus"])}
    queries = {str(q["_id"]): str(q.get("text") or "") for q in _jsonl(paths["queries"])}
    qrels: dict[str, dict[str, int]] = {}
    with paths["qrels"].open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            parts = line.rstrip("\n").split("\t")
            if number == 1 and not parts[-1].strip().lstrip("-").isdigit():
                continue  # header line
            if len(parts) < 3 or not parts[2].strip().lstrip("-").isdigit():
                raise EvalDataError(f"{paths['qrels']} line {number}: expected query-id, corpus-id, score")
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries = {qid: text for qid, text in queries.items()
               if text.strip() and any(score > 0 for score in qrels.get(qid, {}).values())}
    if not corpus or not queries:
        raise EvalDataError(f"{folder}: no documents or no judged queries for split {split!r}")
    return corpus, queries, qrels


def _jsonl(path: Path) -> Iterable[dict]:
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalDataError(f"{path} line {number} is not JSON: {exc}") from exc
            if "_id" not in row:
                raise EvalDataError(f"{path} line {number} has no _id")
            yield row


def document_chunks(doc_id: str, doc: dict, max_words: int = DEFAULT_MAX_WORDS) -> list[dict]:
    """The chunk rows of one corpus document. The title is the first
    paragraph, as the title of an X Article is in its bookmark's passages.
    (A title at the head of every passage made no difference to hybrid
    nDCG@10 on SciFact, so the simple form stays.)"""
    title = str(doc.get("title") or "").strip()
    text = str(doc.get("text") or "").strip()
    passages = chunk_text(f"{title}\n\n{text}" if title else text, max_words=max_words)
    return [{"chunk_id": f"{doc_id}:{position}", "tweet_id": doc_id, "url": "", "author": "",
             "created_at": None, "source": "eval", "ref": doc_id, "position": position, "text": passage}
            for position, passage in enumerate(passages)]


def build_index(corpus: dict[str, dict], index: ChunkIndex, embedder: Embedder, *,
                max_words: int = DEFAULT_MAX_WORDS, progress: Callable[[int, int], None] | None = None) -> int:
    ids = list(corpus)
    written = 0
    for start in range(0, len(ids), INDEX_BATCH):
        part = ids[start:start + INDEX_BATCH]
        rows = [row for doc_id in part for row in document_chunks(doc_id, corpus[doc_id], max_words)]
        written += index.replace_chunks(part, rows, embedder)["written"]
        if progress:
            progress(min(start + INDEX_BATCH, len(ids)), len(ids))
    index.maintain()
    return written


def ndcg_at(ranked: list[str], judged: dict[str, int], k: int = 10) -> float:
    dcg = sum(judged.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]) if judged.get(doc, 0) > 0)
    ideal = sorted((s for s in judged.values() if s > 0), reverse=True)[:k]
    idcg = sum(score / math.log2(rank + 2) for rank, score in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], judged: dict[str, int], k: int = 100) -> float:
    relevant = {doc for doc, score in judged.items() if score > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def evaluate(
    folder: str | Path,
    split: str = "test",
    modes: Iterable[str] = MODES,
    *,
    embedder: Embedder | None = None,
    workdir: str | Path | None = None,
    max_words: int = DEFAULT_MAX_WORDS,
    fusion: str = DEFAULT_FUSION,
    max_queries: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    rerank: bool = False,
) -> dict:
    """nDCG@10, Recall@100 and search time per mode:
    {"<mode>": {"ndcg@10", "recall@100", "p50_ms", "p95_ms", "queries"}}.

    The index is built in `workdir` (default: a temporary folder, removed at
    the end); the embedding cache is the embedder's (settings.lancedb_dir by
    default), so a second run embeds nothing. rerank: the deep search
    (search(rerank=True)); its time includes the cross-encoder."""
    modes = list(modes)
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is unknown: use one of {', '.join(MODES)}")
    corpus, queries, qrels = load_beir(Path(folder), split)
    if max_queries:
        queries = dict(list(queries.items())[:max_queries])
    embedder = embedder or Embedder.from_settings()
    with tempfile.TemporaryDirectory(prefix="kb-eval-") as tmp:
        index = ChunkIndex.from_settings(path=str(workdir or Path(tmp) / "index"))
        index.rebuild()
        build_index(corpus, index, embedder, max_words=max_words,
                    progress=(lambda done, total: progress("index", done, total)) if progress else None)
        vectors = {}
        if any(m != "bm25" for m in modes):
            ids = list(queries)
            for qid, vector in zip(ids, _embed_queries(embedder, [queries[q] for q in ids])):
                vectors[qid] = vector
        results = {}
        for mode in modes:
            results[mode] = _run_mode(mode, queries, qrels, index, embedder, vectors, fusion, progress, rerank)
    return results


def _embed_queries(embedder: Embedder, texts: list[str]):
    return [embedder.embed_query(t) for t in texts]


def _run_mode(mode, queries, qrels, index, embedder, vectors, fusion, progress, rerank=False) -> dict:
    ndcgs, recalls, times = [], [], []
    for number, (qid, text) in enumerate(queries.items(), 1):
        started = time.perf_counter()
        response = search(text, limit=100, mode=mode, index=index, embedder=embedder, fusion=fusion,
                          query_vector=vectors.get(qid), rerank=rerank)
        times.append((time.perf_counter() - started) * 1000)
        ranked = [hit.tweet_id for hit in response.hits]
        ndcgs.append(ndcg_at(ranked, qrels[qid], 10))
        recalls.append(recall_at(ranked, qrels[qid], 100))
        if progress:
            progress(mode, number, len(queries))
    times.sort()
    return {
        "ndcg@10": round(statistics.fmean(ndcgs), 4),
        "recall@100": round(statistics.fmean(recalls), 4),
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 2),
        "queries": len(ndcgs),
    }
