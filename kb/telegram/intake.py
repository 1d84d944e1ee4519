"""Type detection: what kind of source a Telegram message holds.

The order of the checks is fixed: voice, document, text with URLs, plain
text. A message gets exactly one answer: `Accepted` (with the source type)
or `Refused` (with the reply that tells the sender why).

The functions read the attributes of aiogram's `Message`, `Document`,
`Voice` and `MessageEntity`, so tests and the inbox sensor can give them
any object with the same attributes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import parse_qs, urlsplit

from kb.readable import readable_text
from kb.telegram import replies

# The Bot API gives bots files up to 20 MB (a local Bot API server allows
# more; the setting telegram_max_file_mb follows it).
DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024

MIN_TEXT_CHARS = 50
MARKDOWN_SUFFIXES = (".md", ".markdown")
PDF_MIME = "application/pdf"

YOUTUBE_HOSTS = frozenset({"youtube.com", "www.youtube.com", "m.youtube.com", "music.youtube.com", "youtu.be"})

# A URL ends at white space, a quote or an angle bracket. Punctuation at
# its end belongs to the sentence: ",.;:!?" and quotes always, a closing ")"
# or "]" only when the URL has no matching opener. "(https://a.b/c)" gives
# https://a.b/c, and https://en.wikipedia.org/wiki/Rust_(language) keeps its ")".
URL_PATTERN = re.compile(r"https?://[^\s<>\"'`]+", re.IGNORECASE)
TRAILING_PUNCTUATION = ",.;:!?"
CLOSERS = {")": "(", "]": "["}


def trim_url(url: str) -> str:
    """A URL found in text, without the sentence punctuation at its end.
    The brackets are counted once (a count for each trimmed character was
    quadratic: 80,000 ")" took 3.3 s)."""
    counts = {mark: url.count(mark) for pair in CLOSERS.items() for mark in pair}
    end = len(url)
    while end:
        last = url[end - 1]
        if last in TRAILING_PUNCTUATION:
            end -= 1
        elif last in CLOSERS and counts[last] > counts[CLOSERS[last]]:
            counts[last] -= 1
            end -= 1
        else:
            break
    return url[:end]

# Message kinds that are not sources, in the words of the reply.
UNSUPPORTED_KINDS = (
    ("photo", "photo"),
    ("sticker", "sticker"),
    ("video", "video"),
    ("video_note", "video note"),
    ("animation", "animation"),
    ("audio", "audio file"),
    ("contact", "contact"),
    ("location", "location"),
    ("poll", "poll"),
)


@dataclass(frozen=True)
class Attachment:
    """A file that the bot must download before it writes the item."""

    file_id: str
    file_name: str
    mime_type: str | None
    file_size: int | None


@dataclass(frozen=True)
class Accepted:
    type: str  # web, youtube, pdf, md, text, voice
    url: str | None = None
    text: str | None = None  # the text of a text item, or the words around a URL
    attachment: Attachment | None = None


@dataclass(frozen=True)
class Refused:
    reply: str


def extract_urls(text: str | None, entities: Iterable | None = None) -> list[str]:
    """URLs in the text and in text_link entities, in order, each once."""
    found: list[str] = []
    for match in URL_PATTERN.finditer(text or ""):
        found.append(trim_url(match.group(0)))
    for entity in entities or ():
        if getattr(entity, "type", None) == "text_link" and getattr(entity, "url", None):
            found.append(entity.url.strip())
    return [url for url in dict.fromkeys(found) if url]  # in order, each once


def is_youtube(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in YOUTUBE_HOSTS


def youtube_video_id(url: str) -> str | None:
    """The video id of a YouTube URL: watch?v=, youtu.be/, /shorts/, /embed/, /live/."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host not in YOUTUBE_HOSTS:
        return None
    path = PurePosixPath(parts.path)
    if host == "youtu.be":
        candidate = path.parts[1] if len(path.parts) > 1 else ""
    elif parts.path.rstrip("/") == "/watch":
        candidate = parse_qs(parts.query).get("v", [""])[0]
    elif len(path.parts) > 2 and path.parts[1] in ("shorts", "embed", "live", "v"):
        candidate = path.parts[2]
    else:
        candidate = ""
    return candidate if re.fullmatch(r"[A-Za-z0-9_-]{11}", candidate) else None


def source_type_of_url(url: str) -> str:
    return "youtube" if is_youtube(url) else "web"


def safe_file_name(name: str | None, default: str) -> str:
    """A file name that stays inside its folder: no path, no leading dot."""
    base = PurePosixPath((name or "").replace("\\", "/")).name
    base = re.sub(r"[^\w.\- ]+", "_", base).strip(" .")
    return base[:120] or default


def classify(message, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Accepted | Refused:
    """The source that a message holds, or the reason that it holds none."""
    voice = getattr(message, "voice", None)
    if voice is not None:
        return _attachment_source("voice", voice, "voice.ogg", max_file_bytes)

    document = getattr(message, "document", None)
    if document is not None:
        name = document.file_name or ""
        if (document.mime_type or "").lower() == PDF_MIME:
            return _attachment_source("pdf", document, safe_file_name(name, "document.pdf"), max_file_bytes)
        if name.lower().endswith(MARKDOWN_SUFFIXES):
            return _attachment_source("md", document, safe_file_name(name, "document.md"), max_file_bytes)
        return Refused(replies.unsupported_document(name, document.mime_type))

    for attribute, kind in UNSUPPORTED_KINDS:
        if getattr(message, attribute, None):
            return Refused(replies.unsupported(kind))

    text = getattr(message, "text", None)
    if text is None:
        return Refused(replies.unsupported("message"))
    urls = extract_urls(text, getattr(message, "entities", None))
    if len(urls) > 1:
        return Refused(replies.several_urls(len(urls)))
    if len(urls) == 1:
        return Accepted(type=source_type_of_url(urls[0]), url=urls[0], text=text)
    stripped = readable_text(text).strip()
    if len(stripped) < MIN_TEXT_CHARS:
        return Refused(replies.too_short(len(stripped), MIN_TEXT_CHARS))
    return Accepted(type="text", text=stripped)


def _attachment_source(kind: str, file, file_name: str, max_file_bytes: int) -> Accepted | Refused:
    size = getattr(file, "file_size", None)
    if size is not None and size > max_file_bytes:
        return Refused(replies.download_failed(replies.too_large(size, max_file_bytes)))
    attachment = Attachment(
        file_id=file.file_id,
        file_name=file_name,
        mime_type=getattr(file, "mime_type", None),
        file_size=size,
    )
    return Accepted(type=kind, attachment=attachment)
