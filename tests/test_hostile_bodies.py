"""Answers of a stranger's server that cost memory or time, not bytes on
the wire (kb/guards/response_body.py): the red team of 7 December 2026
found each one. A real HTTP server on loopback sends them; kb's real
fetchers read them through the fetch guard (the page of a Telegram link,
and the file of a bookmark's link)."""

from __future__ import annotations

import contextlib
import gzip
import time
import tracemalloc
import zlib

import pytest

from kb.guards.fetch_guard import FetchGuard
from kb.telegram.source_parsers import PermanentParseError, TransientParseError, fetch_page
from tests.loopback import LoopbackServer, QuietHandler

MIB = 1 << 20
# Each bomb is made for the test (gzip of tens of MiB of zeros: about 0.1 s
# of CPU each), and the servers answer from threads.
pytestmark = pytest.mark.slow


def zeros_gzip(size: int) -> bytes:
    """gzip of `size` zero bytes, made in steps: 100 MiB become about 100 kB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(MIB)
    return b"".join(packer.compress(block) for _ in range(size // MIB)) + packer.flush()


class Hostile(LoopbackServer):
    """Serves `body` with `headers`, or drips `drip` one byte at a time."""

    def __init__(self, body: bytes = b"", headers: dict | None = None, content_type: str = "text/html",
                 drip: bytes = b"", every_s: float = 0.0):
        server = self

        class Handler(QuietHandler):
            def do_GET(self):
                if drip:
                    self.send_response(200)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(drip)))
                    self.end_headers()
                    for byte in drip:
                        if server.stopped:
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(every_s)
                    return
                self.send_body(200, body, content_type, headers)

        self.stopped = False
        self.bind(Handler)

    def __exit__(self, *exc):
        self.stopped = True
        super().__exit__(*exc)


def guard_for(server: Hostile) -> FetchGuard:
    return FetchGuard(allowed_hosts=frozenset({server.base_url.removeprefix("http://")}))


@contextlib.contextmanager
def traced_peak():
    """The peak of Python's allocations inside the block, in MiB (decoded
    bodies are bytes objects). Not the process's maxrss: in a pytest worker
    an earlier test may have set a higher peak, and a test of it could not fail."""
    peak = {}
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak["mib"] = tracemalloc.get_traced_memory()[1] / MIB
        tracemalloc.stop()


def test_two_layers_of_gzip_are_refused_before_a_byte_is_decoded():
    """`Content-Encoding: gzip, gzip`: 1,827 bytes on the wire became 1 GiB
    in memory (2 GB of peak memory) before kb's size check ran. Here 64 MiB."""
    body = gzip.compress(zeros_gzip(64 * MIB))
    assert len(body) < 2_000
    with Hostile(body, {"Content-Encoding": "gzip, gzip"}) as server, traced_peak() as peak:
        with pytest.raises(PermanentParseError, match=r"/bomb: the page comes in 2 content encodings \(gzip, gzip\)"):
            fetch_page(f"{server.base_url}/bomb", timeout_s=10, guard=guard_for(server))
    assert peak["mib"] < 8, peak


@pytest.mark.parametrize("coding, packed", [
    ("gzip", zeros_gzip(128 * MIB)),
    ("deflate", zlib.compress(bytes(128 * MIB), 9)),
])
def test_one_layer_that_unpacks_past_the_limit_stops_at_the_limit(coding, packed):
    """128 MiB of zeros in about 128 kB: the decoder gives at most the bytes
    that the limit (10 MB a page) still allows. httpx decodes each chunk of
    the wire whole (64 kB of it: 64 MiB)."""
    with Hostile(packed, {"Content-Encoding": coding}) as server, traced_peak() as peak:
        with pytest.raises(PermanentParseError, match=r"the page is larger than 10 MB"):
            fetch_page(f"{server.base_url}/bomb", timeout_s=10, guard=guard_for(server))
    assert peak["mib"] < 40, peak


def test_an_honest_gzip_page_and_an_unknown_encoding():
    page = b"<html><body><p>" + b"A page that the server packs. " * 200 + b"</p></body></html>"
    with Hostile(gzip.compress(page), {"Content-Encoding": "gzip"}) as server:
        assert fetch_page(f"{server.base_url}/page", timeout_s=10, guard=guard_for(server)).body == page
    with Hostile(page, {"Content-Encoding": "br"}) as server:
        with pytest.raises(PermanentParseError, match=r"comes in the content encoding 'br'; kb reads gzip and deflate"):
            fetch_page(f"{server.base_url}/page", timeout_s=10, guard=guard_for(server))


def test_a_page_that_drips_in_ends_at_the_deadline(monkeypatch):
    """One byte every 0.2 s never passes httpx's timeout of one read; the
    body's own deadline ends the fetch (here 1 s in place of 300 s)."""
    from kb.guards import response_body

    monkeypatch.setattr(response_body, "BODY_DEADLINE_S", 1.0)
    with Hostile(drip=b"<html>" + b"x" * 200, every_s=0.2) as server:
        started = time.monotonic()
        with pytest.raises(TransientParseError, match=r"the page did not come within 1 s"):
            fetch_page(f"{server.base_url}/slow", timeout_s=10, guard=guard_for(server))
        assert time.monotonic() - started < 5


def test_the_file_of_a_bookmarks_link_is_read_with_the_same_limits():
    """The documents stage downloads the file behind a link (a PDF): the
    same two layers of gzip, and a file past 50 MB, end as failures by name."""
    from kb.documents.outcomes import Outcome, Target
    from kb.documents.web_links import fetch_file

    for headers, packed, detail in (
        ({"Content-Encoding": "gzip, gzip"}, gzip.compress(zeros_gzip(64 * MIB)), "comes in 2 content encodings"),
        ({"Content-Encoding": "gzip"}, zeros_gzip(64 * MIB), "the file is larger than 50 MB"),
    ):
        with Hostile(packed, headers, content_type="application/pdf") as server:
            guard = guard_for(server)
            with guard.httpx_client(follow_redirects=True, timeout=10) as client:
                url = f"{server.base_url}/a.pdf"
                outcome = fetch_file(client, Outcome(Target(url_norm=url, url=url, is_article=False), url, "pdf", "file"))
        assert outcome.reason == "error" and detail in outcome.detail, outcome


def many_strings_pdf(pages: int, shows: int, spaces: int = 0) -> bytes:
    """A PDF of a few kB whose pages share one packed content stream that
    shows `shows` strings (the red team's form), after `spaces` spaces."""
    packer = zlib.compressobj(9)
    content = b"".join([*(packer.compress(b" " * (1 << 20)) for _ in range(spaces >> 20)),
                        packer.compress(b" " * (spaces % (1 << 20))),
                        packer.compress(b"BT /F1 1 Tf 10 700 Td " + b"(aaaa bbbb ) Tj " * shows + b"ET"),
                        packer.flush()])
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{' '.join(f'{i + 5} 0 R' for i in range(pages))}] /Count {pages} >>".encode(),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream"]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 600 800] /Resources << /Font << /F1 3 0 R >> >> "
                b"/Contents 4 0 R >>"] * pages
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


def test_a_small_pdf_of_many_strings_is_read_as_plain_text():
    """The layout pass grows with the square of a page's strings: a PDF of
    4 KiB with 100,000 on a page did not end in 300 s. Such a PDF is read
    as plain text (both readers: a Telegram source and a bookmark's link);
    a page of some thousand strings keeps its layout pass."""
    import pymupdf

    from kb.enrich.extract import extract_pdf, layout_affordable
    from kb.telegram.source_parsers import parse_pdf_bytes

    hostile = many_strings_pdf(1, 100_000)
    assert len(hostile) < 5_000
    for pages, shows, affordable in ((1, 3_000, True), (1, 100_000, False), (40, 2_000, False), (10, 2_000, True)):
        with pymupdf.open(stream=many_strings_pdf(pages, shows), filetype="pdf") as doc:
            assert layout_affordable(doc) is affordable, (pages, shows)
    assert "aaaa bbbb" in parse_pdf_bytes(hostile, "bomb.pdf").body
    assert "aaaa bbbb" in extract_pdf(hostile, "https://example.org/bomb.pdf").text


def test_a_pdf_whose_content_unpacks_to_gigabytes_is_refused_in_steps():
    """PyMuPDF's xref_stream() unpacks a stream whole: a PDF of 2 MB whose
    stream unpacks to 2 GB took 1.9 GB of memory before MuPDF's own bomb
    check, and its plain-text reading 11.6 s of CPU. kb unpacks each stream
    in steps of 1 MiB and refuses a PDF past MAX_CONTENT_STREAM_BYTES, also
    one of more than 40 pages (which skips the layout pass), in both
    readers. Under the limit, the count of strings is the one of the whole
    stream, also where a string crosses the border of two steps."""
    import pymupdf

    from kb.enrich.extract import (MAX_CONTENT_STREAM_BYTES, TEXT_SHOW, PdfTooLarge, _text_shows, extract_pdf,
                                   layout_affordable)
    from kb.telegram.source_parsers import parse_pdf_bytes

    bomb = many_strings_pdf(1, 10, spaces=MAX_CONTENT_STREAM_BYTES + (1 << 20))
    many_pages = many_strings_pdf(41, 10, spaces=MAX_CONTENT_STREAM_BYTES + (1 << 20))
    assert len(bomb) < 100_000
    with traced_peak() as peak:
        with pytest.raises(PdfTooLarge, match="https://example.org/bomb.pdf: a content stream of page 1 unpacks to "
                                              "more than 33,554,432 bytes"):
            extract_pdf(bomb, "https://example.org/bomb.pdf")
        with pytest.raises(PermanentParseError, match="bomb.pdf: a content stream of page 1 unpacks to more than"):
            parse_pdf_bytes(many_pages, "bomb.pdf")
    assert peak["mib"] < 16, peak  # steps of 1 MiB, not the 33 MiB of the stream
    # The file behind a bookmark's link: the documents stage names the reason.
    from kb.documents.outcomes import Outcome, Target
    from kb.documents.web_links import fetch_file

    with Hostile(bomb, content_type="application/pdf") as server:
        with guard_for(server).httpx_client(follow_redirects=True, timeout=10) as client:
            url = f"{server.base_url}/bomb.pdf"
            outcome = fetch_file(client, Outcome(Target(url_norm=url, url=url, is_article=False), url, "pdf", "file"))
    assert outcome.reason == "too large" and f"{url}: a content stream of page 1" in outcome.detail, outcome
    honest = many_strings_pdf(1, 3_000, spaces=(1 << 20) - 1003)  # strings across the first step's end
    with pymupdf.open(stream=honest, filetype="pdf") as doc:
        assert layout_affordable(doc) is True
        assert _text_shows(doc, 4, 1) == (3_000, len(doc.xref_stream(4)))
        assert len(TEXT_SHOW.findall(doc.xref_stream(4))) == 3_000


ESCAPES = "\x1b]0;OWNED\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[8mhidden\x1b[0m"


def test_a_terminals_escape_sequences_never_reach_the_owners_terminal(capsys):
    """A text page of a Telegram link sets the terminal's title (OSC 0) and
    writes its clipboard (OSC 52) when `kb search` prints it. The parsed text
    keeps the words without the control characters, and the printer drops
    them from anything stored (text that came before this rule too)."""
    from types import SimpleNamespace

    from kb.apps.printing import print_hits
    from kb.telegram.source_parsers import parse_web

    page = f"A note on cameras. {ESCAPES} The end.\n".encode()
    with Hostile(page, content_type="text/plain") as server:
        from tests.loopback import allow_fetches

        with pytest.MonkeyPatch.context() as patch:
            allow_fetches(patch, server.base_url)
            parsed = parse_web(f"{server.base_url}/note.txt")
    assert "\x1b" not in parsed.body and "\x07" not in parsed.body
    assert "A note on cameras." in parsed.body and "]52;c;cm0gLXJmIH4=" in parsed.body  # the words stay
    hit = SimpleNamespace(created_at=None, rerank_score=None, author=f"x{ESCAPES}", score=1.0, best_source="link",
                          best_chunk=f"stored before the rule {ESCAPES}", best_ref=f"https://e.org/{ESCAPES}")
    print_hits(SimpleNamespace(hits=[hit]))
    shown = capsys.readouterr().out
    assert "stored before the rule" in shown and "\x1b" not in shown and "\x07" not in shown


def long_quiet_wav(path, seconds: int, rate: int = 1) -> None:
    """A WAV of `seconds` of silence at `rate` samples a second: 7 kB hold
    two hours at 1 Hz, which faster-whisper decodes into 16 kHz in memory."""
    import wave

    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(2 * seconds * rate))


def test_a_voice_note_or_video_of_more_than_two_hours_is_refused_before_it_is_decoded(tmp_path):
    """A voice note of 930 kB held an hour of silence, and a WAV of 7 kB at
    1 Hz an hour that ran out of memory in the decoder (the red team). The
    length is read from the file's header first: the voice note fails by
    name, the video's transcript gets the reason too_long; no model loads."""
    from kb.enrich.modal_apps.shared import MAX_AUDIO_S, transcription
    from kb.telegram.source_parsers import parse_voice

    long_note = tmp_path / "long.wav"
    long_quiet_wav(long_note, MAX_AUDIO_S + 60)
    assert long_note.stat().st_size < 20_000
    with pytest.raises(PermanentParseError, match=r"lasts 121 minutes; kb transcribes at most 120 minutes"):
        parse_voice(long_note, "tiny.en")

    class NoModel:
        def transcribe(self, *args, **kwargs):
            raise AssertionError("the model must not run on a file that is too long")

    assert transcription(NoModel(), str(long_note)) == {
        "reason": "too_long", "detail": "its sound lasts 121 minutes; kb transcribes at most 120 minutes"}


def test_a_media_download_in_a_content_encoding_or_dripping_is_refused(monkeypatch):
    """Photos and videos come packed already: a gzip answer (200 kB that
    became 200 MB, past the limit of 20 MB) is refused by name, and a drip
    ends at the download's own deadline (here 1 s)."""
    from kb.enrich.modal_apps import shared

    with Hostile(zeros_gzip(32 * MIB), {"Content-Encoding": "gzip"}, content_type="image/png") as server:
        with pytest.raises(shared.FetchError, match=r"came in the content encoding 'gzip'"):
            shared.fetch_media(f"{server.base_url}/photo.png", max_bytes=20 * MIB)
    monkeypatch.setattr(shared, "MEDIA_DEADLINE_S", 1.0)
    with Hostile(drip=b"\x89PNG" + bytes(200), every_s=0.2, content_type="image/png") as server:
        with pytest.raises(shared.FetchError, match=r"did not come within 1 s") as refused:
            shared.fetch_media(f"{server.base_url}/photo.png", max_bytes=20 * MIB)
        assert refused.value.reason == "timeout"
