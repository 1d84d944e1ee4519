"""Code that runs both on this machine and in the Modal containers: media
downloads with a byte-count check, and the caption prompt and answer.

Only the standard library and httpx (see __init__.py for why).
"""

import base64
import json
import re
import time

import httpx

USER_AGENT = "kb/0.1 (personal knowledge base)"

IMAGE_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}

CAPTION_INSTRUCTIONS = """\
Describe this image for a search index. Answer with one JSON object and nothing else:
{"caption": "<one to three English sentences: what the image shows>",
 "ocr_text": "<every readable word in the image, as written, in its own language; an empty string when there is no text>"}
"""


class FetchError(Exception):
    """A download failed. `reason` is short and stable (it goes into the
    status tables); `detail` is for the owner."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# The longest time for one media download. httpx's timeout is for one
# read: a server that sent a byte every 2 s held a download for days.
MEDIA_DEADLINE_S = 600.0


def fetch_media(url: str, *, max_bytes: int, timeout_s: float = 60.0, client: httpx.Client | None = None) -> bytes:
    """The bytes at `url`, complete, or FetchError.

    The byte count must equal Content-Length: a download cut short still
    decodes, and a cut video decodes to silence without a word, so a short
    read is an error here and not a transcript with no speech later.

    Photos and videos come packed already: kb asks for the bytes as they
    are (identity) and refuses a content encoding. httpx undoes an encoding
    chunk by chunk with no limit: 200 kB of gzip became 200 MB in memory,
    past the limit of 20 MB (the red team, 7 December 2026)."""
    own_client = client is None
    client = client or httpx.Client(timeout=timeout_s, follow_redirects=True, headers={"User-Agent": USER_AGENT})
    deadline = time.monotonic() + MEDIA_DEADLINE_S
    try:
        with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as response:
            if response.status_code >= 400:
                raise FetchError(f"http_{response.status_code}", f"{url} answered HTTP {response.status_code}")
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise FetchError("encoded", f"{url} came in the content encoding {encoding!r}; kb reads media as it is")
            expected = response.headers.get("content-length", "")
            expected_bytes = int(expected) if expected.isdigit() else None
            if expected_bytes is not None and expected_bytes > max_bytes:
                raise FetchError("too_large", f"{url} has {expected_bytes} bytes; the limit is {max_bytes}")
            parts = []
            for part in response.iter_raw():
                parts.append(part)
                if response.num_bytes_downloaded > max_bytes:
                    raise FetchError("too_large", f"{url} sent more than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise FetchError("timeout", f"{url} did not come within {MEDIA_DEADLINE_S:.0f} s")
            # Content-Length counts the bytes on the wire, before any
            # content-encoding is undone: compare it with the raw count.
            received = response.num_bytes_downloaded
    except httpx.RemoteProtocolError as exc:
        # The server closed the connection before Content-Length bytes came.
        raise FetchError("truncated", f"{url}: the download stopped early ({exc})") from None
    except httpx.TimeoutException as exc:
        raise FetchError("timeout", f"{url}: {type(exc).__name__}") from None
    except httpx.HTTPError as exc:
        raise FetchError("error", f"{url}: {type(exc).__name__}: {exc}") from None
    finally:
        if own_client:
            client.close()
    if expected_bytes is not None and received != expected_bytes:
        raise FetchError("truncated", f"{url}: got {received} of {expected_bytes} bytes (Content-Length)")
    if received == 0:
        raise FetchError("truncated", f"{url}: the body is empty")
    return b"".join(parts)


def image_type(data: bytes) -> str | None:
    """The MIME type of an image from its first bytes, or None when the bytes
    are not a PNG, JPEG, GIF or WebP image."""
    for magic, mime in IMAGE_TYPES.items():
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_data_url(data: bytes, url: str) -> str:
    """A data: URL of the image. Local OpenAI-compatible servers and vLLM
    cannot always fetch a remote URL themselves; every one reads a data URL."""
    mime = image_type(data)
    if mime is None:
        raise FetchError("not_image", f"{url}: the bytes are not a PNG, JPEG, GIF or WebP image")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def caption_messages(data_url: str) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "text", "text": CAPTION_INSTRUCTIONS},
        {"type": "image_url", "image_url": {"url": data_url}},
    ]}]


class CaptionAnswerError(ValueError):
    """The model's answer is not the JSON object that the prompt asked for."""


def parse_caption_answer(content: str | None) -> tuple[str, str]:
    """(caption, ocr_text) from the model's answer, or CaptionAnswerError."""
    text = (content or "").strip()
    # Vision models often wrap the JSON in a Markdown fence or add a sentence.
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise CaptionAnswerError(f"the answer has no JSON object: {text[:80]!r}")
    try:
        data = json.loads(text[start:end + 1])
    except ValueError as exc:
        raise CaptionAnswerError(f"the answer is not JSON ({type(exc).__name__}): {text[:80]!r}") from None
    if not isinstance(data, dict):
        raise CaptionAnswerError(f"the answer is not a JSON object: {text[:80]!r}")
    caption = data.get("caption")
    if not isinstance(caption, str) or not caption.strip():
        raise CaptionAnswerError(f"the answer has no caption: {text[:80]!r}")
    ocr = data.get("ocr_text") or ""
    if isinstance(ocr, list):
        ocr = "\n".join(str(line) for line in ocr)
    return " ".join(caption.split()), re.sub(r"[ \t]+\n", "\n", str(ocr)).strip()


# The longest sound that kb transcribes. faster-whisper decodes the whole
# file into memory first (16 kHz float32; about 0.9 GB of peak memory an
# hour here): a voice note of 930 kB held an hour of silence, and a WAV of
# 7 kB at 1 Hz an hour, which ran out of memory (the red team, 7 December
# 2026). A talk of two hours still passes.
MAX_AUDIO_S = 2 * 3600


def audio_too_long(container) -> str | None:
    """Why the sound of an open PyAV container is not transcribed, or None:
    it lasts longer than MAX_AUDIO_S, or no length can be read from it."""
    import av

    seconds = container.duration / av.time_base if container.duration else None
    if seconds is None:
        stream = container.streams.audio[0]
        seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else None
    if seconds is None:
        return "the file does not say how long its sound lasts"
    if seconds > MAX_AUDIO_S:
        return f"its sound lasts {seconds / 60:.0f} minutes; kb transcribes at most {MAX_AUDIO_S // 60} minutes"
    return None


def transcription(whisper, path: str) -> dict:
    """faster-whisper's reading of one media file: {"language",
    "language_probability", "duration_s", "segments": [[start, end, text]],
    "audio": bool}, or {"reason": "not_media", "detail"}.

    The VAD filter drops silence, so a long pause does not turn into
    invented words. A video with no sound track has no speech: that is a
    result ("audio": False), not an error."""
    import av  # PyAV comes with faster-whisper

    try:
        with av.open(path) as container:
            has_audio = bool(container.streams.audio)
            duration = container.duration / av.time_base if container.duration else None
            too_long = audio_too_long(container) if has_audio else None
        if not has_audio:
            return {"language": None, "language_probability": None, "duration_s": duration,
                    "segments": [], "audio": False}
        if too_long:
            return {"reason": "too_long", "detail": too_long}
        segments, info = whisper.transcribe(path, vad_filter=True)
        parts = [[round(s.start, 2), round(s.end, 2), s.text.strip()] for s in segments]
    except av.error.FFmpegError as exc:
        return {"reason": "not_media", "detail": f"{type(exc).__name__}: {exc}"}
    except MemoryError:
        return {"reason": "too_long", "detail": "its sound does not fit into memory"}
    return {"language": info.language, "language_probability": info.language_probability,
            "duration_s": info.duration, "segments": parts, "audio": True}
