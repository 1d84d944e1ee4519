"""The choice of the local embedding model (issue 58, point 1).

For one local model (KB_LOCAL_MODEL's values: bge-small-en-v1.5,
all-MiniLM-L6-v2), it builds kb's index of SciFact through kb's own code
(kb.apps.eval_retrieval: chunk_text(), the embedding cache,
ChunkIndex.replace_chunks(), maintain()) and searches each train query with
search() in the modes bm25, dense and hybrid (the default fusion), and with
--deep the deep search (rerank=True). So the figures are those of
`kb.apps.eval_retrieval.evaluate(..., "train")`, cut in two:

- the choice split: the train queries whose sha256 of the query id starts
  with a byte of 64 or more (about 3/4). The model and its query
  instruction are chosen on this split only.
- the dev split: the other train queries (about 1/4), held out of the
  choice. Its figure estimates the held-out test split.

--variants: the query forms of the model to compare on the same index:
"default" (the catalog's query prefix) and "plain" (no prefix).

--docs N: a smaller corpus of N documents (the documents judged for any
train query, and a seeded random choice of the others), so that two models
can be embedded on a shared 2-core machine in half an hour. Easier than the
whole corpus (fewer distractors): its figures compare the models with each
other, not with the whole-corpus figures.

--throughput N: passages per second on the first N passages of SciFact
(no cache, one process, ONNX Runtime or PyTorch as kb runs the model), with
the CPU seconds and the load average: the 2 cores are shared.

    KB_SHARED_DIR=/work/shared PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python \\
        benchmarks/bench_embedding_model.py --model bge-small-en-v1.5 --cache /tmp/kb-embed-cache \\
        --variants default plain --deep --out FILE

Figures: benchmarks/embedding_model.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(os.environ.get("KB_SHARED_DIR", "/work/shared")) / "eval" / "scifact"


def split_of(qid: str) -> str:
    """The split of a train query: "dev" (held out of the choice) or "choice"."""
    return "dev" if hashlib.sha256(qid.encode()).digest()[0] < 64 else "choice"


def throughput(model: str, count: int) -> dict:
    from kb.apps.eval_retrieval import document_chunks, load_beir
    from kb.index.embedder import Embedder

    corpus, _, _ = load_beir(DATA, "train")
    texts = []
    for doc_id, doc in corpus.items():
        texts += [r["text"] for r in document_chunks(doc_id, doc)]
        if len(texts) >= count:
            break
    texts = texts[:count]
    embedder = Embedder.from_settings(backend="local", local_model=model, use_cache=False)
    embedder.embed_documents(texts[:16])  # the model loads
    load_before = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    embedder.embed_documents(texts)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"model": model, "passages": len(texts), "words": sum(len(t.split()) for t in texts),
            "passages_per_s": round(len(texts) / wall, 2), "cpu_s": round(cpu, 1),
            "passages_per_cpu_s": round(len(texts) / cpu, 2),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def smaller_corpus(corpus: dict, qrels: dict, docs: int, seed: int = 58) -> dict:
    """The judged documents and a seeded random choice of the others: `docs` in all."""
    import random

    judged = {d for judged in qrels.values() for d, score in judged.items() if score > 0 and d in corpus}
    others = sorted(set(corpus) - judged)
    random.Random(seed).shuffle(others)
    keep = judged | set(others[:max(0, docs - len(judged))])
    return {d: corpus[d] for d in corpus if d in keep}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure(model: str, cache: Path, variants: list[str], deep: bool, docs: int = 0,
            deep_split: str | None = None, modes: tuple[str, ...] = ("bm25", "dense", "hybrid")) -> dict:
    from kb.apps.eval_retrieval import _embed_queries, build_index, load_beir, ndcg_at
    from kb.index.client import ChunkIndex
    from kb.index.embed_onnx import load_onnx_model
    from kb.index.embedder import Embedder
    from kb.index.search import search
    from kb.index.store import CHUNKS

    corpus, queries, qrels = load_beir(DATA, "train")
    if docs:
        corpus = smaller_corpus(corpus, qrels, docs)
    embedder = Embedder.from_settings(backend="local", local_model=model, cache_dir=str(cache))
    out: dict = {"model": embedder.model_name, "queries": len(queries), "documents": len(corpus),
                 "split_sizes": {s: sum(split_of(q) == s for q in queries) for s in ("choice", "dev")}}
    with tempfile.TemporaryDirectory(prefix="kb-embed-model-") as tmp:
        index = ChunkIndex.from_settings(path=str(Path(tmp) / "index"))
        index.rebuild()
        started = time.perf_counter()
        written = build_index(corpus, index, embedder,
                              progress=lambda done, total: print(f"index {done}/{total} "
                                                                 f"({time.perf_counter() - started:.0f} s)",
                                                                 file=sys.stderr, flush=True))
        out["passages"] = written
        out["index_s"] = round(time.perf_counter() - started, 1)
        out["embedded"] = embedder.stats
        table_bytes = folder_bytes(Path(index.table_uri(CHUNKS)))
        out["chunks_table_bytes"] = table_bytes
        out["bytes_per_passage"] = round(table_bytes / written, 1)
        ids = list(queries)
        for variant in variants:
            if variant == "default":
                vectors = dict(zip(ids, _embed_queries(embedder, [queries[q] for q in ids])))
            else:  # no query prefix: the model's own encoder, as kb embeds a passage
                encoder = load_onnx_model(model)
                vectors = {q: encoder.encode([queries[q]])[0] for q in ids}
            result = {}
            for mode in [*modes, *(["deep"] if deep and variant == variants[0] else [])]:
                if variant != variants[0] and mode == "bm25":
                    continue  # no vectors in it: the same for each variant
                scores = {}
                times = []
                # The deep search costs a cross-encoder pass per query: --deep-split runs it on one split only.
                asked = [q for q in ids if mode != "deep" or deep_split is None or split_of(q) == deep_split]
                for number, qid in enumerate(asked, 1):
                    t = time.perf_counter()
                    response = search(queries[qid], limit=100, mode="hybrid" if mode == "deep" else mode,
                                      index=index, embedder=embedder, query_vector=vectors[qid],
                                      rerank=mode == "deep")
                    times.append((time.perf_counter() - t) * 1000)
                    scores[qid] = ndcg_at([h.tweet_id for h in response.hits], qrels[qid], 10)
                    if number % 200 == 0:
                        print(f"{variant} {mode} {number}/{len(asked)}", file=sys.stderr, flush=True)
                times.sort()
                splits = {split_of(q) for q in scores}
                result[mode] = {"train": round(statistics.fmean(scores.values()), 4) if len(splits) == 2 else None,
                                **{s: round(statistics.fmean(v for q, v in scores.items() if split_of(q) == s), 4)
                                   for s in ("choice", "dev") if s in splits},
                                "p50_ms": round(times[len(times) // 2], 1),
                                "p95_ms": round(times[int(0.95 * len(times))], 1)}
                print(json.dumps({variant: {mode: result[mode]}}), file=sys.stderr, flush=True)
            out[variant] = result
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bge-small-en-v1.5", help="a KB_LOCAL_MODEL value")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "kb-embed-cache",
                        help="kb's embedding cache (keep it outside the repository)")
    parser.add_argument("--variants", nargs="*", default=["default"], choices=["default", "plain"])
    parser.add_argument("--deep", action="store_true", help="also the deep search (rerank=True), first variant")
    parser.add_argument("--modes", nargs="*", default=["bm25", "dense", "hybrid"],
                        choices=["bm25", "dense", "hybrid"], help="the fast modes to measure")
    parser.add_argument("--deep-split", choices=["choice", "dev"], default=None,
                        help="run the deep search on this split only")
    parser.add_argument("--docs", type=int, default=0, help="a smaller corpus of N documents (see above)")
    parser.add_argument("--throughput", type=int, default=0, help="measure passages/s on N passages, then stop")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not (DATA / "corpus.jsonl").is_file():
        parser.error(f"{DATA} holds no corpus.jsonl: set KB_SHARED_DIR to the folder that holds eval/scifact")
    if args.throughput:
        result = throughput(args.model, args.throughput)
    else:
        result = {"load_before": os.getloadavg(), **measure(args.model, args.cache, args.variants, args.deep, args.docs,
                                                                 args.deep_split, tuple(args.modes)),
                  "load_after": os.getloadavg()}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
