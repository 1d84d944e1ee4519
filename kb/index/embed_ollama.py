"""The Ollama backend of the embedder: the official `ollama` client
(/api/embed), with the asymmetric prompts of embeddinggemma."""

from __future__ import annotations

import httpx
import numpy as np
from pydantic import ValidationError

from kb.error_lines import error_line
from kb.guards.tls import tls_context
from kb.index.embed_vectors import EmbedderError, normalize

# embeddinggemma is trained with these prompts. Without them its retrieval
# quality drops, and documents and queries must use different ones.
OLLAMA_DOCUMENT_PROMPT = "title: none | text: {text}"
OLLAMA_QUERY_PROMPT = "task: search result | query: {text}"


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

    # The process's TLS context (kb/guards/tls.py): a new one cost 30 ms of CPU per call.
    return ollama.Client(host=url, timeout=timeout, verify=tls_context())


def ollama_models(url: str, timeout: float = 3.0) -> list[str]:
    """Names of the models that the Ollama server has. Raises EmbedderError
    when the server does not answer."""
    try:
        with ollama_client(url, timeout) as client:
            return [m.model or "" for m in client.list().models]
    except ollama_errors() as exc:
        raise EmbedderError(f"Ollama at {url} does not answer: {error_line(exc, 200)}") from exc


def same_model(available: str, wanted: str) -> bool:
    # Ollama names carry a tag; a name with no tag means ":latest".
    def full(name: str) -> str:
        return name if ":" in name else f"{name}:latest"

    return full(available) == full(wanted)


def ollama_has_model(url: str, model: str) -> bool:
    return any(same_model(name, model) for name in ollama_models(url))


def ollama_embed(url: str, model: str, inputs: list[str], timeout: float) -> np.ndarray:
    import ollama

    try:
        with ollama_client(url, timeout) as client:
            embeddings = client.embed(model=model, input=inputs, truncate=True).embeddings
    except ollama.ResponseError as exc:
        if exc.status_code == 404:
            raise EmbedderError(f"Ollama at {url} has no model {model!r}. Run `ollama pull {model}`.") from exc
        raise EmbedderError(f"Ollama at {url} refused to embed with {model!r}: {error_line(exc, 200)}") from exc
    except ollama_errors() as exc:
        raise EmbedderError(f"Ollama at {url} does not answer: {error_line(exc, 200)}") from exc
    if len(embeddings) != len(inputs):
        raise EmbedderError(f"Ollama at {url} returned {len(embeddings)} embeddings for {len(inputs)} inputs.")
    return normalize(np.asarray(embeddings, dtype=np.float32))
