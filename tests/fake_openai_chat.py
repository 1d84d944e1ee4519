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

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


class FakeOpenAIChat:
    def __init__(self, *answers: tuple[int, dict]):
        self.script = list(answers)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.paths.append(self.path)
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                fake.requests.append(json.loads(body or b"{}"))
                code, payload = fake.script.pop(0) if len(fake.script) > 1 else fake.script[0]
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeOpenAIChat:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
