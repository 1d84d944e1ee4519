"""A loopback stand-in for Ollama's HTTP API, for the embedder tests.

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

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kb_resources.embedder import hash_vectors

DIM = 768  # embeddinggemma's dimension


@dataclass
class FakeOllama:
    models: list[str] = field(default_factory=lambda: ["embeddinggemma:latest"])
    requests: list[dict] = field(default_factory=list)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def embed_inputs(self) -> list[str]:
        """Every text that was sent to /api/embed, in order."""
        return [text for r in self.requests if r["path"] == "/api/embed" for text in r["body"]["input"]]

    def __enter__(self) -> "FakeOllama":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path, "body": None})
                if self.path == "/api/tags":
                    models = [{"name": m, "model": m, "size": 621_875_000, "details": {"family": "gemma3"}}
                              for m in fake.models]
                    self._json(200, {"models": models})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append({"method": "POST", "path": self.path, "body": body})
                if self.path != "/api/embed":
                    self._json(404, {"error": "not found"})
                    return
                model = body.get("model", "")
                known = {m for m in fake.models} | {m.split(":")[0] for m in fake.models if m.endswith(":latest")}
                if model not in known:
                    self._json(404, {"error": f'model "{model}" not found, try pulling it first'})
                    return
                inputs = body.get("input")
                inputs = [inputs] if isinstance(inputs, str) else list(inputs)
                vectors = hash_vectors(inputs, DIM).tolist()
                self._json(200, {"model": model, "embeddings": vectors, "total_duration": 1000,
                                 "load_duration": 10, "prompt_eval_count": len(inputs)})

            def _json(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
