"""A loopback stand-in for Groq's OpenAI-compatible API
(POST /openai/v1/chat/completions), for the translation tests.

It answers like a translation model: the user message is looked up in
`translations` (source text -> English); a text in `english_texts` gets the
answer ENGLISH. Before that, the first `rate_limits` requests get a 429
with a `retry-after` header, as Groq sends when a rate limit is hit. Every
request is kept (path, headers, JSON body, time), so tests can check what
the real `groq` client sent and when.
"""

from __future__ import annotations

import threading
import time

from tests.loopback import LoopbackServer, QuietHandler

PATH = "/openai/v1/chat/completions"


class FakeGroq(LoopbackServer):
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

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_json()
                with fake.lock:
                    fake.paths.append(self.path)
                    fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                    fake.requests.append(body)
                    fake.times.append(time.monotonic())
                    limited = fake.rate_limits > 0
                    if limited:
                        fake.rate_limits -= 1
                if self.path != PATH:
                    self.send_json(404, {"error": {"message": f"unknown path {self.path}", "type": "invalid_request_error"}})
                elif limited:
                    self.send_json(429, {"error": {"message": "Rate limit reached for model openai/gpt-oss-120b. "
                                               "Please try again in 1s.", "type": "tokens", "code": "rate_limit_exceeded"}},
                               {"retry-after": fake.retry_after})
                elif fake.status_code:
                    self.send_json(fake.status_code, {"error": {"message": "Invalid API Key", "type": "invalid_request_error",
                                                            "code": "invalid_api_key"}})
                else:
                    self.send_json(200, fake.completion(body))

        self.bind(Handler)

    @property
    def base_url(self) -> str:
        return super().base_url + "/openai/v1"

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
