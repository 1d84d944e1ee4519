"""Extraction: the main content of one web page or PDF, as HTML and as text.

The functions here are pure: they take bytes or a string and return text.
The document fetcher (kb/documents/) fetches; `kb extract-file` calls
`extract_file()` on a saved page. Both use the same code, so what the
command prints is what the chunker sees.

A document keeps the HTML of its main content, because its links
(<a href>) matter to later stages. The markup comes off at chunk time,
through `html_to_text()`. Telegram web links (`source_parsers.parse_web`)
are read by the same `extract_html()`, as Markdown.
"""

from __future__ import annotations

import copy
import html as html_lib
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import lxml.etree
import lxml.html

from kb.enrich import block_choice
from kb.enrich.page_blocks import HEADINGS, block_features, page_blocks
from kb.enrich.page_types import classify, page_signals

# A page with fewer words than this is "thin": a teaser, a login wall, a
# cookie notice or an empty JavaScript shell, not an article.
THIN_WORDS = 60
# pymupdf4llm's layout analysis (headings, tables) costs about one second per
# page on 2 cores: a 300-page PDF took 5 minutes in tests/test_bad_input.py,
# while the documents run held its DuckDB pool slot. A longer PDF is read
# as plain text, page by page: all the words, in some milliseconds per page.
MAX_LAYOUT_PAGES = 40
# The layout analysis also grows with the square of the text operators of a
# page: a PDF of 1 KiB whose page shows 5,000 strings took 3.8 s, 20,000
# took 39 s, 100,000 did not end in 300 s (the red team, 7 December 2026).
# A real page shows some hundreds to a few thousand. Past either limit the
# PDF is read as plain text, as a long one is.
MAX_LAYOUT_TEXT_SHOWS_PAGE = 5_000
MAX_LAYOUT_TEXT_SHOWS = 40_000
# A string, an array of strings or a hex string, and then an operator that
# shows it: Tj, TJ, ' or ".
TEXT_SHOW = re.compile(rb"[)>\]]\s*(?:Tj|TJ|'|\")")
# Each content stream is unpacked in steps of _STREAM_STEP bytes, and a PDF
# is read only when no stream unpacks to more than MAX_CONTENT_STREAM_BYTES
# and all to no more than MAX_CONTENT_BYTES. PyMuPDF's xref_stream() unpacks
# a stream whole: a PDF of 2 MB whose one stream unpacks to 2 GB took 1.9 GB
# of memory before MuPDF's own check of compression bombs stopped it, and
# its plain-text reading took 11.6 s of CPU (it reads all 2 GB); 50 MB of
# such a PDF would take some minutes (7 December 2026). A real page's
# stream has some hundred kB, a book of 500 pages some tens of MB in all.
MAX_CONTENT_STREAM_BYTES = 32 * 1024 * 1024
MAX_CONTENT_BYTES = 256 * 1024 * 1024
_STREAM_STEP = 1024 * 1024
# A stream with another filter (LZW, ASCII85, a chain) is unpacked by
# PyMuPDF at once: only a small one, whose unpacked size is then bounded.
MAX_OTHER_FILTER_RAW_BYTES = 64 * 1024
# The largest page that kb reads. The block choice reads a page block by
# block, so its cost grows with the count of elements: a page of 60,000
# short paragraphs (2.9 MB) took 18.6 s of CPU and 341 MB, one of 1,500,000
# (12 MB) took 281 s and 4.7 GB (the red team, 7 December 2026). The most
# in the 1,972 real pages of the development sets: 15,793 elements, 5.3 MB.
MAX_PAGE_ELEMENTS = 50_000
MAX_PAGE_CHARS = 10 * 1024 * 1024
# A start tag: "<" and a letter. It counts the elements of a page before
# lxml builds them (0.2 s for 12 MB).
_START_TAG = re.compile("<[A-Za-z]")
_START_TAG_BYTES = re.compile(b"<[A-Za-z]")


class Reason(StrEnum):
    """Why a URL has no usable document. An HTTP error is stored as
    `http_<status>` (see `http_reason()`), so the owner sees the status."""

    TIMEOUT = "timeout"  # the page did not load in time
    THIN = "thin"  # fewer than THIN_WORDS words of main content
    BINARY = "binary"  # a file that is not a page and not a PDF
    BLOCKED = "blocked"  # a bot wall or a challenge page, not the content
    ERROR = "error"  # anything else; the message goes to the run log
    TOO_LARGE = "too large"  # more than MAX_PAGE_ELEMENTS or MAX_PAGE_CHARS (page_size_refusal)
    PRIVATE_ADDRESS = "private address"  # the fetch guard refused it (kb/guards/fetch_guard.py)
    NOT_A_WEB_ADDRESS = "not a web address"  # not http or https


def http_reason(status: int) -> str:
    return f"http_{status}"


@dataclass(frozen=True)
class Extracted:
    """The main content of one page."""

    text_html: str  # the main content as an HTML fragment, links kept
    text: str  # the same without markup: paragraphs split by blank lines
    title: str | None
    word_count: int
    page_type: str | None = None  # kb.enrich.page_types.PageType of a web page

    @property
    def thin(self) -> bool:
        return self.word_count < THIN_WORDS


# --- HTML to text ------------------------------------------------------------

# Elements that start and end a paragraph. Everything else is inline.
_BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "body", "dd", "details", "div", "dl", "dt",
    "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
    "header", "hr", "html", "li", "main", "nav", "ol", "p", "section", "summary", "table",
    "tbody", "thead", "tfoot", "tr", "ul", "caption",
})
# Elements whose content is never text for a reader.
_SKIP_TAGS = frozenset({"head", "script", "style", "noscript", "template", "svg", "iframe", "img"})
# Cells of one table row stay on one line, split by a space.
_CELL_TAGS = frozenset({"td", "th"})


_MARKDOWN_PREFIX = {"h1": "# ", "h2": "## ", "h3": "### ", "h4": "#### ", "h5": "##### ", "h6": "###### ",
                    "li": "- "}


def html_to_text(html: str, markdown: bool = False) -> str:
    """The text of an HTML page or fragment: one paragraph per block element,
    paragraphs split by one blank line, spaces inside a paragraph collapsed.
    Code in <pre> keeps its line breaks.

    With markdown=True, headings start with "#", list items with "- ", and
    code is fenced with ```: the form of a Telegram source file. Link
    addresses are never written out: only the words of a link are prose."""
    if not html or not html.strip():
        return ""
    try:
        root = lxml.html.document_fromstring(html)
    except (lxml.etree.ParserError, ValueError):
        return ""
    paragraphs: list[str] = []
    parts: list[str] = []
    prefix = [""]  # the Markdown mark of the paragraph being read

    def flush() -> None:
        text = " ".join("".join(parts).split())
        if text:
            paragraphs.append(prefix[0] + text)
            prefix[0] = ""
        parts.clear()

    skipping = 0  # depth inside an element of _SKIP_TAGS
    walker = lxml.etree.iterwalk(root, events=("start", "end", "comment", "pi"))
    for event, element in walker:
        if event in ("comment", "pi"):
            # A comment has no text for a reader, but the text after it does.
            if not skipping and element.tail:
                parts.append(element.tail)
            continue
        tag = element.tag.lower() if isinstance(element.tag, str) else ""
        if event == "start":
            if tag in _SKIP_TAGS:
                skipping += 1
                continue
            if skipping:
                continue
            if tag == "pre":
                flush()
                code = element.text_content().strip("\n")
                if code.strip():
                    paragraphs.append(f"```\n{code}\n```" if markdown else code)
                walker.skip_subtree()
                continue
            if tag in _BLOCK_TAGS:
                flush()
                if markdown and tag in _MARKDOWN_PREFIX:
                    prefix[0] = _MARKDOWN_PREFIX[tag]
            elif tag in _CELL_TAGS or tag == "br":
                parts.append(" ")
            if element.text:
                parts.append(element.text)
        else:
            if tag in _SKIP_TAGS:
                skipping -= 1
            elif not skipping and tag in _BLOCK_TAGS:
                flush()
                if tag in _MARKDOWN_PREFIX:
                    prefix[0] = ""  # an empty heading or item gives no mark to the next block
            if not skipping and element.tail:
                parts.append(element.tail)
    flush()
    return "\n\n".join(paragraphs)


def count_words(text: str) -> int:
    return len(text.split())


# --- pages ---------------------------------------------------------------------

# How kb reads a page (benchmarks/extraction.md has the figures; the
# nested cross-validation of `benchmarks/train_block_choice.py` checks the
# learned parts):
# 1. trafilatura runs with its default settings and with favor_precision.
# 2. kb's article rule makes a third text from those two runs: the
#    favor_precision result when it keeps nearly all the text of the default
#    result (PRECISION_KEEPS), because then what it removed was boilerplate;
#    else the default result. clean_fragment() removes from it what a reader
#    does not need: link blocks ("Read also: ..."), credit lines ("© AFP"),
#    and headings left with nothing under them at the end.
# 3. The block choice (kb.enrich.block_choice) keeps the blocks of the page
#    that are main text, from the numbers of each block and how much of it
#    the three texts hold. One choice per page (a strategy per page type,
#    then a learned choice of strategy per page) stopped at 0.83 word F1 on
#    WCXB: the blocks of one page need different answers.
#    Rules after the model drop blocks that are never main text
#    (block_choice.main_text(): far runs of doubtful blocks after the text;
#    block_choice.without_boilerplate(): markup as text, the site's menu
#    items, short captions, a video player's controls; galleries, the
#    links above the story, the dek and the boxes of related stories and
#    newsletters on article pages).
# 4. A result that is still thin is read again with favor_recall, which finds
#    the body on some pages where the other settings find almost nothing.
# Images are not extracted: with include_images trafilatura chooses other
# parts of some pages and keeps figure captions and photo credits. On the
# development set this cost 0.017 of precision and gained no recall.
PRECISION_KEEPS = 0.98
# A block (paragraph, heading, list item) of at most SHORT_BLOCK_CHARS
# characters, of which at least LINK_SHARE are the words of links, points to
# other pages: it is not prose. Both values, and PRECISION_KEEPS, are the
# ones that the whole news set chose from a grid; 4 of the 5
# cross-validation folds chose the same.
SHORT_BLOCK_CHARS = 100
LINK_SHARE = 0.7

# The settings of trafilatura that kb runs, by name. The two runs that the
# block choice reads use trafilatura's fast mode (no second opinion of
# readability and jusText): it halves their time (54 ms CPU p50 for both
# before), and the block choice makes up for the rest. Under 5-fold CV
# (3 December 2026), with fast runs: news 0.9398, WCXB 0.8513; with full
# runs: 0.9349 and 0.8550.
MODES = {
    "default": {"fast": True},
    "precision": {"favor_precision": True, "fast": True},
    "recall": {"favor_recall": True},
}
# The blocks that clean_fragment() judges one by one.
_LEAF_BLOCKS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd")
# Blocks that count as content under a heading.
_CONTENT_BLOCKS = ("p", "pre", "table", "blockquote", "ul", "ol", "dl", "div", *HEADINGS)


class PageTooLarge(ValueError):
    """The page is larger than kb reads (MAX_PAGE_ELEMENTS, MAX_PAGE_CHARS).
    `reason` says why without naming the page, for a caller that names it."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.reason = reason


def page_size_refusal(html: str | bytes) -> str | None:
    """Why kb does not read this page, or None: its size in characters, or
    the count of its elements, is above the limit."""
    if len(html) > MAX_PAGE_CHARS:
        return f"the page has more than {MAX_PAGE_CHARS:,} characters, the most that kb reads"
    pattern = _START_TAG_BYTES if isinstance(html, bytes) else _START_TAG
    elements = sum(1 for _ in pattern.finditer(html))
    if elements > MAX_PAGE_ELEMENTS:
        return f"the page has {elements:,} elements, more than the {MAX_PAGE_ELEMENTS:,} that kb reads"
    return None


def extract_html(html: str | bytes, url: str | None = None) -> Extracted:
    """The main content of a page: the blocks that the block choice
    (kb.enrich.block_choice) keeps, by the selection of the page's type
    (kb.enrich.page_types). A thin result is read again with favor_recall.

    Links stay in the HTML, absolute when the page URL is known.
    PageTooLarge when the page is above kb's limits (page_size_refusal)."""
    if (refusal := page_size_refusal(html)) is not None:
        raise PageTooLarge(url or "the page", refusal)
    import trafilatura

    try:
        tree = trafilatura.load_html(html)
    except (ValueError, TypeError):  # bytes that are not text in any encoding
        tree = None
    if tree is None:
        return Extracted(text_html="", text="", title=_page_title(html), word_count=0)
    kind = classify(page_signals(tree, url))
    runs: dict[str, str] = {}

    def run(mode: str) -> str:
        # trafilatura cleans the tree it is given in place: each run gets a copy.
        if mode not in runs:
            runs[mode] = trafilatura_fragment(copy.deepcopy(tree), url, mode)
        return runs[mode]

    blocks = page_blocks(tree)
    model = block_choice.load_model()
    rows = block_features(tree, blocks, kept_texts(run), str(kind))
    kept = block_choice.without_boilerplate(blocks, block_choice.main_text(model, rows, str(kind)), str(kind))
    fragment = block_choice.kept_fragment(blocks, kept, url)
    fragment, text = recall_when_thin(fragment, html_to_text(fragment), lambda: clean_fragment(run("recall")))
    title = _trafilatura_title(tree) or _page_title(html)
    return Extracted(text_html=fragment, text=text, title=title, word_count=count_words(text), page_type=str(kind))


def kept_texts(run: Callable[[str], str]) -> dict[str, str]:
    """The texts whose words the block choice compares with each block
    (page_blocks.KEPT_BY): trafilatura's default and favor_precision runs,
    and kb's article rule made from them. The training script calls this
    with stored runs, so both use the same texts."""
    texts = {mode: html_to_text(run(mode)) for mode in ("default", "precision")}
    texts["article"] = article_text(run)
    return texts


def trafilatura_fragment(html: str | bytes | lxml.html.HtmlElement, url: str | None, mode: str) -> str:
    """trafilatura's main content of a page as an <article> fragment, with
    the settings of `mode` ("default", "precision" or "recall"), or "" when
    it finds none. A parsed tree is changed in place."""
    # trafilatura.extract() also makes a fingerprint of the text for its
    # de-duplication, in Python, for a value that kb does not use: without
    # it a run took 13.1 ms p50 in place of 15.8 (696 runs on pages of both
    # sets, 3 December 2026). bare_extraction() and the HTML output of
    # extract() give the same fragment without it (tests/test_extract.py
    # compares both).
    import trafilatura
    from trafilatura.htmlprocessing import build_html_output
    from trafilatura.utils import normalize_unicode

    document = trafilatura.bare_extraction(
        html,
        url=url,
        output_format="html",
        include_images=False,
        include_tables=True,
        as_dict=False,
        **({"include_comments": False, "include_links": True} | MODES[mode]),
    )
    output = normalize_unicode(build_html_output(document)) if document is not None else ""
    return _body_fragment(lxml.html.document_fromstring(output)) if output else ""


def _trafilatura_title(tree: lxml.html.HtmlElement) -> str | None:
    """The title as trafilatura's metadata gives it (meta tags, JSON-LD, then
    the one <h1> or the <title>), without the rest of the metadata: the
    publication date search alone took 18 ms a page, for a value that kb
    does not use."""
    from trafilatura.metadata import examine_meta, extract_meta_json, extract_title

    try:
        metadata = extract_meta_json(tree, examine_meta(tree))
    except Exception:  # trafilatura catches its own JSON-LD bugs the same way
        metadata = None
    title = metadata.title if metadata and metadata.title else extract_title(tree)
    return " ".join(title.split()) or None if title else None


def article_text(run: Callable[[str], str]) -> str:
    """The text of kb's article rule (step 2 above) from `run(mode)`,
    trafilatura's fragment with the settings of MODES[mode]: the cleaned
    favor_precision result when it keeps at least PRECISION_KEEPS of the
    cleaned default result's characters, else the cleaned default result."""
    default, precise = (html_to_text(clean_fragment(run(mode))) for mode in ("default", "precision"))
    return precise if precise and len(precise) >= PRECISION_KEEPS * len(default) else default


def recall_when_thin(fragment: str, text: str, recalled: Callable[[], str]) -> tuple[str, str]:
    """The fragment and its text, or `recalled()` (the cleaned favor_recall
    run) and its text when the fragment is thin (THIN_WORDS) and that has
    more text: on some pages favor_recall finds the body where the other
    settings find almost nothing."""
    if count_words(text) >= THIN_WORDS:
        return fragment, text
    other = recalled()
    other_text = html_to_text(other)
    return (other, other_text) if len(other_text) > len(text) else (fragment, text)


def clean_fragment(fragment: str) -> str:
    """An HTML fragment without link blocks, credit lines, and headings that
    are left at the end with no content under them. Links inside prose stay.

    A link block is a short block (at most SHORT_BLOCK_CHARS characters) of
    which at least LINK_SHARE are the words of links: "Read also: ...", a
    menu item, a related article. A credit line is a short block with a
    copyright sign: it names the owner of a picture or of the site."""
    if not fragment or not fragment.strip():
        return ""
    root = lxml.html.fragment_fromstring(fragment, create_parent="article")
    for element in list(root.iter(*_LEAF_BLOCKS)):
        if element.getparent() is None or _inside(element, "pre"):
            continue
        text = _text_of(element)
        if not text or len(text) > SHORT_BLOCK_CHARS:
            continue
        link_chars = sum(len(_text_of(a)) for a in element.iter("a"))
        if link_chars >= LINK_SHARE * len(text) or "©" in text:
            element.drop_tree()
    _drop_trailing_headings(root)
    if len(root) == 1 and root[0].tag == "article" and not (root.text or "").strip():
        root = root[0]  # fragment_fromstring wrapped our own <article>
    return lxml.html.tostring(root, encoding="unicode")


def _drop_trailing_headings(root: lxml.html.HtmlElement) -> None:
    """A heading with no content after it titled something that is gone
    ("Related articles" over a removed link list). Only the end of the text
    is judged: in the middle, a heading followed by another heading is often
    a subtitle or a lead, which is content."""
    while True:
        last = None
        for element in root.iter(*_CONTENT_BLOCKS):
            if _text_of(element):
                last = element
        if last is None or last.tag not in HEADINGS or (last.tail or "").strip():
            return
        last.drop_tree()


def _inside(element: lxml.html.HtmlElement, tag: str) -> bool:
    return any(True for _ in element.iterancestors(tag))


def _text_of(element: lxml.html.HtmlElement) -> str:
    return " ".join(element.text_content().split())


def _body_fragment(tree: lxml.html.HtmlElement) -> str:
    """The <body> children of trafilatura's output inside one <article>."""
    body = tree.find("body")
    if body is None:
        return ""
    body.tag = "article"
    body.tail = None
    return lxml.html.tostring(body, encoding="unicode").strip()


def _page_title(html: str | bytes) -> str | None:
    """The page's own <title>, for pages where trafilatura finds none."""
    try:
        tree = lxml.html.document_fromstring(html)
    except (lxml.etree.ParserError, ValueError):
        return None
    title = tree.findtext(".//title")
    return " ".join(title.split()) or None if title else None


def text_to_html(text: str) -> str:
    """Plain text as an HTML fragment, one paragraph per line, so that every
    document has HTML. Used for X Articles from content_state, where each
    line is one block of the article."""
    paragraphs = [line.strip() for line in (text or "").splitlines() if line.strip()]
    body = "".join(f"<p>{html_lib.escape(p)}</p>" for p in paragraphs)
    return f"<article>{body}</article>"


def extracted_from_text(text: str, title: str | None) -> Extracted:
    fragment = text_to_html(text)
    plain = html_to_text(fragment)
    return Extracted(text_html=fragment, text=plain, title=title, word_count=count_words(plain))


# --- PDF -------------------------------------------------------------------------

def is_pdf(data: bytes) -> bool:
    return data[:1024].lstrip().startswith(b"%PDF-")


def layout_affordable(doc) -> bool:
    """True when the layout analysis (pymupdf4llm) of an open PyMuPDF
    document is affordable: at most MAX_LAYOUT_PAGES pages, and at most
    MAX_LAYOUT_TEXT_SHOWS_PAGE text operators on a page and
    MAX_LAYOUT_TEXT_SHOWS in all. Else kb reads it as plain text (pdf_paragraphs).
    PdfTooLarge when its content streams unpack to more than kb reads."""
    shows, unpacked, by_stream = 0, 0, {}
    affordable = doc.page_count <= MAX_LAYOUT_PAGES
    for number, page in enumerate(doc, start=1):
        # Pages may share a content stream (the red team's 40 pages shared
        # one): each stream is unpacked and counted once.
        for xref in page.get_contents():
            if xref not in by_stream:
                by_stream[xref], size = _text_shows(doc, xref, number)
                unpacked += size
                if unpacked > MAX_CONTENT_BYTES:
                    raise PdfTooLarge("the PDF", f"the content of its pages unpacks to more than "
                                                 f"{MAX_CONTENT_BYTES:,} bytes, the most that kb reads")
        on_page = sum(by_stream[xref] for xref in page.get_contents())
        shows += on_page
        if on_page > MAX_LAYOUT_TEXT_SHOWS_PAGE or shows > MAX_LAYOUT_TEXT_SHOWS:
            affordable = False
    return affordable


class PdfTooLarge(PageTooLarge):
    """A content stream of the PDF unpacks to more than kb reads."""


def _text_shows(doc, xref: int, page: int) -> tuple[int, int]:
    """(text operators, unpacked bytes) of one content stream, unpacked step
    by step. PdfTooLarge when it unpacks to more than MAX_CONTENT_STREAM_BYTES."""
    kind, name = doc.xref_get_key(xref, "Filter")
    raw = doc.xref_stream_raw(xref) or b""  # decrypted, still packed: at most the file's size
    if kind == "null":
        pieces = (raw[start:start + _STREAM_STEP] for start in range(0, len(raw), _STREAM_STEP))
    elif name in ("/FlateDecode", "[/FlateDecode]") and doc.xref_get_key(xref, "DecodeParms")[0] == "null":
        pieces = _inflated(raw)
    elif len(raw) <= MAX_OTHER_FILTER_RAW_BYTES:
        pieces = iter([doc.xref_stream(xref) or b""])
    else:
        raise PdfTooLarge("the PDF", f"a content stream of page {page} has the filter {name} and {len(raw):,} "
                                     f"packed bytes; kb unpacks such a stream up to {MAX_OTHER_FILTER_RAW_BYTES:,}")
    shows, tail, size = 0, b"", 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_CONTENT_STREAM_BYTES:
            raise PdfTooLarge("the PDF", f"a content stream of page {page} unpacks to more than "
                                         f"{MAX_CONTENT_STREAM_BYTES:,} bytes, the most that kb reads")
        # A match that ends in this piece counts; one that ended in the
        # tail counted in the step before.
        text = tail + piece
        shows += sum(1 for match in TEXT_SHOW.finditer(text) if match.end() > len(tail))
        tail = text[-256:]
    return shows, size


def _inflated(raw: bytes):
    """The unpacked bytes of a Flate stream, _STREAM_STEP at a time. A
    damaged stream ends where it breaks, as MuPDF reads it."""
    decoder = zlib.decompressobj()
    data = raw
    while True:
        try:
            piece = decoder.decompress(data, _STREAM_STEP)
        except zlib.error:
            return
        if not piece:
            return
        yield piece
        data = decoder.unconsumed_tail


def extract_pdf(data: bytes, url: str | None = None) -> Extracted:
    """The text of a PDF through pymupdf4llm (Markdown), kept as HTML like
    every other document. Page headers and footers are left out: they repeat
    on every page and are not the content.

    A PDF whose layout costs too much (layout_affordable()) is read as plain text.
    Raises ValueError (naming the URL) when the bytes are not a PDF that
    PyMuPDF can open, when the PDF needs a password, or when its text
    cannot be read."""
    import markdown
    import pymupdf
    import pymupdf4llm

    where = url or "the file"
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # PyMuPDF raises its own types for bad files
        raise ValueError(f"{where} is not a readable PDF: {exc}") from exc
    try:
        if doc.needs_pass:
            # Without this check pymupdf4llm fails with a TypeError that says
            # nothing of the cause.
            raise ValueError(f"{where} is an encrypted PDF: it needs a password")
        try:
            affordable = layout_affordable(doc)
        except PdfTooLarge as exc:
            raise PdfTooLarge(where, exc.reason) from None
        if not affordable:
            fragment = _plain_pdf_html(doc)
        else:
            try:
                # OCR is off: no OCR engine is installed, and a scanned PDF without a
                # text layer gives a thin document, which is the honest result.
                md = pymupdf4llm.to_markdown(doc, use_ocr=False, header=False, footer=False, show_progress=False)
            except Exception as exc:  # the layout parser fails in many ways on damaged files
                raise ValueError(f"{where}: the PDF text cannot be read ({type(exc).__name__}: {exc})") from exc
            fragment = f"<article>{markdown.markdown(md, extensions=['tables'])}</article>"
        title = (doc.metadata or {}).get("title") or None
    finally:
        doc.close()
    text = html_to_text(fragment)
    return Extracted(text_html=fragment, text=text, title=title or _first_heading(fragment), word_count=count_words(text))


def pdf_paragraphs(doc) -> list[str]:
    """The text of every page of an open PyMuPDF document: one paragraph
    per text block, in reading order. No headings or tables, but fast: the
    reading of a PDF whose layout costs too much (layout_affordable())."""
    paragraphs = []
    for page in doc:
        for block in page.get_text("blocks", sort=True):
            text = " ".join(block[4].split())
            if block[6] == 0 and text:  # block type 0 is text, 1 is an image
                paragraphs.append(text)
    return paragraphs


def _plain_pdf_html(doc) -> str:
    return "<article>" + "".join(f"<p>{html_lib.escape(p)}</p>" for p in pdf_paragraphs(doc)) + "</article>"


def _first_heading(fragment: str) -> str | None:
    tree = lxml.html.fragment_fromstring(fragment)
    for heading in tree.iter("h1", "h2"):
        text = " ".join(heading.text_content().split())
        if text:
            return text
    return None


# --- blocked pages -----------------------------------------------------------------

# Words that bot walls and challenge pages show instead of the content. They
# count only on a thin page: an article may mention a captcha.
_BLOCKED_MARKERS = (
    "just a moment",
    "attention required",
    "checking your browser",
    "verify you are human",
    "verify you are a human",
    "are you a robot",
    "enable javascript and cookies to continue",
    "unusual traffic",
    "access denied",
    "captcha",
)


def looks_blocked(html: str) -> bool:
    """True when a page is a bot wall or a challenge, not content."""
    try:
        tree = lxml.html.document_fromstring(html)
    except (lxml.etree.ParserError, ValueError):
        return False
    title = (tree.findtext(".//title") or "").lower()
    visible = html_to_text(html).lower()[:2000]
    return any(marker in title or marker in visible for marker in _BLOCKED_MARKERS)


# --- addresses ---------------------------------------------------------------------

_ARXIV_PDF_PATH = re.compile(r"^/pdf/(?P<id>.+?)(?:\.pdf)?/?$")


def rewrite_arxiv(url: str, arxiv_hosts: frozenset[str] | set[str]) -> str:
    """https://arxiv.org/pdf/<id> -> https://arxiv.org/abs/<id>.

    Reason: the abstract page is an HTML page with the title, the authors and
    the abstract, and links to every version; the PDF is a large download
    whose text often loses its layout."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host not in arxiv_hosts:
        return url
    match = _ARXIV_PDF_PATH.match(parts.path)
    if not match:
        return url
    return urlunsplit((parts.scheme, parts.netloc, f"/abs/{match['id']}", parts.query, ""))


# --- one saved file ------------------------------------------------------------------

def extract_file(path: str | Path, url: str | None = None) -> str:
    """The main text that the chunker would see for one saved HTML (or PDF)
    file, through the same code as the `documents` asset.

    Raises FileNotFoundError or ValueError with the path and the reason."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{path}: the file is empty")
    if is_pdf(data):
        return extract_pdf(data, url or str(path)).text  # an error then names the file
    if b"\x00" in data[:4096]:
        raise ValueError(f"{path}: the file is binary, not HTML or PDF")
    try:
        return extract_html(data, url).text
    except PageTooLarge as exc:
        raise PageTooLarge(str(path), exc.reason) from None
