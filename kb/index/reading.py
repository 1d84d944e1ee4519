"""Reading on the serving side: documents from the LanceDB index and pages
from the wiki folder. The MCP server (mcp_server/server.py) and the search
page (kb/apps/web/) both read through this module, so the same id gives
the same document, and the same offset gives the same words, in both.

This module never opens DuckDB: a sync holds the DuckDB file for minutes,
and the readers must answer while it runs.

Documents:
- `resolve_document()` turns a tweet id, a post URL or a page URL into a
  `Document`: its passages, in reading order (SOURCE_ORDER).
- `page_of()` gives one bounded page of the passages. A page never holds
  more than PAGE_WORDS words or PAGE_CHARS characters, so a 78,000-word
  changelog cannot flood the caller's context. The offset counts words from
  the start of the document; each page gives the offset of the next page.
  A page ends at the end of a passage when that keeps at least half of the
  page, so passages mostly stay whole. A passage that does not fit is cut
  between two words, and the next page starts with the word after the cut.
  Pages never overlap and never skip a word: joined, they give the document.

Wiki pages:
- `wiki_page_path()` refuses every path that can leave the wiki folder.
- `is_wiki_page()` says if a file in the folder is a page that a reader may
  show. `read_wiki_file()` reads one page by its path.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from kb.urls import normalize_url
from kb.wiki_files import WIKI_PAGE_SUFFIX, WIKI_SOURCE, WikiPage, is_wiki_page, page_target, read_page
from kb.index.client import ChunkIndex

# --- bounded pages -----------------------------------------------------------------

PAGE_WORDS = 2000
# About 8 characters for each word. English prose needs about 6, so the word
# bound decides for prose; the character bound decides for text with few
# spaces (URLs, code, Chinese or Japanese text).
PAGE_CHARS = 16_000
# A run of more than this many characters with no space counts as several
# words. Else one 50,000-character line of base64 or of Chinese text would be
# one "word", and the page would have no bound.
MAX_WORD_CHARS = 64
WORD = re.compile(r"\S{1,%d}" % MAX_WORD_CHARS)


@dataclass(frozen=True)
class Passage:
    """One passage of a document, in reading order."""

    source: str
    ref: str
    position: int
    text: str


@dataclass(frozen=True)
class Page:
    offset: int
    next_offset: int | None
    total_words: int
    words: int
    parts: list[dict]

    @property
    def has_more(self) -> bool:
        return self.next_offset is not None


class OffsetError(ValueError):
    """The offset is not in the document."""


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character positions of each word of the text."""
    return [m.span() for m in WORD.finditer(text)]


def count_words(text: str) -> int:
    return sum(1 for _ in WORD.finditer(text))


def word_offsets(passages: list[Passage]) -> list[int]:
    """The word offset at which each passage starts."""
    offsets, total = [], 0
    for passage in passages:
        offsets.append(total)
        total += count_words(passage.text)
    return offsets


def page_of(passages: list[Passage], offset: int = 0, *,
            max_words: int = PAGE_WORDS, max_chars: int = PAGE_CHARS) -> Page:
    """The page that starts `offset` words into the passages.

    Raises OffsetError when the offset is negative or past the end. An
    offset equal to the number of words gives an empty last page."""
    # (passage index, start, end) of each word of the document.
    words = [(index, start, end) for index, passage in enumerate(passages)
             for start, end in word_spans(passage.text)]
    total = len(words)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise OffsetError(f"offset={offset!r} is not a whole number")
    if offset < 0:
        raise OffsetError(f"offset={offset} is negative: the first page has offset 0")
    if offset > total:
        raise OffsetError(f"offset={offset} is past the end: the document has {total} words")
    end = _page_end(words, offset, max_words, max_chars)
    parts = _parts(passages, words, offset, end)
    return Page(offset=offset, next_offset=end if end < total else None, total_words=total,
                words=end - offset, parts=parts)


def _page_end(words: list[tuple[int, int, int]], offset: int, max_words: int, max_chars: int) -> int:
    """The offset after the last word of the page."""
    end, chars = offset, 0
    while end < len(words) and end - offset < max_words:
        index, start, stop = words[end]
        same_passage = end > offset and words[end - 1][0] == index
        # Inside one passage the page keeps the text between the words too.
        added = stop - words[end - 1][2] if same_passage else stop - start
        if end > offset and chars + added > max_chars:
            break
        chars += added
        end += 1
    if end == len(words):
        return end
    # Prefer to stop at the end of a passage, when that keeps half the page.
    for cut in range(end, offset + (end - offset) // 2, -1):
        if words[cut][0] != words[cut - 1][0]:
            return cut
    return end


def _parts(passages: list[Passage], words: list[tuple[int, int, int]], offset: int, end: int) -> list[dict]:
    parts: list[dict] = []
    cursor = offset
    while cursor < end:
        index = words[cursor][0]
        last = cursor
        while last + 1 < end and words[last + 1][0] == index:
            last += 1
        passage = passages[index]
        start_char, end_char = words[cursor][1], words[last][2]
        whole = (cursor == 0 or words[cursor - 1][0] != index) and (
            last + 1 == len(words) or words[last + 1][0] != index)
        parts.append({
            "source": passage.source,
            "ref": passage.ref,
            "position": passage.position,
            "text": passage.text[start_char:end_char],
            # False: the passage goes on in the page before or after this one.
            "whole_passage": whole,
        })
        cursor = last + 1
    return parts


def clip_words(text: str, max_words: int, max_chars: int = PAGE_CHARS) -> tuple[str, bool]:
    """The text cut after `max_words` words (or `max_chars` characters), and
    whether it was cut."""
    spans = word_spans(text)
    keep = spans[:max_words]
    while keep and keep[-1][1] - keep[0][0] > max_chars:
        keep.pop()
    if len(keep) == len(spans):
        return text, False
    return (text[keep[0][0]:keep[-1][1]] if keep else ""), True


# --- documents in the index ----------------------------------------------------------

# Reading order of the texts behind one bookmark: the post first, then what
# it quotes and links to, then what its media hold.
SOURCE_ORDER = {"post": 0, "thread": 1, "quote": 2, "article": 3, "link": 4, "video": 5, "image": 6}
UNKNOWN_SOURCE_RANK = 9
STATUS_URL = re.compile(r"^https?://(?:[\w-]+\.)?(?:x|twitter)\.com/(?:[^/?#]+|i(?:/web)?)/status(?:es)?/(\d+)",
                        re.IGNORECASE)
URL = re.compile(r"^https?://", re.IGNORECASE)


class DocumentNotFound(LookupError):
    """No bookmark and no page in the index has this id or URL."""


@dataclass(frozen=True)
class Document:
    """What one id or URL names: every text behind a bookmark (tweet_id is
    set), or one page (ref is set). `rows` are the index rows, in reading
    order."""

    tweet_id: str | None
    ref: str | None
    rows: list[dict]

    @property
    def passages(self) -> list[Passage]:
        return [Passage(r["source"], r["ref"], int(r["position"]), r["text"]) for r in self.rows]


def source_rank(source: str) -> int:
    return SOURCE_ORDER.get(source, UNKNOWN_SOURCE_RANK)


def reading_order(rows: list[dict]) -> list[dict]:
    """Rows of one bookmark in reading order: by SOURCE_ORDER, then ref and
    position."""
    return sorted(rows, key=lambda r: (source_rank(r["source"]), r["source"], r["ref"], r["position"]))


def tweet_id_from(value: str) -> str:
    """The tweet id in a post URL; any other value as it is."""
    value = value.strip()
    match = STATUS_URL.match(value)
    return match.group(1) if match else value


def resolve_document(index: ChunkIndex, value: str, *, name: str = "id") -> Document:
    """The document that `value` names: a tweet id or a post URL (every text
    behind the bookmark), or the URL of one page. `name` is the name of the
    input in the error messages.

    Raises ValueError for an empty value, DocumentNotFound when the index
    holds neither a bookmark nor a page for it."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} is empty: give a tweet id, a post URL or a page URL")
    value = value.strip()
    # A post URL means the bookmark with all the texts behind it, not only
    # the passage whose ref is that URL.
    tweet_id = tweet_id_from(value)
    if tweet_id != value or not URL.match(value):
        rows = index.passages(tweet_id=tweet_id)
        if rows or index.bookmark(tweet_id) is not None:
            return Document(tweet_id=tweet_id, ref=None, rows=reading_order(rows))
    if URL.match(value):
        for ref in url_forms(value):
            rows = index.passages(ref=ref)
            if rows:
                return Document(tweet_id=None, ref=ref, rows=reading_order(rows))
    what = "no bookmark and no page has this URL" if URL.match(value) else "no bookmark has this id"
    raise DocumentNotFound(f"{name}={value!r} is not in the index: {what}")


def url_forms(url: str) -> list[str]:
    """The forms of a page URL to look up: as given, without or with a final
    slash, and as the documents stage stores a page (normalize_url)."""
    forms = [url, url.rstrip("/") if url.endswith("/") else url + "/"]
    try:
        forms.append(normalize_url(url))
    except ValueError:
        pass  # not a web address: the forms above are all there is
    return list(dict.fromkeys(forms))


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


def media_with_captions(index: ChunkIndex, tweet_id: str, media: list[dict], *,
                        max_words: int | None = None) -> list[dict]:
    """Each media item of a bookmark card, with `caption` when there is one:
    from the card, or else the text of the photo's `image` passages (the
    caption stage writes them, ref = photo URL). With `max_words`, a longer
    caption is cut and the item gets `caption_cut`."""
    out = []
    for item in media:
        item = dict(item)
        caption = item.get("caption")
        if not caption and item.get("url"):
            rows = [r for r in index.passages(tweet_id=tweet_id, ref=item["url"]) if r["source"] == "image"]
            caption = "\n\n".join(r["text"] for r in rows)
        if caption:
            if max_words is not None:
                caption, cut = clip_words(caption, max_words)
                if cut:
                    item["caption_cut"] = True
            item["caption"] = caption
        out.append(item)
    return out


class SourceKinds:
    """The source kinds in an index, counted again only when the passages
    table has a new version: a search per key press must not scan the
    table's source column each time."""

    def __init__(self) -> None:
        self._cached: tuple[tuple[str, int] | None, list[str]] = (None, [])
        self._lock = threading.Lock()

    def of(self, index: ChunkIndex) -> list[str]:
        # A reader must not create the index folder (ChunkIndex would) in an
        # empty KB_HOME.
        if not index.exists():
            return []
        version = index.version()
        # The place is part of the key: two indexes can have equal versions.
        key = (index.path, version) if version is not None else None
        with self._lock:
            if key is not None and self._cached[0] == key:
                return self._cached[1]
        kinds = index.source_kinds()
        with self._lock:
            self._cached = (key, kinds)
        return kinds


def source_list(source: str | None) -> list[str]:
    """The source kinds of a comma list, in lower case."""
    return [s.strip().lower() for s in (source or "").split(",") if s.strip()]


def bookmark_sources(asked: list[str], kinds: Callable[[], list[str]]) -> list[str] | None:
    """The source filter of a bookmark search. The wiki passages share the
    index, and the wiki has its own search: leave them out. `kinds` gives
    the kinds in the index; it is called only when nothing is asked. None:
    the index holds no wiki, so no filter is needed (a filter costs a
    prefilter in the search)."""
    if asked:
        return [s for s in asked if s != WIKI_SOURCE]
    known = kinds()
    return [k for k in known if k != WIKI_SOURCE] if WIKI_SOURCE in known else None


# --- wiki pages ----------------------------------------------------------------------

# Page paths in links may have the pages folder in front: wiki/concepts/x.
PAGES_FOLDER = "wiki"


class WikiPathError(ValueError):
    """The path can never name a wiki page: it is refused before any file is
    read."""


class WikiPageNotFound(LookupError):
    """No wiki page has this path."""


@dataclass(frozen=True)
class WikiFile:
    path: str  # relative to the wiki folder: wiki/concepts/vector-search.md
    file: Path
    text: str
    page: WikiPage  # what the page says: title, type, date, links (kb.wiki_files.read_page)

    @property
    def frontmatter(self) -> dict:
        return self.page.meta

    @property
    def body(self) -> list[str]:  # the lines after the frontmatter
        return self.page.body


def wiki_page_path(path: str) -> PurePosixPath:
    """The page path relative to the wiki folder. Refuses every path that
    could leave the wiki folder (absolute, `..`), hidden files (.git) and
    files that are not Markdown pages. A link target (concepts/x#para3|text)
    is a path too."""
    if not isinstance(path, str) or not path.strip():
        raise WikiPathError("path is empty: give a page path as search_wiki gives it, "
                            "for example wiki/concepts/vector-search.md")
    raw = path.strip().split("#", 1)[0].split("|", 1)[0].strip().replace("\\", "/")
    if not raw:
        raise WikiPathError(f"path={path!r} names no page")
    if raw.startswith(("/", "~")) or PureWindowsPath(path.strip()).drive:
        raise WikiPathError(f"path={path!r} is absolute: give a path inside the wiki folder")
    relative = PurePosixPath(raw)
    if ".." in relative.parts:
        raise WikiPathError(f"path={path!r} leaves the wiki folder: '..' is not allowed")
    if any(part.startswith(".") for part in relative.parts):
        raise WikiPathError(f"path={path!r} is a hidden file: only wiki pages can be read")
    if relative.suffix and relative.suffix != WIKI_PAGE_SUFFIX:
        raise WikiPathError(f"path={path!r} is not a Markdown page (.md)")
    return relative if relative.suffix else relative.with_name(relative.name + WIKI_PAGE_SUFFIX)


def wiki_page_file(root: Path, path: str) -> Path:
    """The real file of the page that `path` names: the path from the wiki
    folder, or from its wiki/ folder (as in a link). Raises WikiPathError for
    a path or a symbolic link that leaves the folder, WikiPageNotFound when
    there is no such page."""
    relative = wiki_page_path(path)
    base = root.resolve()
    for candidate in (relative, PurePosixPath(PAGES_FOLDER) / relative):
        file = (base / candidate).resolve()
        if not file.is_relative_to(base):
            raise WikiPathError(f"path={path!r} leaves the wiki folder")
        if file.is_file():
            if not is_wiki_page(base, file):
                raise WikiPathError(f"path={path!r} links to a file that is not a wiki page")
            return file
    raise WikiPageNotFound(f"path={path!r} is not a wiki page: there is no file {relative} in the wiki")


def read_wiki_file(root: Path, path: str) -> WikiFile:
    """Read the page that `path` names, with its frontmatter. A page whose
    frontmatter is missing or is not YAML gets an empty dict."""
    wiki_page_path(path)  # a bad path gets its own error before the folder is looked at
    if not root.is_dir():
        raise WikiPageNotFound(f"path={path!r}: the wiki does not exist yet (no folder {root})")
    file = wiki_page_file(root, path)
    text = file.read_text(encoding="utf-8", errors="replace")
    relative = file.relative_to(root.resolve()).as_posix()
    # The one reader of a page: the web page, the index and the checks read it so too.
    return WikiFile(path=relative, file=file, text=text, page=read_page(text, page_target(relative)))
