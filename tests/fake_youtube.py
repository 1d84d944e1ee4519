"""A loopback stand-in for the YouTube endpoints that kb's YouTube parser uses.

It is an HTTP proxy: kb points KB_YOUTUBE_PROXY at it and sets
KB_YOUTUBE_INSECURE, so youtube-transcript-api and yt-dlp send their
requests for http://www.youtube.com/... here, as a proxy gets them
(absolute URI in the request line). yt-dlp asks the Innertube API over
https whatever it is told (since yt-dlp 2026.11): for www.youtube.com:443
the proxy answers CONNECT and plays YouTube inside the tunnel, with a
certificate of its own that kb does not check in insecure mode. It answers:

- GET  /watch?v=<id>            the watch page: INNERTUBE_API_KEY (for
                                youtube-transcript-api) and the initial
                                player response with videoDetails (for yt-dlp)
- POST /youtubei/v1/player      the Innertube player response with the
                                caption tracks of the video
- GET  /api/timedtext?v=&lang=  a caption track as timedtext XML

Requests that it does not know are answered 404 and kept in `unknown`.
"""

from __future__ import annotations

import datetime
import functools
import json
import ssl
import tempfile
import threading
from pathlib import Path
from dataclasses import dataclass, field
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

API_KEY = "fake-innertube-key"
# The page's ytcfg as YouTube sets it: yt-dlp reads the client context of
# its Innertube calls from it.
YTCFG = {"INNERTUBE_API_KEY": API_KEY,
         "INNERTUBE_CONTEXT": {"client": {"clientName": "WEB", "clientVersion": "2.20251201.00.00", "hl": "en"}}}


@dataclass
class FakeVideo:
    video_id: str
    title: str
    channel: str
    duration_s: int
    tracks: dict[str, list[tuple[float, float, str]]]  # language code -> (start, duration, text)
    playable: bool = True


@dataclass
class FakeYouTube:
    videos: dict[str, FakeVideo] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def __post_init__(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                fake._handle(self, "GET", b"")

            def do_POST(self):
                fake._handle(self, "POST", self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def do_CONNECT(self):
                if self.path != "www.youtube.com:443":
                    fake.unknown.append(f"CONNECT {self.path}")
                    self.send_response(405)
                    self.end_headers()
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                # The requests inside the tunnel come to a handler of their
                # own on the TLS socket; this connection ends with them.
                self.close_connection = True
                try:
                    tunnel = _tls_context().wrap_socket(self.connection, server_side=True)
                except ssl.SSLError as exc:  # the client did not accept the certificate
                    fake.unknown.append(f"TLS {self.path}: {exc.reason}")
                    return
                TunnelHandler(tunnel, self.client_address, self.server)

            def log_message(self, *args):
                pass

        class TunnelHandler(Handler):
            def parse_request(self):
                # Inside the tunnel the request line holds only the path;
                # through the proxy it holds the whole address. Made whole
                # here, every answer reads one kind of address.
                parsed = super().parse_request()
                self.path = f"https://www.youtube.com{self.path}"
                return parsed

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.proxy_url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def add(self, video: FakeVideo) -> None:
        self.videos[video.video_id] = video

    def __enter__(self) -> FakeYouTube:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- answers ---------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler, method: str, body: bytes) -> None:
        url = urlsplit(handler.path)
        self.requests.append(f"{method} {handler.path}")
        query = parse_qs(url.query)
        if url.hostname != "www.youtube.com":
            return self._send(handler, 404, "text/plain", b"not YouTube", method, handler.path)
        if method == "GET" and url.path == "/watch":
            return self._watch(handler, query.get("v", [""])[0])
        if method == "POST" and url.path == "/youtubei/v1/player":
            # youtube-transcript-api sends the key of the watch page; yt-dlp
            # sends none. A wrong key is refused.
            if query.get("key", [API_KEY]) != [API_KEY]:
                return self._send(handler, 403, "application/json", b"{}")
            return self._player(handler, json.loads(body or b"{}").get("videoId", ""))
        if method == "GET" and url.path == "/api/timedtext":
            return self._timedtext(handler, query.get("v", [""])[0], query.get("lang", [""])[0])
        self._send(handler, 404, "text/plain", b"unknown", method, handler.path)

    def _send(self, handler, code: int, content_type: str, data: bytes, method: str = "", path: str = "") -> None:
        if code == 404 and path:
            self.unknown.append(f"{method} {path}")
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _player_response(self, video: FakeVideo | None) -> dict:
        if video is None or not video.playable:
            return {"playabilityStatus": {"status": "ERROR", "reason": "This video is unavailable"}}
        tracks = [
            {"baseUrl": f"http://www.youtube.com/api/timedtext?v={video.video_id}&lang={lang}",
             "name": {"runs": [{"text": lang}]}, "languageCode": lang, "isTranslatable": False}
            for lang in video.tracks
        ]
        return {
            "playabilityStatus": {"status": "OK"},
            "videoDetails": {"videoId": video.video_id, "title": video.title, "author": video.channel,
                             "lengthSeconds": str(video.duration_s), "channelId": "UCfake", "shortDescription": ""},
            "microformat": {"playerMicroformatRenderer": {"ownerChannelName": video.channel,
                                                          "uploadDate": "2025-03-14", "publishDate": "2025-03-14"}},
            # YouTube leaves out the captions block when a video has no captions.
            **({"captions": {"playerCaptionsTracklistRenderer": {"captionTracks": tracks}}} if tracks else {}),
            "streamingData": {"formats": [], "adaptiveFormats": []},
        }

    def _watch(self, handler, video_id: str) -> None:
        # The page's player response has no captions: yt-dlp reads only the
        # metadata from it, and youtube-transcript-api takes the captions
        # from the Innertube player call.
        response = self._player_response(self.videos.get(video_id))
        response.pop("captions", None)
        player = json.dumps(response)
        video = self.videos.get(video_id)
        owner = {"videoSecondaryInfoRenderer": {"owner": {"videoOwnerRenderer": {
            "title": {"runs": [{"text": video.channel if video else ""}]}}}}}
        initial_data = json.dumps({"contents": {"twoColumnWatchNextResults": {"results": {"results": {"contents": [owner]}}}}})
        page = (
            "<!DOCTYPE html><html><head><title>YouTube</title></head><body><script>"
            f"ytcfg.set({json.dumps(YTCFG)});"
            f"var ytInitialPlayerResponse = {player};"
            f"var ytInitialData = {initial_data};"
            "</script></body></html>"
        )
        self._send(handler, 200, "text/html; charset=utf-8", page.encode())

    def _player(self, handler, video_id: str) -> None:
        data = json.dumps(self._player_response(self.videos.get(video_id))).encode()
        self._send(handler, 200, "application/json", data)

    def _timedtext(self, handler, video_id: str, lang: str) -> None:
        video = self.videos.get(video_id)
        if video is None or lang not in video.tracks:
            return self._send(handler, 404, "text/plain", b"no track", "GET", handler.path)
        lines = "".join(f'<text start="{start}" dur="{dur}">{escape(text)}</text>' for start, dur, text in video.tracks[lang])
        data = f'<?xml version="1.0" encoding="utf-8" ?><transcript>{lines}</transcript>'.encode()
        self._send(handler, 200, "text/xml; charset=utf-8", data)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """A server context with a self-signed certificate for
    www.youtube.com, made once per test process."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:
        context.load_cert_chain(*_self_signed_certificate(Path(folder), "www.youtube.com"))
    return context


def _self_signed_certificate(folder: Path, host: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
