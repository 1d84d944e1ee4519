"""The Hugging Face hub's file routes on loopback, for the real
huggingface_hub client (HF_ENDPOINT or `endpoint=`).

What the client does, and what this fake answers as the hub does for a
large (LFS) file:
- HEAD /<repo>/resolve/<revision>/<path>: 302 to the CDN address, with the
  headers X-Repo-Commit (the commit), X-Linked-Etag (the sha256 of the
  file, quoted) and X-Linked-Size. A missing file: 404 with
  X-Error-Code: EntryNotFound.
- GET of the same route: the same 302; GET of the CDN address (another
  host name, localhost): the bytes.
"""

from __future__ import annotations

import hashlib

from tests.loopback import LoopbackServer, QuietHandler

CDN = "/cdn"


class FakeHub(LoopbackServer):
    """`files` maps a route /<repo>/resolve/<revision>/<path> to its bytes;
    a test may change them. `requests` lists (method, path) in order. A
    `status` (for example 503) answers every request with it."""

    def __init__(self, files: dict[str, bytes], status: int = 0):
        self.files, self.requests, self.status = files, [], status
        hub = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the hub: the client reuses its connection

            def _answer(self, head: bool) -> None:
                hub.requests.append(("HEAD" if head else "GET", self.path))
                if hub.status:  # a hub in trouble: this status for every request
                    self.send_body(hub.status, b"", "text/plain")
                    return
                if self.path.startswith(CDN + "/"):
                    body = hub.files.get(self.path.removeprefix(CDN))
                    if body is None:
                        self.send_body(404, b"", "text/plain")
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if not head:
                        self.wfile.write(body)
                    return
                body = hub.files.get(self.path)
                if body is None:
                    self.send_body(404, b"Entry not found", "text/plain", {"X-Error-Code": "EntryNotFound"})
                    return
                revision = self.path.split("/resolve/", 1)[1].split("/", 1)[0]
                self.send_response(302)
                # Another host, as the hub's CDN: the client follows a redirect to the
                # same host with HEAD, and takes the metadata of this answer only
                # when the redirect leaves the hub.
                self.send_header("Location", f"{hub.cdn_url}{CDN}{self.path}")
                self.send_header("X-Repo-Commit", revision)
                self.send_header("X-Linked-Etag", f'"{hashlib.sha256(body).hexdigest()}"')
                self.send_header("X-Linked-Size", str(len(body)))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

        self.bind(Handler)

    @property
    def cdn_url(self) -> str:
        """The same server by another name: http://localhost:<port>."""
        return f"http://localhost:{self.server.server_port}"
