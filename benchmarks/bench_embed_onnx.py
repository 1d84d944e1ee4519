"""kb's ONNX Runtime path of the local model (kb/index/embed_onnx.py) against
sentence-transformers: its ONNX backend when it loads, and its PyTorch
path, on SciFact abstracts.

    .venv/bin/python benchmarks/bench_embed_onnx.py [--texts 128] [--runs 3] [--threads 2]

Each figure is the median of `runs` encodes of the same `texts` abstracts
(the first encode of each model, its warm-up, is not counted), with
`threads` CPU threads for each runtime. The script also says why
sentence-transformers' ONNX backend (backend="onnx") does not load, when it
does not. Figures go into benchmarks/libraries.md with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CORPUS = REPO.parent / "shared" / "eval" / "scifact" / "corpus.jsonl"
FALLBACK_CORPUS = Path("/work/shared/eval/scifact/corpus.jsonl")
MODEL = "all-MiniLM-L6-v2"


def abstracts(count: int) -> list[str]:
    path = CORPUS if CORPUS.is_file() else FALLBACK_CORPUS
    texts = []
    with path.open() as handle:
        for line in handle:
            row = json.loads(line)
            texts.append(f"{row.get('title', '')}. {row.get('text', '')}")
            if len(texts) == count:
                break
    return texts


def timed(encode, texts: list[str], runs: int) -> float:
    encode(texts)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        encode(texts)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import sentence_transformers
    import torch

    from kb.index.embed_local import local_model_path
    from kb.index.embed_onnx import OnnxModel

    torch.set_num_threads(args.threads)
    texts = abstracts(args.texts)
    path = local_model_path(MODEL, download=False)
    load = os.getloadavg()
    print(f"load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; sentence-transformers {sentence_transformers.__version__}; "
          f"{len(texts)} SciFact abstracts, {args.threads} threads, median of {args.runs} runs")

    kb_model = OnnxModel(path, args.threads)
    kb_s = timed(lambda t: kb_model.encode(t, batch_size=64), texts, args.runs)
    print(f"kb ONNX Runtime (embed_onnx.py):        {kb_s:6.2f} s  {len(texts) / kb_s:6.1f} texts/s")

    torch_model = sentence_transformers.SentenceTransformer(str(path), device="cpu")
    torch_s = timed(lambda t: torch_model.encode(t, batch_size=64, normalize_embeddings=True), texts, args.runs)
    print(f"sentence-transformers, PyTorch:         {torch_s:6.2f} s  {len(texts) / torch_s:6.1f} texts/s")
    cosine = (kb_model.encode(texts[:32]) * torch_model.encode(texts[:32], normalize_embeddings=True)).sum(axis=1)
    print(f"cosine kb ONNX against PyTorch: min {float(np.min(cosine)):.6f}")

    try:
        onnx_model = sentence_transformers.SentenceTransformer(str(path), device="cpu", backend="onnx")
    except Exception as exc:  # the backend's packages are missing or do not fit this transformers
        print(f"sentence-transformers, ONNX backend:    does not load: {type(exc).__name__}: {str(exc)[:300]}")
        return
    onnx_s = timed(lambda t: onnx_model.encode(t, batch_size=64, normalize_embeddings=True), texts, args.runs)
    print(f"sentence-transformers, ONNX backend:    {onnx_s:6.2f} s  {len(texts) / onnx_s:6.1f} texts/s")


if __name__ == "__main__":
    main()
