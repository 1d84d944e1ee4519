"""Vector helpers that every embedding backend shares: the embedder's error,
unit vectors, text keys, and the hash vectors (a test and demo aid: a
deterministic bag of words that knows no meaning, just shared words)."""

from __future__ import annotations

import hashlib
import re

import numpy as np

HASH_DIM = 256
WORD = re.compile(r"\w+", re.UNICODE)


class EmbedderError(RuntimeError):
    """The embedder cannot produce vectors. The message says why and what to do."""



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
