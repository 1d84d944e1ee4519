"""What the search page reads: documents from the LanceDB index, pages from
the wiki folder. Never DuckDB.

Documents are paged exactly as the MCP tool read_document pages them: the
same paging helper (mcp_server/pages.py: word offsets, pages of at most
about 2,000 words that end at a passage end when they can) and the same
reading order (the post first). So a page of the web and a page of the MCP
tool with the same offset hold the same words.

The wiki: `WikiReader` reads one page, resolves a wikilink, and searches the
page files by their words. The page searches the wiki through the index
(source kind `wiki`, written by the `wiki_index` asset) when the index holds
it, with the same search function as the bookmarks; the file search is for a
wiki that the index does not hold yet.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kb_assets.urls import normalize_url
from kb_assets.wiki_checks import WIKILINK, _split_frontmatter
from kb_resources.lance_index import ChunkIndex
from mcp_server.pages import OffsetError, Passage, page_of

# The reading order of the texts behind one bookmark, as in read_document
# (mcp_server/server.py): the post, then what it quotes and links to, then
# what its media hold.
SOURCE_ORDER = {"post": 0, "quote": 1, "article": 2, "link": 3, "video": 4, "image": 5}
WIKI_SOURCE = "wiki"
X_STATUS = re.compile(r"^https?://(?:[\w-]+\.)?(?:x|twitter)\.com/(?:[^/?#]+|i(?:/web)?)/status(?:es)?/(\d+)",
                      re.IGNORECASE)
TOKEN = re.compile(r"\w+", re.UNICODE)
STOP_WORDS = frozenset(
    "a an and are as at be but by for from has have how i in is it its of on or that the this to was what "
    "when where which who why will with you your does do did not no can".split())


class DocumentNotFound(LookupError):
    """No bookmark and no page in the index has this id or URL."""


# --- documents in the index ------------------------------------------------------


def reading_order(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (SOURCE_ORDER.get(r["source"], 9), r["source"], r["ref"], r["position"]))


def resolve_document(target: str, index: ChunkIndex) -> tuple[str | None, str | None, list[dict]]:
    """(tweet_id, ref, passages) of what `target` names: a bookmark id or
    post URL (every text behind the bookmark), or the URL of one page."""
    target = (target or "").strip()
    if not target:
        raise ValueError("id is empty: give a bookmark id or the URL of a document")
    status = X_STATUS.match(target)
    tweet_id = status.group(1) if status else (target if "://" not in target else None)
    if tweet_id is not None:
        rows = index.passages(tweet_id=tweet_id)
        if rows or index.bookmark(tweet_id) is not None:
            return tweet_id, None, reading_order(rows)
    if "://" in target:
        for ref in _url_forms(target):
            rows = index.passages(ref=ref)
            if rows:
                return None, ref, reading_order(rows)
        raise DocumentNotFound(f"id={target!r} is not in the index: no bookmark and no page has this URL")
    raise DocumentNotFound(f"id={target!r} is not in the index: no bookmark has this id")


def _url_forms(url: str) -> list[str]:
    # As given, with and without a final slash, and as the documents stage
    # stores a page (kb_assets/urls.py normalize_url).
    forms = [url, url.rstrip("/") if url.endswith("/") else url + "/"]
    try:
        forms.append(normalize_url(url))
    except ValueError:
        pass
    return list(dict.fromkeys(forms))


def read_document(target: str, offset: int | str = 0, *, index: ChunkIndex) -> dict:
    """One page of a document, from word `offset`, as read_document gives it."""
    try:
        offset = int(offset)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"offset={offset!r} is not a whole number") from exc
    tweet_id, ref, rows = resolve_document(target, index)
    passages = [Passage(r["source"], r["ref"], int(r["position"]), r["text"]) for r in rows]
    try:
        page = page_of(passages, offset)
    except OffsetError as exc:
        raise ValueError(str(exc)) from exc
    return {"id": target, "tweet_id": tweet_id, "ref": ref, "offset": page.offset,
            "next_offset": page.next_offset, "has_more": page.has_more, "page_words": page.words,
            "total_words": page.total_words, "total_passages": len(passages), "parts": page.parts}


def bookmark_documents(outline: list[dict]) -> list[dict]:
    """The texts behind one bookmark (from ChunkIndex.outline), one entry
    per (source, ref) in reading order, with their passages and words."""
    documents: dict[tuple[str, str], dict] = {}
    for row in reading_order(outline):
        doc = documents.setdefault((row["source"], row["ref"]),
                                   {"source": row["source"], "ref": row["ref"], "passages": 0, "words": 0})
        doc["passages"] += 1
        doc["words"] += row.get("word_count") or 0
    return list(documents.values())


def media_captions(index: ChunkIndex, tweet_id: str, media: list[dict]) -> list[dict]:
    """Each media item with `caption`: from the card, or else the text of
    the photo's `image` passages (ref = the photo URL)."""
    out = []
    for item in media:
        item = dict(item)
        if not item.get("caption") and item.get("url"):
            rows = [r for r in index.passages(tweet_id=tweet_id, ref=item["url"]) if r["source"] == "image"]
            item["caption"] = "\n\n".join(r["text"] for r in rows)
        out.append(item)
    return out


# --- the wiki ------------------------------------------------------------------------


class WikiPageNotFound(LookupError):
    """No wiki page has this path."""


@dataclass
class WikiPage:
    path: str  # how links name it: entities/Ada Lovelace; files at the top: index
    file: Path
    title: str
    type: str
    frontmatter: dict
    body: str
    counts: Counter = field(repr=False, default_factory=Counter)
    title_terms: set = field(repr=False, default_factory=set)
    length: int = 0


def page_path(ref: str) -> str:
    """The link path of a page from its path in the wiki folder:
    wiki/concepts/x.md -> concepts/x (the ref of the `wiki` passages)."""
    return ref.strip().removeprefix("wiki/").removesuffix(".md")


class WikiReader:
    """Read-only access to the wiki folder (settings.wiki_dir): the pages
    under wiki/, and the Markdown files at the top (index, log, purpose).

    A page is parsed once and kept until its file changes (size or mtime),
    so a search while the owner types does not parse every file again."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[Path, tuple[tuple[int, int], WikiPage]] = {}
        self._lock = threading.Lock()

    def exists(self) -> bool:
        return (self.root / "wiki").is_dir()

    def _files(self) -> list[tuple[str, Path]]:
        if not self.exists():
            return []
        tops = [(f.stem, f) for f in sorted(self.root.glob("*.md"))]
        pages = [(page_path(f.relative_to(self.root).as_posix()), f) for f in sorted((self.root / "wiki").rglob("*.md"))]
        # Hidden files are not pages, and a symbolic link out of the wiki
        # folder is not one either: the page shows the wiki, nothing else.
        inside = self.root.resolve()
        return [(path, f) for path, f in tops + pages
                if f.is_file() and f.resolve().is_relative_to(inside)
                and not any(part.startswith(".") for part in f.relative_to(self.root).parts)]

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
        frontmatter, _, body_lines, _ = _split_frontmatter(file.read_text(encoding="utf-8", errors="replace"))
        frontmatter = frontmatter or {}
        body = "\n".join(body_lines)
        title = _title(frontmatter, body_lines, path)
        words = [light_stem(w) for w in TOKEN.findall(plain_text(body))]
        folder = path.split("/", 1)[0] if "/" in path else ""
        page = WikiPage(path=path, file=file, title=title, type=str(frontmatter.get("type") or folder or "page"),
                        frontmatter=frontmatter, body=body, counts=Counter(words),
                        title_terms={light_stem(w) for w in TOKEN.findall(title)}, length=len(words))
        self._cache[file] = (key, page)
        return page

    def resolve(self, link: str) -> str | None:
        """The path of the page that a wikilink names, or None."""
        return self.resolver()(link)

    def resolver(self):
        """A function from a wikilink to a page path (or None), over the pages
        as they are now: one folder scan for all links of a page. The rules
        of kb_assets/wiki_checks.py: a path under wiki/ without .md (`wiki/`
        in front is allowed), a file at the top, or a bare name that exactly
        one page has (Obsidian resolves it so)."""
        paths = {page.path for page in self.pages()}
        stems: dict[str, list[str]] = {}
        for path in paths:
            if "/" in path:
                stems.setdefault(path.rsplit("/", 1)[1], []).append(path)

        def resolve(link: str) -> str | None:
            target = page_path(link.split("|", 1)[0].split("#", 1)[0])
            if target in paths:
                return target
            if target and "/" not in target and len(stems.get(target, [])) == 1:
                return stems[target][0]
            return None

        return resolve

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


def _title(frontmatter: dict, body_lines: list[str], path: str) -> str:
    for line in body_lines:
        if line.startswith("# "):
            return line[2:].strip()
    for key in ("title", "name"):
        if frontmatter.get(key):
            return str(frontmatter[key])
    return path.rsplit("/", 1)[-1]


def plain_text(markdown_text: str) -> str:
    """Markdown with each wikilink as the words that a reader sees."""
    def shown(match: re.Match) -> str:
        target, _, label = match.group(1).partition("|")
        return label or target.split("#", 1)[0].rsplit("/", 1)[-1]
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
    terms: list[str] = []
    for word in TOKEN.findall(query or ""):
        stem = light_stem(word)
        if word.lower() not in STOP_WORDS and stem not in terms:
            terms.append(stem)
    return terms


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
