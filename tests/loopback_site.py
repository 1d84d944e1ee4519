"""A loopback web site: fixed pages by path, for parser and asset tests.

`LoopbackSite({"/a": page(html)})` serves each path with its status,
content type and body, counts the hits per path, and answers 404 for
every other path.
"""

from __future__ import annotations

import threading
from collections import Counter

from tests.loopback import LoopbackServer, QuietHandler


def page(body: str | bytes, status: int = 200, content_type: str = "text/html; charset=utf-8") -> tuple[int, str, bytes]:
    return status, content_type, body.encode() if isinstance(body, str) else body


def article_html(title: str, paragraphs: list[str]) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
            f"<nav><a href='/'>Home</a> | <a href='/about'>About</a></nav>"
            f"<article><h1>{title}</h1>{body}</article>"
            f"<footer>Copyright 2026 Example Site</footer></body></html>")


class LoopbackSite(LoopbackServer):
    def __init__(self, routes: dict[str, tuple[int, str, bytes]]):
        self.routes = dict(routes)
        self.hits: Counter[str] = Counter()
        site = self

        class Handler(QuietHandler):
            def do_GET(self):
                path = self.path.split("?")[0].rstrip("/") or "/"
                site.hits[path] += 1
                status, content_type, body = site.routes.get(path, (404, "text/html", b"<h1>Not Found</h1>"))
                self.send_body(status, body, content_type)

        self.bind(Handler)

    def url(self, path: str) -> str:
        return self.base_url + path


def pdf_bytes(text: str) -> bytes:
    """A one-page PDF with `text`, made by pymupdf: a real file to serve."""
    import pymupdf

    doc = pymupdf.open()
    doc.new_page().insert_textbox(pymupdf.Rect(50, 50, 550, 800), text, fontsize=10)
    data = doc.tobytes()
    doc.close()
    return data


class HeldPdfSite(LoopbackServer):
    """Serves one PDF. A request for `held` (every path when None) waits
    until `release` is set, at most `wait_s`; `arrived` is set when it comes.
    A path not in `paths` (when given) and not `held` gets 404. `hits`: the
    requests per path. The end of its `with` block releases a held request."""

    def __init__(self, body: bytes, *, wait_s: float, paths: list[str] | None = None,
                 held: str | None = None) -> None:
        self.hits: Counter[str] = Counter()
        self.arrived, self.release = threading.Event(), threading.Event()
        site = self

        class Handler(QuietHandler):
            def _answer(self, with_body: bool) -> None:
                path = self.path.split("?")[0]
                site.hits[path] += 1
                if held is None or path == held:
                    site.arrived.set()
                    site.release.wait(wait_s)
                if paths is not None and path not in paths and path != held:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/pdf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def do_HEAD(self):
                self._answer(False)

            def do_GET(self):
                self._answer(True)

        self.bind(Handler)

    def __exit__(self, *exc) -> None:
        self.release.set()
        super().__exit__(*exc)
