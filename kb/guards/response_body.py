"""The body of a stranger's HTTP answer, read within a size and a time.

Why kb decodes the body itself: httpx undoes each content encoding of a
chunk whole, with no limit, before a loop over iter_bytes() sees the
chunk. `Content-Encoding: gzip, gzip` made 1,827 bytes on the wire into
1 GiB in memory (2 GB of peak memory before kb's size check ran); a few
kB more brought the out-of-memory killer (the red team, 7 December 2026).
Here each step of the decoder gives at most the bytes that the limit
still allows.

Why a deadline of its own: httpx's timeout is for one read. A server that
sends one byte a second held a fetch for as long as it liked (until
Dagster's longest run time, 2 hours, with the run's pool slot).

The fetch guard's clients ask for gzip and deflate only (ACCEPT_ENCODING);
an answer in another encoding, or in more than one, is refused by name.
"""

from __future__ import annotations

import time
import zlib

import httpx

ACCEPT_ENCODING = "gzip, deflate"
# The longest time for one body, from the first byte of the answer.
BODY_DEADLINE_S = 300.0


class BodyRefused(Exception):
    """The body is not read. `reason` is short and stable; the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _decoder(coding: str | None, what: str):
    if coding is None:
        return None
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return _Deflate()
    raise BodyRefused("encoding", f"{what} comes in the content encoding {coding!r}; kb reads gzip and deflate only")


class _Deflate:
    """"deflate" as servers send it: zlib's format, or raw deflate (as httpx reads it)."""

    def __init__(self) -> None:
        self.inner = zlib.decompressobj()
        self.first = True

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if self.first:
            self.first = False
            try:
                return self.inner.decompress(data, max_length)
            except zlib.error:
                self.inner = zlib.decompressobj(-zlib.MAX_WBITS)
        return self.inner.decompress(data, max_length)

    @property
    def unconsumed_tail(self) -> bytes:
        return self.inner.unconsumed_tail


def read_body(response: httpx.Response, *, limit: int, what: str, deadline_s: float | None = None) -> bytes:
    """The decoded body of a streamed `response`: at most `limit` bytes
    after decoding, read within `deadline_s` (BODY_DEADLINE_S). BodyRefused
    names `what` ("the page", "the file") and the limit that it passed."""
    deadline_s = deadline_s or BODY_DEADLINE_S
    codings = [part.strip().lower() for part in response.headers.get("content-encoding", "").split(",")]
    codings = [coding for coding in codings if coding and coding != "identity"]
    if len(codings) > 1:
        raise BodyRefused("encoding", f"{what} comes in {len(codings)} content encodings ({', '.join(codings)}); "
                                      "kb reads one")
    decoder = _decoder(codings[0] if codings else None, what)
    deadline = time.monotonic() + deadline_s
    body = bytearray()
    try:
        for raw in response.iter_raw():
            data = raw
            while data:
                if decoder is None:
                    body += data
                    data = b""
                else:
                    body += decoder.decompress(data, limit - len(body) + 1)
                    data = decoder.unconsumed_tail
                if len(body) > limit:
                    raise BodyRefused("too_large", f"{what} is larger than {limit // (1024 * 1024)} MB")
            if time.monotonic() > deadline:
                raise BodyRefused("too_slow", f"{what} did not come within {deadline_s:.0f} s")
    except zlib.error as exc:
        raise BodyRefused("encoding", f"{what} is not valid {codings[0]} ({exc})") from None
    return bytes(body)
