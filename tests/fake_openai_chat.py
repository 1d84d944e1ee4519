"""A loopback stand-in for an OpenAI-compatible chat endpoint (DeepSeek's
`POST /chat/completions`), for the quality gate tests.

It plays a script of answers, one per request, and keeps every request
(headers and JSON body) so tests can check what the real `openai` client
sent. Answers:
- `chat(content)`: a 200 chat completion whose message content is `content`;
- `status(code, message)`: an error in the OpenAI error shape.
When the script is empty, the last answer repeats.
"""

from __future__ import annotations

import time

from tests.loopback import LoopbackServer, QuietHandler


def chat(content: str) -> tuple[int, dict]:
    return 200, {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "deepseek-chat",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def status(code: int, message: str = "server error") -> tuple[int, dict]:
    return code, {"error": {"message": message, "type": "server_error", "code": code}}


class FakeOpenAIChat(LoopbackServer):
    def __init__(self, *answers: tuple[int, dict]):
        self.script = list(answers)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        self.arrivals: list[float] = []  # time.monotonic() of each request
        fake = self

        class Handler(QuietHandler):
            def do_POST(self):
                fake.arrivals.append(time.monotonic())
                body = self.read_json()
                fake.paths.append(self.path)
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                fake.requests.append(body)
                code, payload = fake.script.pop(0) if len(fake.script) > 1 else fake.script[0]
                self.send_json(code, payload)

        self.bind(Handler)
