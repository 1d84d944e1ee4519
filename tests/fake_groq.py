"""A loopback stand-in for Groq's OpenAI-compatible API
(POST /openai/v1/chat/completions), for the translation tests.

It answers like a translation model: the user message is looked up in
`translations` (source text -> English); a text in `english_texts` gets the
answer ENGLISH. Before that, the first `rate_limits` requests get a 429
with a `retry-after` header, as Groq sends when a rate limit is hit. Every
request is kept (path, headers, JSON body, time), so tests can check what
the real `openai` client sent and when.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/openai/v1/chat/completions"


class FakeGroq:
    def __init__(self, translations: dict[str, str] | None = None, english_texts: set[str] | None = None,
                 *, rate_limits: int = 0, retry_after: str = "1", status_code: int | None = None):
        self.translations = dict(translations or {})
        self.english_texts = set(english_texts or ())
        self.rate_limits = rate_limits
        self.retry_after = retry_after
        self.status_code = status_code
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        self.times: list[float] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with fake.lock:
                    fake.paths.append(self.path)
                    fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                    fake.requests.append(body)
                    fake.times.append(time.monotonic())
                    limited = fake.rate_limits > 0
                    if limited:
                        fake.rate_limits -= 1
                if self.path != PATH:
                    self._send(404, {"error": {"message": f"unknown path {self.path}", "type": "invalid_request_error"}})
                elif limited:
                    self._send(429, {"error": {"message": "Rate limit reached for model openai/gpt-oss-120b. "
                                               "Please try again in 1s.", "type": "tokens", "code": "rate_limit_exceeded"}},
                               {"retry-after": fake.retry_after})
                elif fake.status_code:
                    self._send(fake.status_code, {"error": {"message": "Invalid API Key", "type": "invalid_request_error",
                                                            "code": "invalid_api_key"}})
                else:
                    self._send(200, fake.completion(body))

            def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/openai/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def completion(self, body: dict) -> dict:
        text = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if text in self.english_texts:
            answer = "ENGLISH"
        elif text in self.translations:
            answer = self.translations[text]
        else:
            answer = f"[no translation known for {text[:40]!r}]"
        return {
            "id": "chatcmpl-groq", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer, "reasoning": "Translate it."}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 20, "total_tokens": 40},
            "x_groq": {"id": "req_test"},
        }

    def user_texts(self) -> list[str]:
        return [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in self.requests]

    def __enter__(self) -> FakeGroq:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
