"""The plumbing that every loopback fake shares: an HTTP server on a free
port of 127.0.0.1, served by a daemon thread while a `with` block runs.

A fake keeps its own request handler, so it still speaks the real protocol
of its service. It builds the handler on `QuietHandler` (no log lines, JSON
in and out) and gives it to `LoopbackServer.bind`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that writes no log lines (they fill the pytest output)."""

    def log_message(self, *args) -> None:
        pass

    def read_json(self) -> dict:
        """The JSON body of the request; {} when the body is empty."""
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def send_body(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, payload: dict, headers: dict | None = None,
                  content_type: str = "application/json") -> None:
        self.send_body(status, json.dumps(payload).encode(), content_type, headers)


class LoopbackServer:
    """Binds a handler to a free port (`bind`), serves it on enter and stops on exit."""

    server: ThreadingHTTPServer
    thread: threading.Thread

    def bind(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        # A short poll interval: shutdown() waits up to one interval.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>. A fake whose API lives under a path adds it."""
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    """A port of 127.0.0.1 that no program uses now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serve_asgi(app, name: str = "the app"):
    """An ASGI app served by uvicorn on a free loopback port, in a thread, as
    `kb web` serves it. Yields http://127.0.0.1:<port>."""
    import uvicorn

    from kb.apps.connection_rules import RuledHTTPProtocol

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", http=RuledHTTPProtocol))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


def allow_fetches(monkeypatch, *base_urls: str) -> None:
    """Let kb's fetch guard (kb/guards/fetch_guard.py) reach these loopback servers,
    by host and port: every other loopback port stays refused. The guard
    refuses loopback by default, as it must for a hostile link."""
    monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", ",".join(urlsplit(url).netloc for url in base_urls))
