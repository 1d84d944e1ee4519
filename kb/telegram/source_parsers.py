"""Parsers of the Telegram inflow: one function per source type.

Each parser returns a `ParsedSource` (title, Markdown body, parser name) or
raises one of two errors, and the difference matters:
- `PermanentParseError`: the input itself is bad (HTTP 404, a corrupt,
  encrypted or empty file, text that is too short). A retry gives the same
  result, so the item fails at once.
- `TransientParseError`: the way to the input failed (timeout, HTTP 5xx,
  connection refused). The asset asks Dagster for a retry, inside the item's
  retry budget (kb/retries.py).
Every message names the input and the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from kb.guards.fetch_guard import FetchGuard, FetchRefused, GuardProxy
from kb.guards.response_body import BodyRefused, read_body
from kb.readable import readable_text
from kb.wiki.schema import kebab
from kb.wiki_files import split_frontmatter as wiki_split_frontmatter

from kb.telegram.intake import youtube_video_id

log = logging.getLogger(__name__)

# Shorter than this, a source holds too little to judge or to cite.
MIN_CHARS = {"web": 200, "pdf": 200, "youtube": 50, "md": 50, "text": 50, "voice": 30}

USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36 kb"
TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}
GONE_STATUS = {404, 410}
YOUTUBE_PARAGRAPH_SECONDS = 30
YOUTUBE_LANGUAGES = (["en"], ["ru"])  # then any language


class ParseError(Exception):
    """A source that could not be parsed."""


class PermanentParseError(ParseError):
    """The input is bad. Do not retry."""


class TransientParseError(ParseError):
    """The way to the input failed. Retry later."""


@dataclass
class ParsedSource:
    title: str
    body: str  # Markdown
    parser: str
    url: str | None = None
    extra: dict = field(default_factory=dict)  # more frontmatter: channel, pages, language ...

    @property
    def char_count(self) -> int:
        return len(self.body.strip())


# --- common ----------------------------------------------------------------------


# One rule for names: the wiki's kebab case (kb.wiki.schema).
slugify = kebab


def content_hash(body: str) -> str:
    """Equal for the same words, whatever the white space or case."""
    return hashlib.sha256(" ".join(body.lower().split()).encode()).hexdigest()


# "# Title" and "# Title ##". One greedy group that ends on a character that
# is not white space: a lazy group before "\s*#*\s*$" tried each split of a
# run of spaces, and a line of 2,000 spaces took 13 s (7 December 2026).
ATX_HEADING = re.compile(r"#\s+(.*\S)")


def first_heading(markdown: str) -> str | None:
    for line in markdown.splitlines():
        match = ATX_HEADING.match(line.strip())
        if match and (title := match.group(1).rstrip("#").strip()):
            return title
    return None


def first_line(text: str, max_length: int = 80) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= max_length else line[: max_length - 1].rstrip() + "…"


def check_length(kind: str, parsed: ParsedSource, where: str) -> None:
    minimum = MIN_CHARS[kind]
    if parsed.char_count < minimum:
        raise PermanentParseError(
            f"{where}: the {kind} source has {parsed.char_count} characters of text; it needs {minimum} or more"
        )


def render_markdown(frontmatter: dict, body: str) -> str:
    head = yaml.safe_dump(frontmatter, sort_keys=False, allow_unicode=True, width=1000).strip()
    return f"---\n{head}\n---\n\n{body.strip()}\n"


def split_frontmatter(text: str) -> tuple[dict, str]:
    """(frontmatter, body) of a parsed source file, as render_markdown wrote
    it. The frontmatter rule is the wiki's own (kb.wiki_files)."""
    page = wiki_split_frontmatter(text)
    if page.data is None:
        return {}, text
    body = "\n".join(page.body)
    # render_markdown puts one empty line after the frontmatter.
    body = body[1:] if body.startswith("\n") else body
    return page.data, body + ("\n" if text.endswith("\n") and body else "")


def decode_text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PermanentParseError(f"{where}: not UTF-8 text (byte {exc.start} is invalid)") from None


# --- web ---------------------------------------------------------------------------


@dataclass
class FetchedPage:
    url: str  # after redirects
    content_type: str
    body: bytes
    blocked: str | None = None  # "HTTP 403" when the server refused the script
    charset: str | None = None  # from the Content-Type header, when the server names one

    def html(self) -> str | bytes:
        """The page for trafilatura. With no charset in the header, the bytes:
        trafilatura reads <meta charset> and guesses the rest. A decode as
        UTF-8 turned every Latin-1 page into replacement characters, with
        no error (found by tests/test_bad_input.py)."""
        return _decoded(self.body, self.charset) if self.charset else self.body


def fetch_page(url: str, *, timeout_s: float, guard: FetchGuard | None = None) -> FetchedPage:
    """GET the URL (redirects followed, each one checked by the fetch guard).
    Classifies every failure. A private address is a permanent failure."""
    from kb.enrich.extract import MAX_PAGE_CHARS

    guard = guard or FetchGuard.from_settings()
    try:
        guard.check_url(url)
        with guard.httpx_client(follow_redirects=True, timeout=timeout_s, headers={"User-Agent": USER_AGENT}) as client:
            with client.stream("GET", url) as response:
                status = response.status_code
                if status in GONE_STATUS:
                    raise PermanentParseError(f"{url}: HTTP {status}, the page does not exist")
                if status in TRANSIENT_STATUS:
                    raise TransientParseError(f"{url}: HTTP {status}, the server is busy or failing")
                if status >= 400:
                    # 401 and 403: often a wall against scripts. The browser may pass it.
                    return FetchedPage(str(response.url), "", b"", blocked=f"HTTP {status}")
                try:
                    # The limit of extract_html: a larger page would be refused after its read.
                    body = read_body(response, limit=MAX_PAGE_CHARS, what=f"{url}: the page")
                except BodyRefused as exc:
                    raise (TransientParseError if exc.reason == "too_slow" else PermanentParseError)(str(exc)) from None
                header = response.headers.get("content-type", "")
                content_type = header.split(";")[0].strip().lower()
                return FetchedPage(str(response.url), content_type, body, charset=_charset(header))
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError) as exc:
        raise TransientParseError(f"{url}: {type(exc).__name__}: {exc}") from None
    except httpx.UnsupportedProtocol as exc:
        raise PermanentParseError(f"{url}: not a web address ({exc})") from None
    except httpx.InvalidURL as exc:
        raise PermanentParseError(f"{url}: not a valid web address ({exc})") from None
    except FetchRefused as exc:
        raise PermanentParseError(f"{url}: {exc}") from None


def _charset(content_type_header: str) -> str | None:
    """The charset that a Content-Type header names, when Python knows it."""
    import codecs

    for param in content_type_header.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            value = value.strip().strip("'\"")
            try:
                return codecs.lookup(value).name
            except LookupError:
                return None
    return None


def _decoded(data: bytes, charset: str) -> str:
    # The server named the charset; a byte that breaks it is the server's
    # fault and becomes U+FFFD, not a failure of the whole page.
    return data.decode(charset, errors="replace").removeprefix("\ufeff")


def extract_html(html: str | bytes, url: str) -> tuple[str, str | None]:
    """(Markdown text, title) of an HTML page, by the same extraction as the
    documents stage (kb.enrich.extract.extract_html): one path for both
    inflows, measured by benchmarks/bench_extraction.py."""
    from kb.enrich.extract import PageTooLarge, html_to_text
    from kb.enrich.extract import extract_html as extract_main_content

    try:
        extracted = extract_main_content(html, url)
    except PageTooLarge as exc:
        raise PermanentParseError(str(exc)) from None
    except (ValueError, RecursionError) as exc:  # lxml on broken or very deep trees
        raise PermanentParseError(f"{url}: the HTML cannot be parsed ({type(exc).__name__})") from None
    return html_to_text(extracted.text_html, markdown=True).strip(), extracted.title


def parse_web(url: str, *, timeout_s: float = 30.0, render: Callable[[str], str] | None = None) -> ParsedSource:
    """Fetch with httpx and extract as the documents stage does. Pages that need
    JavaScript (too little text without it, or a wall against scripts) are
    rendered by `render` (the browser) and extracted again."""
    page = fetch_page(url, timeout_s=timeout_s)
    if page.content_type == "application/pdf":
        return parse_pdf_bytes(page.body, url, url=url)
    if page.content_type in ("text/plain", "text/markdown"):
        # As it came: no extraction cleans it, and a terminal escape in it
        # reached the owner's terminal through `kb search` (readable_text).
        body = readable_text(_decoded(page.body, page.charset) if page.charset else decode_text(page.body, url))
        title = first_heading(body) or first_line(body)
        return ParsedSource(title, body, "httpx", url=page.url)
    text, title = "", None
    if not page.blocked:
        if page.content_type and "html" not in page.content_type and "xml" not in page.content_type:
            raise PermanentParseError(f"{url}: content type {page.content_type} is not a web page")
        text, title = extract_html(page.html(), page.url)
        if len(text) >= MIN_CHARS["web"]:
            return ParsedSource(title or first_line(text) or page.url, text, "trafilatura", url=page.url)
    if render is None:
        if page.blocked:
            raise PermanentParseError(f"{url}: {page.blocked}, and no browser to try again")
        return ParsedSource(title or page.url, text, "trafilatura", url=page.url)
    html = render(page.url)
    rendered_text, rendered_title = extract_html(html, page.url)
    if len(rendered_text) > len(text):
        text, title = rendered_text, rendered_title or title
    if not text and page.blocked:
        raise PermanentParseError(f"{url}: {page.blocked}, and the browser found no text either")
    return ParsedSource(title or first_line(text) or page.url, text, "trafilatura+playwright", url=page.url)


def render_with_browser(browser, url: str, timeout_s: float) -> str:
    """The HTML of a page after its scripts ran, from the browser resource's
    clean context (no cookies, no login)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from kb.enrich.extract import MAX_PAGE_CHARS
    from kb.x.browser import navigation_refusal, page_html, watch_navigation

    try:
        with browser.clean_context() as context:
            page = context.new_page()
            watch_navigation(page)
            try:
                page.goto(url, wait_until="networkidle", timeout=timeout_s * 1000)
            finally:
                # The fetch guard's proxy refused the page or a redirect of it.
                if (refusal := navigation_refusal(page, url)) is not None:
                    raise PermanentParseError(f"{url}: {refusal}")
            return page_html(page, timeout_s, MAX_PAGE_CHARS)
    except PlaywrightTimeout as exc:
        raise TransientParseError(f"{url}: the browser timed out ({str(exc).splitlines()[0]})") from None
    except PlaywrightError as exc:
        raise TransientParseError(f"{url}: the browser failed ({str(exc).splitlines()[0]})") from None


# --- YouTube -------------------------------------------------------------------------


def youtube_session(proxy: str = "", insecure: bool = False):
    """A requests session for youtube-transcript-api.

    proxy: an HTTP proxy for every YouTube request. insecure: ask YouTube
    over plain http, so that a plain-http proxy (a loopback stand-in in
    tests) can answer; a proxy cannot see inside TLS."""
    import requests

    class PlainHttpSession(requests.Session):
        def request(self, method, url, *args, **kwargs):
            if url.startswith("https://"):
                url = "http://" + url[len("https://"):]
            return super().request(method, url, *args, **kwargs)

    session = PlainHttpSession() if insecure else requests.Session()
    if proxy:
        session.proxies = {"http": proxy, "https": proxy}
        session.trust_env = False
    return session


def format_timestamp(seconds: float) -> str:
    total = int(seconds)
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def group_paragraphs(snippets: Iterable, seconds: int = YOUTUBE_PARAGRAPH_SECONDS) -> list[str]:
    """Transcript snippets as paragraphs of about `seconds` each: `[HH:MM:SS] text`."""
    paragraphs: list[str] = []
    start: float | None = None
    words: list[str] = []
    for snippet in snippets:
        text = " ".join(str(snippet.text).split())
        if not text:
            continue
        if start is not None and snippet.start - start >= seconds:
            paragraphs.append(f"[{format_timestamp(start)}] {' '.join(words)}")
            start, words = None, []
        if start is None:
            start = snippet.start
        words.append(text)
    if words:
        paragraphs.append(f"[{format_timestamp(start)}] {' '.join(words)}")
    return paragraphs


def youtube_transcript(video_id: str, session) -> tuple[list, str]:
    """(snippets, language code): English, then Russian, then any language."""
    from youtube_transcript_api import YouTubeTranscriptApi
    from youtube_transcript_api import _errors as yt_errors

    where = f"YouTube video {video_id}"
    try:
        transcripts = YouTubeTranscriptApi(http_client=session).list(video_id)
        chosen = None
        for languages in YOUTUBE_LANGUAGES:
            with contextlib.suppress(yt_errors.NoTranscriptFound):
                chosen = transcripts.find_transcript(languages)
                break
        if chosen is None:
            chosen = next(iter(transcripts), None)
        if chosen is None:
            raise PermanentParseError(f"{where}: the video has no transcript")
        fetched = chosen.fetch()
        return list(fetched), chosen.language_code
    except (yt_errors.RequestBlocked, yt_errors.YouTubeRequestFailed) as exc:
        raise TransientParseError(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    except yt_errors.CouldNotRetrieveTranscript as exc:
        # TranscriptsDisabled, VideoUnavailable, AgeRestricted, ...: the video decides.
        raise PermanentParseError(f"{where}: {type(exc).__name__}") from None
    except OSError as exc:  # requests' connection errors
        raise TransientParseError(f"{where}: {type(exc).__name__}: {exc}") from None


class _QuietYtDlpLogger:
    """yt-dlp prints to the terminal; send its words to debug logging instead."""

    def debug(self, msg):
        log.debug("yt-dlp: %s", msg)

    info = debug
    warning = debug

    def error(self, msg):
        log.debug("yt-dlp error: %s", msg)


def youtube_metadata(video_id: str, *, proxy: str = "", insecure: bool = False, timeout_s: float = 30.0) -> dict:
    """Title, channel, duration and upload date from yt-dlp, or {} when it
    fails: the transcript matters, the metadata is a help."""
    import yt_dlp

    options = {
        "quiet": True, "no_warnings": True, "skip_download": True, "noplaylist": True,
        "logger": _QuietYtDlpLogger(), "socket_timeout": timeout_s,
        # Only metadata is needed: no formats, so no player JavaScript.
        "ignore_no_formats_error": True,
        "extractor_args": {"youtube": {"player_client": ["web"], "player_skip": ["configs", "js"]}},
    }
    if proxy:
        options["proxy"] = proxy
    if insecure:
        # yt-dlp asks the Innertube API over https whatever it is told
        # (2026.11): the loopback stand-in answers there with a certificate
        # of its own.
        options["prefer_insecure"] = True
        options["nocheckcertificate"] = True
    scheme = "http" if insecure else "https"
    try:
        with yt_dlp.YoutubeDL(options) as ydl:
            info = ydl.extract_info(f"{scheme}://www.youtube.com/watch?v={video_id}", download=False, process=False)
    except Exception as exc:  # yt-dlp raises many kinds; none of them stops the parse
        log.warning("YouTube video %s: no metadata from yt-dlp (%s)", video_id, type(exc).__name__)
        return {}
    info = info or {}
    return {
        key: info.get(key)
        for key in ("title", "channel", "uploader", "duration", "upload_date")
        if info.get(key) not in (None, "")
    }


def parse_youtube(url: str, *, proxy: str = "", insecure: bool = False, timeout_s: float = 30.0,
                  guard: FetchGuard | None = None) -> ParsedSource:
    """The transcript and metadata of a YouTube video. kb asks YouTube
    itself (the link gives only the video id). Without a proxy of the owner
    (KB_YOUTUBE_PROXY), every request of youtube-transcript-api and yt-dlp
    goes through the fetch guard's proxy, so no redirect reaches a private
    address."""
    video_id = youtube_video_id(url)
    if not video_id:
        raise PermanentParseError(f"{url}: no YouTube video id in the address")
    with contextlib.ExitStack() as stack:
        guard_proxy = None
        if not proxy:
            guard_proxy = stack.enter_context(GuardProxy(guard or FetchGuard.from_settings(), timeout_s=timeout_s))
            proxy = guard_proxy.url
        try:
            snippets, language = youtube_transcript(video_id, youtube_session(proxy, insecure))
        except ParseError:
            if guard_proxy is not None and guard_proxy.refused:
                raise PermanentParseError(f"YouTube video {video_id}: {guard_proxy.refused[0][2]}") from None
            raise
        metadata = youtube_metadata(video_id, proxy=proxy, insecure=insecure, timeout_s=timeout_s)
    body = "\n\n".join(group_paragraphs(snippets))
    title = metadata.get("title") or f"YouTube video {video_id}"
    extra = {"video_id": video_id, "language": language}
    if metadata.get("channel") or metadata.get("uploader"):
        extra["channel"] = metadata.get("channel") or metadata.get("uploader")
    if metadata.get("duration"):
        extra["duration_s"] = int(metadata["duration"])
    if metadata.get("upload_date"):
        extra["upload_date"] = str(metadata["upload_date"])
    return ParsedSource(title, body, "youtube-transcript-api", url=url, extra=extra)


# --- files ---------------------------------------------------------------------------


def parse_pdf_bytes(data: bytes, where: str, url: str | None = None) -> ParsedSource:
    import pymupdf
    import pymupdf4llm

    from kb.enrich.extract import PdfTooLarge, layout_affordable, pdf_paragraphs

    if not data:
        raise PermanentParseError(f"{where}: the PDF file is empty")
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except (pymupdf.FileDataError, RuntimeError, ValueError) as exc:
        raise PermanentParseError(f"{where}: not a readable PDF ({exc})") from None
    with doc:
        if doc.needs_pass:
            raise PermanentParseError(f"{where}: the PDF is encrypted (it needs a password)")
        if doc.page_count == 0:
            raise PermanentParseError(f"{where}: the PDF has no pages")
        try:
            if not layout_affordable(doc):
                # The layout analysis costs about a second per page, and more
                # on a page of many strings: such a PDF is read as plain text,
                # as the documents stage does.
                body = "\n\n".join(pdf_paragraphs(doc))
            else:
                # use_ocr=False: no OCR engine is installed, and a scan without a
                # text layer is better refused (too short) than guessed.
                body = pymupdf4llm.to_markdown(doc, use_ocr=False, show_progress=False)
        except PdfTooLarge as exc:
            raise PermanentParseError(f"{where}: {exc.reason}") from None
        except Exception as exc:  # the layout parser fails in many ways on damaged files
            raise PermanentParseError(f"{where}: the PDF text cannot be read ({type(exc).__name__}: {exc})") from None
        meta_title = (doc.metadata or {}).get("title") or ""
        pages = doc.page_count
    title = meta_title.strip() or first_heading(body) or first_line(body) or Path(where).stem
    return ParsedSource(title, body.strip(), "pymupdf4llm", url=url, extra={"pages": pages})


def parse_pdf(path: Path) -> ParsedSource:
    return parse_pdf_bytes(read_file(path), str(path))


def parse_markdown(path: Path) -> ParsedSource:
    body = readable_text(decode_text(read_file(path), str(path))).strip()
    title = first_heading(body) or path.stem
    return ParsedSource(title, body, "markdown")


def parse_text(text: str) -> ParsedSource:
    body = text.strip()
    return ParsedSource(first_line(body) or "Note", body, "text")


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PermanentParseError(f"{path}: the file is missing") from None


# --- voice ---------------------------------------------------------------------------


def parse_voice(path: Path, model: str = "") -> ParsedSource:
    """faster-whisper on the CPU. The VAD filter drops silence, so a long
    pause does not turn into invented words. The model is the one that the
    video transcripts use (KB_WHISPER_MODEL, default small; the bundled
    tiny.en when it cannot load), loaded once per process for both.

    An English-only model writes English-sounding nonsense for speech in
    another language, and that text would go on to the gate and the wiki.
    So with such a model, a note that it is not sure is English fails with
    a clear reason. Title: the first 60 characters of the text."""
    from kb.enrich.transcriber import ENGLISH_ONLY_MIN_LOGPROB, load_whisper

    if not path.exists():
        raise PermanentParseError(f"{path}: the file is missing")
    if path.stat().st_size == 0:
        raise PermanentParseError(f"{path}: the voice file is empty")
    import av  # PyAV comes with faster-whisper

    from kb.enrich.modal_apps.shared import audio_too_long

    try:
        with av.open(str(path)) as container:
            too_long = audio_too_long(container) if container.streams.audio else "it holds no sound"
    except Exception as exc:  # PyAV raises its own error kinds for data that is not audio
        raise PermanentParseError(f"{path}: not a readable audio file ({type(exc).__name__})") from None
    if too_long:
        raise PermanentParseError(f"{path}: the voice note is not transcribed: {too_long}")
    whisper, model_name, english_only = load_whisper(model)
    try:
        segments, info = whisper.transcribe(str(path), vad_filter=True)
        segments = list(segments)
    except Exception as exc:  # PyAV raises its own error kinds for data that is not audio
        raise PermanentParseError(f"{path}: not a readable audio file ({type(exc).__name__})") from None
    text = " ".join(segment.text.strip() for segment in segments).strip()
    language = info.language
    if english_only and segments:
        seconds = sum(max(s.end - s.start, 0.01) for s in segments)
        confidence = sum(s.avg_logprob * max(s.end - s.start, 0.01) for s in segments) / seconds
        if confidence < ENGLISH_ONLY_MIN_LOGPROB:
            from kb.enrich import voice_model

            why = voice_model.english_only_reason() or (
                f"The model {model_name} knows English only. Set KB_WHISPER_MODEL to a multilingual model "
                "(small), or send the text.")
            raise PermanentParseError(
                f"{path}: the speech is not English, or not clear enough (confidence {confidence:.2f} < "
                f"{ENGLISH_ONLY_MIN_LOGPROB}). {why}")
        language = "en"
    title = text[:60].rstrip() + ("…" if len(text) > 60 else "")
    extra = {"language": language, "duration_s": round(info.duration, 1), "whisper_model": model_name}
    return ParsedSource(title, text, "faster-whisper", extra=extra)
