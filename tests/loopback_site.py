"""A loopback web site: fixed pages by path, for parser and asset tests.

`LoopbackSite({"/a": page(html)})` serves each path with its status,
content type and body, counts the hits per path, and answers 404 for
every other path.
"""

from __future__ import annotations

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
