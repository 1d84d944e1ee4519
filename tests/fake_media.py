"""Loopback stand-ins for the media side of the enrichment tests:

- `MediaServer`: serves photos and videos by path, like pbs.twimg.com and
  video.twimg.com. A route can declare a Content-Length larger than its
  body and close the connection early: a download cut short.
- `FakeVisionServer`: an OpenAI-compatible vision endpoint
  (POST /v1/chat/completions). It decodes the data URL of the image that
  the real `openai` client sent and answers from the bytes it got: the
  caption names the image size (read with pymupdf), and the OCR text is the
  one that the test registered for that exact image.
- `png(width, height, rgb)`: a real PNG image, made with pymupdf.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import Counter

import pymupdf

from tests.loopback import LoopbackServer, QuietHandler


def png(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    pixmap = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, width, height), False)
    pixmap.set_rect(pixmap.irect, rgb)
    return pixmap.tobytes("png")


class MediaServer(LoopbackServer):
    """routes: path -> (body, content type) or (body, content type, declared length)."""

    def __init__(self, routes: dict[str, tuple]):
        self.routes = dict(routes)
        self.hits: Counter[str] = Counter()
        media = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                path = self.path.split("?")[0]
                media.hits[path] += 1
                route = media.routes.get(path)
                if route is None:
                    self.send_body(404, b"not found", "text/plain")
                    return
                body, content_type, *declared = route
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(declared[0] if declared else len(body)))
                if declared:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                if declared:
                    self.close_connection = True

        self.bind(Handler)

    def url(self, path: str) -> str:
        return self.base_url + path


class FakeVisionServer(LoopbackServer):
    """An OpenAI-compatible vision endpoint that answers from the image bytes.

    mode "json": a JSON caption (default); "prose": an answer with no JSON
    for the images whose sha256 is in `prose_for`; status_code: every
    request gets this HTTP error."""

    def __init__(self, *, status_code: int | None = None):
        self.ocr_by_sha: dict[str, str] = {}
        self.prose_for: set[str] = set()
        self.status_code = status_code
        self.requests: list[dict] = []
        self.paths: list[str] = []
        self.images: list[bytes] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_json()
                with fake.lock:
                    fake.paths.append(self.path)
                    fake.requests.append(body)
                if fake.status_code:
                    self.send_json(fake.status_code, {"error": {"message": "the model is not loaded", "type": "server_error"}})
                    return
                image = fake.image_of(body)
                with fake.lock:
                    fake.images.append(image)
                digest = hashlib.sha256(image).hexdigest()
                if digest in fake.prose_for:
                    content = "I see a picture, but I will not answer in JSON."
                else:
                    pixmap = pymupdf.Pixmap(image)
                    content = "```json\n" + json.dumps({
                        "caption": f"A plain picture of {pixmap.width} by {pixmap.height} pixels.",
                        "ocr_text": fake.ocr_by_sha.get(digest, ""),
                    }) + "\n```"
                self.send_json(200, {
                    "id": "chatcmpl-vision", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", ""),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })

        self.bind(Handler)

    @staticmethod
    def image_of(body: dict) -> bytes:
        """The bytes of the one image in the request's data URL."""
        for message in body.get("messages", []):
            for part in message.get("content") if isinstance(message.get("content"), list) else []:
                if part.get("type") == "image_url":
                    url = part["image_url"]["url"]
                    header, _, data = url.partition(",")
                    assert header.startswith("data:image/") and header.endswith(";base64"), header
                    return base64.b64decode(data)
        raise AssertionError("the request has no image_url part")
