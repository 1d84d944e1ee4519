"""A loopback stand-in for Ollama's HTTP API, for the embedder tests. The
embedder talks to it through the official `ollama` client.

It speaks the two calls that kb makes:
- `GET /api/tags`: {"models": [{"name": "embeddinggemma:latest", ...}]}
- `POST /api/embed` {"model", "input": [...], "truncate"}: {"model", "embeddings": [[...]]},
  or 404 {"error": "model ... not found, try pulling it first"} for a model
  that the server does not have, as Ollama answers.

The vectors are bag-of-words hashes of the input text (with its prompt), so
they are deterministic and texts that share words are near. Every request is
kept in `requests`, so a test can see the prompts, the batch sizes and that
cached texts are not sent again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kb.index.embed_vectors import hash_vectors
from tests.loopback import LoopbackServer, QuietHandler

DIM = 768  # embeddinggemma's dimension


@dataclass
class FakeOllama(LoopbackServer):
    models: list[str] = field(default_factory=lambda: ["embeddinggemma:latest"])
    requests: list[dict] = field(default_factory=list)
    # When set, /api/embed answers this (status, error) as Ollama does when
    # the model fails to load: {"error": "..."} with the status.
    embed_error: tuple[int, str] | None = None
    # When set, a request with an input that holds this text gets a 400, as
    # Ollama answers an input that it cannot read.
    refuse_text: str | None = None

    @property
    def url(self) -> str:
        return self.base_url

    def embed_inputs(self) -> list[str]:
        """Every text that was sent to /api/embed, in order."""
        return [text for r in self.requests if r["path"] == "/api/embed" for text in r["body"]["input"]]

    def __enter__(self) -> "FakeOllama":
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path, "body": None,
                                      "user_agent": self.headers.get("User-Agent", "")})
                if self.path == "/api/tags":
                    models = [{"name": m, "model": m, "size": 621_875_000, "details": {"family": "gemma3"}}
                              for m in fake.models]
                    self._json(200, {"models": models})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = self.read_json()
                fake.requests.append({"method": "POST", "path": self.path, "body": body,
                                      "user_agent": self.headers.get("User-Agent", "")})
                if self.path != "/api/embed":
                    self._json(404, {"error": "not found"})
                    return
                if fake.embed_error:
                    self._json(fake.embed_error[0], {"error": fake.embed_error[1]})
                    return
                model = body.get("model", "")
                known = {m for m in fake.models} | {m.split(":")[0] for m in fake.models if m.endswith(":latest")}
                if model not in known:
                    self._json(404, {"error": f'model "{model}" not found, try pulling it first'})
                    return
                inputs = body.get("input")
                inputs = [inputs] if isinstance(inputs, str) else list(inputs)
                if fake.refuse_text and any(fake.refuse_text in text for text in inputs):
                    self._json(400, {"error": "the input could not be tokenized"})
                    return
                vectors = hash_vectors(inputs, DIM).tolist()
                self._json(200, {"model": model, "embeddings": vectors, "total_duration": 1000,
                                 "load_duration": 10, "prompt_eval_count": len(inputs)})

            def _json(self, status: int, payload: dict) -> None:
                self.send_json(status, payload, content_type="application/json; charset=utf-8")

        self.bind(Handler)
        return super().__enter__()
