"""A loopback web site: fixed pages by path, for parser and asset tests.

`LoopbackSite({"/a": page(html)})` serves each path with its status,
content type and body, counts the hits per path, and answers 404 for
every other path.
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def page(body: str | bytes, status: int = 200, content_type: str = "text/html; charset=utf-8") -> tuple[int, str, bytes]:
    return status, content_type, body.encode() if isinstance(body, str) else body


def article_html(title: str, paragraphs: list[str]) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
            f"<nav><a href='/'>Home</a> | <a href='/about'>About</a></nav>"
            f"<article><h1>{title}</h1>{body}</article>"
            f"<footer>Copyright 2026 Example Site</footer></body></html>")


class LoopbackSite:
    def __init__(self, routes: dict[str, tuple[int, str, bytes]]):
        self.routes = dict(routes)
        self.hits: Counter[str] = Counter()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?")[0].rstrip("/") or "/"
                site.hits[path] += 1
                status, content_type, body = site.routes.get(path, (404, "text/html", b"<h1>Not Found</h1>"))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return self.base_url + path

    def __enter__(self) -> LoopbackSite:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
