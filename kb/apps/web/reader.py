"""What the search page reads: documents from the LanceDB index, pages from
the wiki folder. Never DuckDB.

Documents are read and paged through kb/index/reading.py, as the MCP tool
read_document reads and pages them: the same id gives the same passages in
the same reading order, and a page of the web and a page of the MCP tool
with the same offset hold the same words.

The wiki: `WikiReader` reads one page, resolves a wikilink, and searches the
page files by their words. The page searches the wiki through the index
(source kind `wiki`, written by the `wiki_index` asset) when the index holds
it, with the same search function as the bookmarks; the file search is for a
wiki that the index does not hold yet.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cachetools import LRUCache

from kb.index.reading import WikiPageNotFound, page_of, resolve_document
from kb.wiki_files import (WIKILINK, LinkResolver, is_wiki_page, page_target, parse_link, read_page, wiki_page_files,
                           without_comments)
from kb.index.client import ChunkIndex

TOKEN = re.compile(r"\w+", re.UNICODE)
STOP_WORDS = frozenset(
    "a an and are as at be but by for from has have how i in is it its of on or that the this to was what "
    "when where which who why will with you your does do did not no can".split())


# --- documents in the index ------------------------------------------------------


def read_document(target: str, offset: int | str = 0, *, index: ChunkIndex) -> dict:
    """One page of a document, from word `offset`, as read_document gives it."""
    try:
        offset = int(offset)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"offset={offset!r} is not a whole number") from exc
    document = resolve_document(index, target, name="id")
    passages = document.passages
    page = page_of(passages, offset)  # OffsetError is a ValueError
    return {"id": target, "tweet_id": document.tweet_id, "ref": document.ref, "offset": page.offset,
            "next_offset": page.next_offset, "has_more": page.has_more, "page_words": page.words,
            "total_words": page.total_words, "total_passages": len(passages), "parts": page.parts}


# --- the wiki ------------------------------------------------------------------------


@dataclass
class WikiPage:
    path: str  # how links name it: entities/Ada Lovelace; files at the top: index
    file: Path
    title: str
    type: str
    date: datetime | None  # UTC
    frontmatter: dict
    body: str
    counts: Counter = field(repr=False, default_factory=Counter)
    title_terms: set = field(repr=False, default_factory=set)
    length: int = 0


# The HTML of the pages that the web page showed last: about 64 MB of text at
# most (a page of 256 KiB of Markdown gives about 1 MB).
RENDERED_CHARS = 64 * 1024 * 1024


def page_path(ref: str) -> str:
    """The link path of a page from its path in the wiki folder:
    wiki/concepts/x.md -> concepts/x (the ref of the `wiki` passages)."""
    return page_target(ref)


class WikiReader:
    """Read-only access to the wiki folder (settings.wiki_dir): the pages
    under wiki/, and the Markdown files at the top (index, log, purpose).

    A page is parsed once and kept until its file changes (size or mtime),
    so a search while the owner types does not parse every file again. Its
    HTML is kept too (rendered())."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[Path, tuple[tuple[int, int], WikiPage]] = {}
        self._lock = threading.Lock()
        # file -> ((render function, digest of the body and of the page names), HTML)
        self._rendered: LRUCache = LRUCache(maxsize=RENDERED_CHARS, getsizeof=lambda kept: len(kept[1]))

    def exists(self) -> bool:
        return (self.root / "wiki").is_dir()

    def _files(self) -> list[tuple[str, Path]]:
        if not self.exists():
            return []
        tops = [(f.stem, f) for f in sorted(self.root.glob("*.md"))]
        pages = [(page_path(f.relative_to(self.root).as_posix()), f) for f in wiki_page_files(self.root)]
        # The page shows the wiki, nothing else: no hidden file, and no
        # symbolic link out of the folder.
        return [(path, f) for path, f in tops if is_wiki_page(self.root, f)] + pages

    def pages(self) -> list[WikiPage]:
        with self._lock:
            out, live = [], set()
            for path, file in self._files():
                live.add(file)
                out.append(self._load(path, file))
            for gone in set(self._cache) - live:
                del self._cache[gone]
        return out

    def _load(self, path: str, file: Path) -> WikiPage:
        stat = file.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        cached = self._cache.get(file)
        if cached and cached[0] == key:
            return cached[1]
        # The one reader of a page (kb.wiki_files.read_page): the MCP server,
        # the index and the checks read the same title, type and date.
        read = read_page(file.read_text(encoding="utf-8", errors="replace"), path)
        # What a reader sees: the search words and snippets leave HTML comments out, as the page does.
        body, title = without_comments("\n".join(read.body)), read.title
        words = [light_stem(w) for w in TOKEN.findall(plain_text(body))]
        page = WikiPage(path=path, file=file, title=title, type=read.type, date=read.date,
                        frontmatter=read.meta, body=body, counts=Counter(words),
                        title_terms={light_stem(w) for w in TOKEN.findall(title)}, length=len(words))
        self._cache[file] = (key, page)
        return page

    def resolve(self, link: str) -> str | None:
        """The path of the page that a wikilink names, or None."""
        return self.resolver()(link)

    def resolver(self) -> LinkResolver:
        """A function from a wikilink to a page path (or None), over the pages
        as they are now: one folder scan for all links of a page. The one
        rule of kb (kb.wiki_files.LinkResolver), as the checks resolve links."""
        return self._resolver(self.pages())

    def _resolver(self, pages: list[WikiPage]) -> LinkResolver:
        return LinkResolver((p.path for p in pages if p.file.parent != self.root),
                            (p.path for p in pages if p.file.parent == self.root))

    def rendered(self, page: WikiPage, render: Callable[[str, LinkResolver], str]) -> str:
        """The page's body as HTML: render(body, resolver), kept while the
        body and the names of the wiki's pages stay the same (a link shows
        as missing or as a link by the names). Why: Python-Markdown takes
        65 to 90 microseconds for each heading: a log.md of 7,000 entries
        took 1.5 s, and 256 KiB of headings that a source can get the agent
        to write took about 4 s, on each view of the page (7 December
        2026). At most RENDERED_CHARS of HTML are kept (cachetools' LRU);
        a page whose HTML is larger alone is rendered on each view."""
        pages = self.pages()
        digest = hashlib.blake2b(page.body.encode("utf-8", "surrogatepass"), digest_size=16)
        for name in sorted((p.path, p.file.parent == self.root) for p in pages):
            digest.update(repr(name).encode("utf-8", "surrogatepass"))
        stamp = (render, digest.digest())
        with self._lock:
            kept = self._rendered.get(page.file)  # get() marks it as used
        if kept is not None and kept[0] == stamp:
            return kept[1]
        # Not under the lock: a render takes up to seconds, and a search waits for the lock.
        html = render(page.body, self._resolver(pages))
        with self._lock, contextlib.suppress(ValueError):  # ValueError: one page's HTML above RENDERED_CHARS
            self._rendered[page.file] = (stamp, html)
        return html

    def read(self, path: str) -> WikiPage:
        path = page_path(path or "")
        if not path:
            raise ValueError("path is empty: give a wiki page path, for example entities/Ada Lovelace")
        # Only a path that the listing holds: `..` or a link out of the
        # folder can never match one.
        for page in self.pages():
            if page.path == path:
                return page
        raise WikiPageNotFound(f"path={path!r}: no wiki page has this path in {self.root}")

    def describe(self, path: str) -> tuple[str, str]:
        """(title, type) of a page; for a page that is gone from the folder
        but still in the index, its name and folder."""
        try:
            page = self.read(path)
            return page.title, page.type
        except (WikiPageNotFound, ValueError):
            return path.rsplit("/", 1)[-1], path.split("/", 1)[0]

    def search(self, query: str, limit: int = 10) -> list[dict]:
        """Pages under wiki/ ranked by BM25 over their words, title words
        counted extra; a page that holds the whole query phrase ranks first.
        The files at the top (index, log) list every page and would match
        every query: they are read, not searched."""
        terms = query_terms(query)
        pages = [page for page in self.pages() if "/" in page.path]
        if not terms or not pages:
            return []
        average = sum(p.length for p in pages) / len(pages) or 1.0
        holders = {t: sum(1 for p in pages if p.counts.get(t) or t in p.title_terms) for t in terms}
        phrase = " ".join(TOKEN.findall(query.lower()))
        scored = []
        for page in pages:
            score = 0.0
            for term in terms:
                tf = page.counts.get(term, 0) + (3 if term in page.title_terms else 0)
                if tf:
                    idf = math.log(1 + (len(pages) - holders[term] + 0.5) / (holders[term] + 0.5))
                    score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * page.length / average))
            if score > 0:
                words = " ".join(TOKEN.findall((page.title + " " + plain_text(page.body)).lower()))
                scored.append((len(terms) > 1 and f" {phrase} " in f" {words} ", score, page))
        scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [{"path": page.path, "title": page.title, "type": page.type, "score": round(score, 4),
                 "snippet": snippet(page.body, terms)} for _, score, page in scored[:limit]]


def plain_text(markdown_text: str) -> str:
    """Markdown with each wikilink as the words that a reader sees."""
    def shown(match: re.Match) -> str:
        link = parse_link(match.group(1))
        return link.text or link.target.rsplit("/", 1)[-1]
    return WIKILINK.sub(shown, markdown_text)


# --- matched words ---------------------------------------------------------------


def light_stem(word: str) -> str:
    """A crude English stem, so that "checkers" matches "checker". It only
    has to agree with itself: both sides of a comparison use it."""
    word = word.lower()
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def query_terms(query: str) -> list[str]:
    """The stems of the query words that carry meaning, in query order."""
    # A dict keeps the order and finds a stem at once: a list made this
    # quadratic in the number of words.
    terms: dict[str, None] = {}
    for word in TOKEN.findall(query or ""):
        if word.lower() not in STOP_WORDS:
            terms.setdefault(light_stem(word))
    return list(terms)


def highlight_spans(text: str, query: str) -> list[list[int]]:
    """[start, end) character spans of the words of `text` that match a query
    word. The page marks them with text nodes; it never parses text as HTML."""
    terms = set(query_terms(query))
    if not terms:
        return []
    return [[m.start(), m.end()] for m in TOKEN.finditer(text or "") if light_stem(m.group()) in terms]


def snippet(text: str, terms: list[str], width: int = 240) -> str:
    """The first text line that holds a query word, cut to `width`
    characters around the word; headings only when no text line does."""
    lines = [line.strip() for line in plain_text(text).splitlines() if line.strip()]
    prose = [line.lstrip(">-* ").strip() for line in lines if not line.startswith("#")]
    headings = [line.lstrip("# ").strip() for line in lines if line.startswith("#")]
    for line in prose + headings:
        spans = [m.start() for m in TOKEN.finditer(line) if light_stem(m.group()) in terms]
        if spans:
            if len(line) <= width:
                return line
            start = max(0, spans[0] - width // 3)
            return ("…" if start else "") + line[start:start + width] + ("…" if start + width < len(line) else "")
    return prose[0][:width] if prose else ""
