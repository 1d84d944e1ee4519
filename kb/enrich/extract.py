"""Extraction: the main content of one web page or PDF, as HTML and as text.

The functions here are pure: they take bytes or a string and return text.
The `documents` asset does the fetching; `kb extract-file` calls
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
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import lxml.etree
import lxml.html

from kb.enrich import page_choice
from kb.enrich.page_types import PageType, Signals, classify, page_features, page_signals
from kb.enrich.repeated_blocks import best_series_by_weight, series_html

# A page with fewer words than this is "thin": a teaser, a login wall, a
# cookie notice or an empty JavaScript shell, not an article.
THIN_WORDS = 60
# pymupdf4llm's layout analysis (headings, tables) costs about one second per
# page on 2 cores: a 300-page PDF took 5 minutes in tests/test_bad_input.py,
# while the documents run held its DuckDB pool slot. A longer PDF is read
# as plain text, page by page: all the words, in some milliseconds per page.
MAX_LAYOUT_PAGES = 40


class Reason(StrEnum):
    """Why a URL has no usable document. An HTTP error is stored as
    `http_<status>` (see `http_reason()`), so the owner sees the status."""

    TIMEOUT = "timeout"  # the page did not load in time
    THIN = "thin"  # fewer than THIN_WORDS words of main content
    BINARY = "binary"  # a file that is not a page and not a PDF
    BLOCKED = "blocked"  # a bot wall or a challenge page, not the content
    ERROR = "error"  # anything else; the message goes to the run log
    PRIVATE_ADDRESS = "private address"  # the fetch guard refused it (kb/fetch_guard.py)
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


# The strategies, the grid rule and the inputs of the per-page choice read
# and clean the same fragments many times for one page (trafilatura's
# default run, each block of the series). Both functions are pure, so the
# last results are kept: without this, the choice's inputs cost 36 ms CPU
# per page (p50 of 190 pages of both sets, after the two runs of the article
# strategy), with it 24 ms. extract_html() empties both caches at its end:
# whole documents also pass through html_to_text(), and the memory must not
# hold hundreds of them.
_KEPT_RESULTS = 256


@lru_cache(maxsize=_KEPT_RESULTS)
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

# How kb reads a page. Each step was measured on the development set
# (../shared/eval/extraction, 400 real pages; `benchmarks/bench_extraction.py
# --cv` checks the numbers below by 5-fold cross-validation):
# 1. trafilatura runs with its default settings and with favor_precision.
#    favor_precision removes more boilerplate, but on some pages it also cuts
#    the body. So its result is taken only when it keeps nearly all the text
#    of the default result (PRECISION_KEEPS): then what it removed was
#    boilerplate. Otherwise the default result is taken.
# 2. A result that is still thin is read again with favor_recall, which finds
#    the body on some pages where the other two settings find almost nothing.
# 3. clean_fragment() removes what trafilatura keeps but a reader does not
#    need: link blocks ("Read also: ...", lists of related articles), credit
#    lines ("© AFP"), and headings left with nothing under them at the end.
# Images are not extracted: with include_images trafilatura chooses other
# parts of some pages and keeps figure captions and photo credits. On the
# development set this cost 0.017 of precision and gained no recall.
PRECISION_KEEPS = 0.98
# A block of a series is new when less than this share of its words is
# already in the text: a post that trafilatura already kept is not added twice.
NEW_BLOCK_SHARE = 0.5
# A block (paragraph, heading, list item) of at most SHORT_BLOCK_CHARS
# characters, of which at least LINK_SHARE are the words of links, points to
# other pages: it is not prose. Both values, and PRECISION_KEEPS, are the
# ones that the whole development set chooses from the benchmark's grid; 4
# of the 5 cross-validation folds chose the same.
SHORT_BLOCK_CHARS = 100
LINK_SHARE = 0.7
# The grid rule of the article strategy: a page that kb types as an article
# but that is a grid of items (a collection of talks, a category page) has
# little running text, and trafilatura keeps few of its items. When
# trafilatura's text with the items of the page's series added ("items+merge",
# link blocks kept) has at least GRID_WORDS_RATIO times the words of the
# article text, and the series has at least GRID_MIN_BLOCKS blocks, the items
# are the content: that text replaces the article text. A real article with
# a long list of comments or related links seldom passes both. The 5 training
# sets of the cross-validation chose 6 and 8 in 5 of 5 folds, with the rule
# that the news set must not fall (benchmarks/extraction.md, 3 December 2026).
GRID_WORDS_RATIO = 6.0
GRID_MIN_BLOCKS = 8

# The settings of trafilatura that kb runs, by name. "comments" keeps the
# replies under a post: on a forum thread they are the content.
MODES = {
    "default": {},
    "precision": {"favor_precision": True},
    "recall": {"favor_recall": True},
    "comments": {"include_comments": True},
    "recall_comments": {"favor_recall": True, "include_comments": True},
    # Without links: with include_links, trafilatura drops or cuts some
    # blocks that are dense with links. On 87 WCXB collection and
    # documentation pages this cost 0.015 of word F1 (0.713 against 0.727).
    # The fragment then has no <a href>: kb pays that only where it gains.
    "nolinks": {"include_links": False},
}
# The strategies of main_content(): how the page's extraction is made.
# - "article": kb's rule for articles (steps 1 to 3 above).
# - a name of MODES: one run of trafilatura with those settings.
# - "posts", "items" and their "+merge" forms: the page's largest series of
#   repeated blocks (kb.enrich.repeated_blocks): the posts of a thread (the words
#   of links count half: names and dates are links) or the items of a list
#   (links count in full: an item's title is a link). Alone, the series is
#   the text; with "+merge", the blocks that trafilatura left out are added
#   to trafilatura's default text.
# Every strategy falls back to favor_recall when its text is thin.
SERIES_STRATEGIES = {"posts": (0.5, False), "posts+merge": (0.5, True),
                     "items": (1.0, False), "items+merge": (1.0, True)}
SERIES_WEIGHTS = tuple(sorted({weight for weight, _ in SERIES_STRATEGIES.values()}))
_BASE_STRATEGIES = ("article", *MODES, *SERIES_STRATEGIES)
# A strategy with this suffix keeps the link blocks (clean_fragment): on a
# listing or a collection the items are links, and on a documentation page
# the links of a reference table are content. On the WCXB pages that the
# annotation calls listings, the items of the series gave 0.635 word F1 with
# link blocks kept and 0.612 without; on articles 0.919 against 0.924.
KEEP_LINKS = "+link_blocks"
STRATEGIES = (*_BASE_STRATEGIES, *(name + KEEP_LINKS for name in _BASE_STRATEGIES))
# The strategy of each page type, as benchmarks/bench_extraction.py --cv
# chose it on both development sets together (see benchmarks/extraction.md,
# 3 December 2026). The 5 training sets of the CV chose the same for
# article, documentation and service in 5 of 5 folds, for collection in 4,
# for product and listing in 3; for forum "article" in 1 and its
# "+link_blocks" form in 3 (the two differ by 0.003 on those pages).
# "default" and "nolinks" cost one run of trafilatura, "article" two: the
# second run is paid where it gains. On the pages of the types of
# kb.enrich.page_choice's model (collection, forum and listing), the choice
# can replace the type's strategy for a single page (choose_strategy()).
# Not on articles: there its inputs cost 19 ms CPU per page (p50), and the
# p50 of kb's stage went above the goal of 80 ms.
TYPE_STRATEGY = {
    PageType.ARTICLE: "article",
    PageType.FORUM: "article",
    PageType.PRODUCT: "default",
    PageType.COLLECTION: "nolinks",
    PageType.LISTING: "posts+merge",
    PageType.DOCUMENTATION: "nolinks",
    PageType.SERVICE: "default",
}
_WORD = re.compile(r"\w+")
# The blocks that clean_fragment() judges one by one.
_LEAF_BLOCKS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd")
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Blocks that count as content under a heading.
_CONTENT_BLOCKS = ("p", "pre", "table", "blockquote", "ul", "ol", "dl", "div", *_HEADINGS)


def extract_html(html: str | bytes, url: str | None = None) -> Extracted:
    """The main content of a page: its page type (kb.enrich.page_types) chooses the
    strategy (TYPE_STRATEGY, see STRATEGIES), and on the pages of some types
    the per-page choice (kb.enrich.page_choice) can replace it.

    Links stay in the HTML; trafilatura makes their addresses absolute when
    it knows the page URL."""
    import trafilatura

    try:
        tree = trafilatura.load_html(html)
    except (ValueError, TypeError):  # bytes that are not text in any encoding
        tree = None
    if tree is None:
        return Extracted(text_html="", text="", title=_page_title(html), word_count=0)
    signals = page_signals(tree, url)
    kind = classify(signals)
    runs: dict[str, str] = {}
    series: dict[float, list[str]] = {}
    members: dict[float, list[lxml.html.HtmlElement]] = {}

    def run(mode: str) -> str:
        # trafilatura cleans the tree it is given in place: each run gets a copy.
        if mode not in runs:
            runs[mode] = trafilatura_fragment(copy.deepcopy(tree), url, mode)
        return runs[mode]

    def blocks(link_weight: float) -> list[str]:
        # One walk over the tree finds the series of every link weight; the
        # HTML of a series is made when a strategy asks for it.
        if not members:
            members.update(best_series_by_weight(tree, SERIES_WEIGHTS))
        if link_weight not in series:
            series[link_weight] = series_html(members[link_weight])
        return series[link_weight]

    strategy = choose_strategy(tree, signals, kind, run, blocks)
    fragment = main_content(run, strategy=strategy, blocks=blocks)
    title = _trafilatura_title(tree) or _page_title(html)
    text = html_to_text(fragment)
    html_to_text.cache_clear()
    clean_fragment.cache_clear()
    return Extracted(text_html=fragment, text=text, title=title, word_count=count_words(text), page_type=str(kind))


def choose_strategy(tree: lxml.html.HtmlElement, signals: Signals, kind: PageType, run: Callable[[str], str],
                    blocks: Callable[[float], list[str]]) -> str:
    """The strategy of one page: its type's (TYPE_STRATEGY), or the one that
    the per-page choice (kb.enrich.page_choice) gives for a page of the
    model's types. The inputs of the choice come from the runs that the
    article strategy makes anyway; the chosen strategy may run one more."""
    base = TYPE_STRATEGY[kind]
    model = page_choice.load_model()
    if str(kind) not in model["types"]:
        return base
    return page_choice.choose(model, str(kind), base, choice_inputs(tree, signals, run, blocks))


def choice_inputs(tree: lxml.html.HtmlElement, signals: Signals, run: Callable[[str], str],
                  blocks: Callable[[float], list[str]]) -> dict[str, float]:
    """page_choice.choice_features() of one page. The benchmark's training
    script calls this with stored runs, so both use the same numbers. The
    texts are counted before the favor_recall run of a thin text: a short
    series of posts is thin on most pages, and that third run of trafilatura
    (about 25 ms) made kb's p50 84 ms CPU per page."""
    words = {name: count_words(html_to_text(main_content(run, strategy=name, blocks=blocks, recall_when_thin=False)))
             for name in page_choice.CHOICE_TEXTS}
    series = {name: len(blocks(SERIES_STRATEGIES[name][0])) for name in ("posts", "items")}
    raw_words = {mode: count_words(html_to_text(run(mode))) for mode in ("default", "precision")}
    return page_choice.choice_features(page_features(tree, signals), words, series, raw_words)


def trafilatura_fragment(html: str | bytes | lxml.html.HtmlElement, url: str | None, mode: str) -> str:
    """trafilatura's main content of a page as an <article> fragment, with
    the settings of `mode` ("default", "precision" or "recall"), or "" when
    it finds none. A parsed tree is changed in place."""
    import trafilatura

    output = trafilatura.extract(
        html,
        url=url,
        output_format="html",
        include_images=False,
        include_tables=True,
        **({"include_comments": False, "include_links": True} | MODES[mode]),
    )
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


def main_content(
    run: Callable[[str], str],
    *,
    strategy: str = "article",
    blocks: Callable[[float], list[str]] | None = None,
    precision_keeps: float = PRECISION_KEEPS,
    link_share: float = LINK_SHARE,
    short_chars: int = SHORT_BLOCK_CHARS,
    recall_when_thin: bool = True,
) -> str:
    """The cleaned HTML fragment of a page's main content by one of
    STRATEGIES, from `run(mode)` (trafilatura's fragment with the settings
    of MODES[mode]) and `blocks(link_weight)` (the HTML of the page's largest
    series of repeated blocks, kb.enrich.repeated_blocks). The benchmark calls this
    with stored fragments and other parameters, to cross-validate them.
    With recall_when_thin=False, a thin text is not read again with
    favor_recall (the inputs of the per-page choice)."""

    if strategy not in STRATEGIES:
        raise ValueError(f"{strategy!r} is not an extraction strategy: choose one of {', '.join(STRATEGIES)}")
    keep_links = strategy.endswith(KEEP_LINKS)
    strategy = strategy.removesuffix(KEEP_LINKS)

    def clean(fragment: str, keep_links: bool = keep_links) -> str:
        return clean_fragment(fragment, link_share=link_share, short_chars=short_chars, link_blocks=not keep_links)

    if strategy == "article":
        fragment = _article_rule(clean(run("default")), clean(run("precision")), precision_keeps)
        if blocks is not None:
            fragment = _grid_rule(fragment, run, blocks, lambda part: clean(part, keep_links=True))
    elif strategy in MODES:
        fragment = clean(run(strategy))
    elif strategy in SERIES_STRATEGIES:
        link_weight, merge = SERIES_STRATEGIES[strategy]
        base = clean(run("default"))
        series = [clean(block) for block in (blocks(link_weight) if blocks else [])]
        fragment = _merge_series(base, series) if merge else _series_fragment(series) or base
    if recall_when_thin and count_words(html_to_text(fragment)) < THIN_WORDS:
        recalled = clean(run("recall"))
        if len(html_to_text(recalled)) > len(html_to_text(fragment)):
            fragment = recalled
    return fragment


def _article_rule(default: str, precise: str, precision_keeps: float) -> str:
    """favor_precision's result when it keeps nearly all of the default's
    text (then what it removed was boilerplate), else the default's."""
    default_chars, precise_chars = len(html_to_text(default)), len(html_to_text(precise))
    if precise_chars and precise_chars >= precision_keeps * default_chars:
        return precise
    return default


def _grid_rule(article: str, run: Callable[[str], str], blocks: Callable[[float], list[str]],
               clean_keeping_links: Callable[[str], str]) -> str:
    """The article text, or trafilatura's text with the items of the page's
    series added when the page is a grid of items (see GRID_WORDS_RATIO):
    the text of the "items+merge+link_blocks" strategy."""
    link_weight, _ = SERIES_STRATEGIES["items+merge"]
    series = blocks(link_weight)
    if len(series) < GRID_MIN_BLOCKS:
        return article
    items = _merge_series(clean_keeping_links(run("default")), [clean_keeping_links(block) for block in series])
    if count_words(html_to_text(items)) >= GRID_WORDS_RATIO * max(1, count_words(html_to_text(article))):
        return items
    return article


def _series_fragment(series: list[str]) -> str:
    """The blocks of a series as one fragment, or "" when none has text."""
    kept = [block for block in series if html_to_text(block)]
    return f"<article>{''.join(kept)}</article>" if kept else ""


def _merge_series(base: str, series: list[str]) -> str:
    """trafilatura's fragment, then each block of the series of which less
    than half the words are in the text so far: the posts or items that
    trafilatura left out, without the one that it kept."""
    seen = set(_WORD.findall(html_to_text(base).lower()))
    added = []
    for block in series:
        words = _WORD.findall(html_to_text(block).lower())
        if words and sum(word in seen for word in words) < NEW_BLOCK_SHARE * len(words):
            added.append(block)
            seen.update(words)
    if not added:
        return base
    inner = base.removeprefix("<article>").removesuffix("</article>") if base else ""
    return f"<article>{inner}{''.join(added)}</article>"


@lru_cache(maxsize=_KEPT_RESULTS)
def clean_fragment(fragment: str, *, link_share: float = LINK_SHARE, short_chars: int = SHORT_BLOCK_CHARS,
                   link_blocks: bool = True) -> str:
    """An HTML fragment without link blocks, credit lines, and headings that
    are left at the end with no content under them. Links inside prose stay.

    A link block is a short block (at most short_chars characters) of which
    at least link_share are the words of links: "Read also: ...", a menu
    item, a related article. A credit line is a short block with a
    copyright sign: it names the owner of a picture or of the site. With
    link_blocks=False, link blocks stay (see KEEP_LINKS)."""
    if not fragment or not fragment.strip():
        return ""
    root = lxml.html.fragment_fromstring(fragment, create_parent="article")
    for element in list(root.iter(*_LEAF_BLOCKS)):
        if element.getparent() is None or _inside(element, "pre"):
            continue
        text = _text_of(element)
        if not text or len(text) > short_chars:
            continue
        link_chars = sum(len(_text_of(a)) for a in element.iter("a"))
        if (link_blocks and link_chars >= link_share * len(text)) or "©" in text:
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
        if last is None or last.tag not in _HEADINGS or (last.tail or "").strip():
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


def extract_pdf(data: bytes, url: str | None = None) -> Extracted:
    """The text of a PDF through pymupdf4llm (Markdown), kept as HTML like
    every other document. Page headers and footers are left out: they repeat
    on every page and are not the content.

    A PDF of more than MAX_LAYOUT_PAGES pages is read as plain text.
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
        if doc.page_count > MAX_LAYOUT_PAGES:
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
    reading of a PDF of more than MAX_LAYOUT_PAGES pages."""
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
    return extract_html(data, url).text
