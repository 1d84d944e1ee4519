"""Wiki files: which files are pages, and what a page says.

One copy of each rule. The wiki index, the checks, the MCP server, the web
page and the wiki stage all list and read pages here. Two listings once
drifted apart, and one of them let a symbolic link to .git/config into the
search index. Four readers once read a page's title, date and links by
rules of their own, and they disagreed: `read_page` is the one reader now,
and `LinkResolver` the one rule from a link to a page.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path, PurePath
from typing import NamedTuple

import yaml
from frontmatter.default_handlers import YAMLHandler

from kb.store.atomic_files import write_atomic

# libyaml's loader when PyYAML has it: the same safe subset. The pure Python
# loader, which python-frontmatter takes unless told otherwise, took about
# half of a warm `kb wiki check` (benchmarks/wiki_check.md).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _PageYAML(YAMLHandler):
    """python-frontmatter's YAML handler with kb's boundary: a line that is
    `---` and nothing else but spaces. The library's own boundary also takes
    `----` and the blank lines after the closing line, and pages would lose
    their first blank line."""

    FM_BOUNDARY = re.compile(r"^[ \t]*---[ \t\r]*$", re.MULTILINE)


_YAML = _PageYAML()

PAGES_FOLDER = "wiki"  # the pages live in <wiki root>/wiki/
WIKI_PAGE_SUFFIX = ".md"
# How wiki pages appear in the search index: source kind, id prefix, author.
WIKI_SOURCE = "wiki"
WIKI_ID_PREFIX = "wiki:"
WIKI_AUTHOR = "wiki"
# A link between pages: [[target]], [[target|text]], [[target#anchor]], and
# the embed ![[target]]. Group 1 is the text between the brackets.
# No bracket inside: with "[" allowed there, each "[" of a line read to the
# line's end, and a line of 40,000 "[" took 16 s (7 December 2026).
WIKILINK = re.compile(r"!?\[\[([^\[\]\n]+)\]\]")
# What a reader of a page does not see: an HTML comment, and Obsidian's own
# comment (%%...%%, on one line or over several). A line that a source
# talked the agent into hiding there keeps no claim of the owner's.
# comment_spans() finds them; a regex (<!--.*?-->) read to the end of the
# text from each opening that is never closed: quadratic.
COMMENT_MARKS = (("<!--", "-->"), ("%%", "%%"))
# The first line of a fenced code block, and its last.
FENCE = re.compile(r"^(```|~~~)")
# A line that starts a block of its own in Markdown (a list item, a heading,
# a quote, a table row, HTML): it is never joined to the line above.
BLOCK_START = re.compile(r"^\s*(?:[-*+]\s|\d+[.)]\s|#|>|\||<)")

# What the wiki agent may change, by allowlist: Markdown pages in these
# folders, index.md, and log.md (append only). kb refuses every other path,
# at the tool call (kb/wiki/agent.py) and again on the change before it makes
# the commit (kb/wiki/repo.py). Why an allowlist: a list of forbidden paths is
# never complete, and one path that it missed (a second CLAUDE.md, a file in
# .claude/ with hooks) lets a source plant instructions for every later run.
AGENT_PAGE_FOLDERS = ("wiki/entities", "wiki/concepts", "wiki/sources", "wiki/syntheses")
AGENT_ROOT_FILES = ("index.md", "log.md")
APPEND_ONLY_FILES = ("log.md",)
# Files that an agent reads as instructions, at any depth (lower case).
PLAYBOOK_NAMES = frozenset({"claude.md", "claude.local.md", "agents.md"})


def _hidden_or_not_a_page(relative: PurePath) -> bool:
    return relative.suffix != WIKI_PAGE_SUFFIX or any(part.startswith(".") for part in relative.parts)


def agent_path_problem(relative: str) -> str | None:
    """None when the wiki agent may change the file at `relative` (a path
    relative to the wiki root, with `/`), else the rule that refuses it."""
    path = PurePath(relative)
    if not relative or path.is_absolute() or "\\" in relative:
        return f"{relative or 'an empty path'}: only relative paths inside the wiki"
    if any(ord(char) < 32 or ord(char) == 127 for char in relative):
        return f"{relative!r}: control characters are not allowed in a path"
    if any(part in ("", ".", "..") for part in relative.split("/")):
        return f"{relative}: no '.', '..' or empty parts in a path"
    if any(part.startswith(".") for part in path.parts):
        return f"{relative}: dot-files and dot-folders are not allowed"
    if any(part.lower() in PLAYBOOK_NAMES for part in path.parts):
        return f"{relative}: CLAUDE.md and AGENTS.md files are not allowed"
    if relative in AGENT_ROOT_FILES:
        return None
    if path.suffix != WIKI_PAGE_SUFFIX:
        return f"{relative}: only Markdown pages (.md) are allowed"
    if not any(relative.startswith(folder + "/") for folder in AGENT_PAGE_FOLDERS):
        return (f"{relative}: pages go only under {', '.join(f + '/' for f in AGENT_PAGE_FOLDERS)}"
                f" (and {' and '.join(AGENT_ROOT_FILES)})")
    return None


def is_wiki_page(root: Path, file: Path) -> bool:
    """True when `file` (a path below `root`) is a page that a reader may
    show: a Markdown file that is not hidden, and whose real file is a
    Markdown file inside the wiki folder that is not hidden either. The
    wiki agent writes from text off the internet: a symbolic link that it
    makes must not show a file outside the folder, or .git/config (it can
    hold the push URL)."""
    base = root.resolve()
    target = file.resolve()
    return (file.is_file() and not _hidden_or_not_a_page(file.relative_to(root))
            and target.is_relative_to(base) and not _hidden_or_not_a_page(target.relative_to(base)))


class OutsideWiki(ValueError):
    """A write of kb into the wiki whose path leads out of it. The message names the path."""


def inside_wiki(root: Path, path: Path) -> Path:
    """`path` when it resolves inside the wiki folder `root` and outside its
    .git folder, else OutsideWiki. Every write of kb into the wiki (a file,
    a folder, a move, a removal) checks its path here first. Why: a
    symbolic link in the wiki (from a hand edit, or from an archive of an
    earlier kb) leads a write through it: `raw -> /home/owner` made
    Wiki.ensure() and the parsed-source writer write in the owner's home."""
    base = Path(root).resolve()
    real = Path(path).resolve()
    if not real.is_relative_to(base) or real.is_relative_to(base / ".git"):
        raise OutsideWiki(f"{path} leads out of the wiki {root} (it resolves to {real}). kb writes only inside "
                          "the wiki, so it did not write there. Remove the symbolic link on the way.")
    return Path(path)


def write_wiki_file(root: Path, path: Path, data: bytes) -> None:
    """Write the file `path` of the wiki `root` atomically, after inside_wiki."""
    write_atomic(inside_wiki(root, path), data)


def make_wiki_folder(root: Path, folder: Path) -> Path:
    """Make the folder `folder` of the wiki `root` (and its parents), after inside_wiki."""
    inside_wiki(root, folder).mkdir(parents=True, exist_ok=True)
    return folder


def wiki_page_files(root: Path) -> list[Path]:
    """The pages under <root>/wiki/, sorted: every file that is_wiki_page
    accepts. Hidden files and folders (.gitkeep, .obsidian) are not pages."""
    folder = Path(root) / PAGES_FOLDER
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.rglob("*" + WIKI_PAGE_SUFFIX) if is_wiki_page(Path(root), f))


class Frontmatter(NamedTuple):
    """A page split at its frontmatter."""

    data: dict | None  # None when the page has none, or when it is not a YAML mapping
    error: str | None  # why `data` is None
    body: list[str]  # the lines after the frontmatter (all lines when there is none)
    body_start: int  # line number of the first body line


def split_frontmatter(text: str) -> Frontmatter:
    """The frontmatter and the body of a page. The web page and the MCP server
    read a page with this function too, so a page has the same frontmatter
    for the checks and for the readers. python-frontmatter finds and reads
    the block; kb keeps why a block is not valid and the body's line numbers,
    which the checks report."""
    lines = text.splitlines()
    if not lines or not _YAML.detect(text):
        return Frontmatter(None, "no frontmatter", lines, 1)
    try:
        head, rest = _YAML.split(text)
    except ValueError:  # one --- line only
        return Frontmatter(None, "frontmatter has no closing ---", lines, 1)
    # `rest` starts with the new line that ends the closing --- line.
    body_start = text[:len(text) - len(rest)].count("\n") + 2
    body = rest[1:].splitlines()
    # Without the new lines of the two --- lines, as the block reads:
    # a block scalar at the end (`key: |`) keeps no extra new line.
    block = head[1:].removesuffix("\n").removesuffix("\r")
    try:
        if _has_alias(block):
            return Frontmatter(None, "frontmatter uses a YAML alias (*name): kb reads no alias", body, body_start)
        data = _YAML.load(block, Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as exc:
        return Frontmatter(None, f"frontmatter is not valid YAML: {str(exc).splitlines()[0]}", body, body_start)
    if not isinstance(data, dict):
        return Frontmatter(None, "frontmatter is not a mapping", body, body_start)
    return Frontmatter(data, None, body, body_start)


def _has_alias(block: str) -> bool:
    """True when the YAML block uses an alias. Hard-won fact (7 December
    2026): YAML loads aliases as shared objects, but each reader that turns
    a value into text copies them out: 555 bytes of nested aliases ("a
    billion laughs") took 10 s and 1 GB in `kb wiki check`, and 2.2 GB in
    the web page. kb's pages need no alias."""
    return "*" in block and any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(block, Loader=_YAML_LOADER))


def comment_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each comment (COMMENT_MARKS), left to right: at each
    place the first mark that opens there and closes later. An opening
    that is never closed is text, as is every later opening of its kind.
    Linear in the length of the text."""
    spans: list[tuple[int, int]] = []
    # The next opening of each kind, found again only when the scan has
    # passed it: a find of each kind after each comment read to the end of
    # the text for a kind that is not there (quadratic).
    openings = {kind: text.find(kind[0]) for kind in COMMENT_MARKS}
    position = 0
    while openings:
        for kind in list(openings):
            if 0 <= openings[kind] < position:
                openings[kind] = text.find(kind[0], position)
            if openings[kind] < 0:
                del openings[kind]  # no opening after here, or no closing after the last
        if not openings:
            break
        (opening, closing), start = min(openings.items(), key=lambda item: item[1])
        end = text.find(closing, start + len(opening))
        if end < 0:
            # No closing after this opening: none after a later one either.
            del openings[(opening, closing)]
            continue
        spans.append((start, end + len(closing)))
        position = end + len(closing)
    return spans


def _replace_comments(text: str, replace) -> str:
    pieces, position = [], 0
    for start, end in comment_spans(text):
        pieces += [text[position:start], replace(text[start:end])]
        position = end
    return "".join(pieces) + text[position:]


def blank_comments(text: str) -> str:
    """The text with each comment (comment_spans) replaced by spaces, line for
    line, so that line numbers stay. A reader does not see a comment, so the
    checks of what a page says do not read it."""
    return _replace_comments(text, lambda comment: re.sub(r"[^\n]", " ", comment))


def without_comments(text: str) -> str:
    """The text without its comments (comment_spans): what a reader of the page
    sees (Obsidian hides them). The web page shows this text; the checks and
    read_page blank the same comments (blank_comments)."""
    return _replace_comments(text, lambda comment: "")


def read_frontmatter(path: Path) -> dict:
    """The frontmatter of a file as a dict: {} when it has none or it is not valid."""
    return split_frontmatter(path.read_text(encoding="utf-8", errors="replace")).data or {}


# --- what a page says ----------------------------------------------------------------

# The date of a page: the first of these frontmatter keys that holds a date.
# The schema's keys first (kb/wiki/schema.py, specification 6.2): entity and
# concept pages `last_updated`, source pages `ingested_at`, syntheses
# `created`. `updated` and `ingested` are the keys of kb's earlier pages
# (`kb wiki migrate` renames them); each comes after the key that replaced it.
DATE_KEYS = ("last_updated", "updated", "ingested_at", "ingested", "created", "date")
# The type of a page with no `type` key (the specification's source page has
# none): the kind of its folder.
FOLDER_TYPES = {"sources": "source", "entities": "entity", "concepts": "concept", "syntheses": "synthesis"}


@dataclass(frozen=True)
class WikiLink:
    """One [[...]] link of a page: `[[wiki/sources/a.md#para3|the book]]`
    has the target `sources/a`, the anchor `para3` and the text `the book`."""

    line: int  # the line number in the file
    inner: str  # the text between the brackets, as written
    target: str  # the page path under wiki/: no `#anchor`, no `|text`, no `.md`, no `wiki/` in front
    anchor: str
    text: str


def parse_link(inner: str, line: int = 0) -> WikiLink:
    """The parts of the text between [[ and ]]: `|` ends the target and the
    anchor (the text after it is what a reader sees), `#` starts the anchor,
    a `.md` at the end of the target is the file's, not the page's name, and
    `wiki/` in front names the pages folder (links name pages from the wiki
    root or from the pages folder)."""
    target_part, _, text = inner.partition("|")
    target, _, anchor = target_part.partition("#")
    return WikiLink(line, inner, page_target(target), anchor.strip(), text.strip())


@dataclass(frozen=True)
class WikiPage:
    """A page as every reader of kb sees it: the web page, the MCP server,
    the search index and the checks."""

    target: str  # how links name it: concepts/vector-search; a file at the top: index
    frontmatter: dict | None  # None when the page has none or it is not valid (frontmatter_error says why)
    frontmatter_error: str | None
    body: list[str]  # the lines after the frontmatter
    body_start: int  # the line number of the first body line
    title: str
    type: str
    date: datetime | None  # in UTC; None when no key of DATE_KEYS holds a date
    sources: list[str] = field(default_factory=list)  # the frontmatter's `sources`, as text
    name: str = ""  # the frontmatter's `name`: the subject's name with its spaces
    aliases: list[str] = field(default_factory=list)  # the frontmatter's `aliases`: other names of the subject
    links: list[WikiLink] = field(default_factory=list)  # outside code blocks and HTML comments

    @property
    def meta(self) -> dict:
        """The frontmatter, {} when there is none."""
        return self.frontmatter or {}


def read_page(text: str, target: str) -> WikiPage:
    """What the page `text` says. `target` is how links name the page
    (concepts/vector-search); it gives the type and the title of a page
    whose frontmatter and body do not.

    Rules, and why:
    - The title is the first `# ` heading of the body: the words that a
      reader sees on top of the page. Then the frontmatter's `title` (the
      source page's), then `name`, then the file name. An entity page of the
      specification has no `title` key.
    - The date: the first key of DATE_KEYS that holds a date. YAML reads
      `2026-11-20` as a date and `"2026-11-20"` as text; both are the same
      day. A time without a zone is UTC.
    - The type: the `type` key, else the kind of the folder, else "page".
    - Links, the title and the sections are read outside code blocks and
      HTML comments: a reader does not see them there."""
    data, error, body, body_start = split_frontmatter(text)
    meta = data or {}
    folder = target.split("/", 1)[0] if "/" in target else ""
    visible = list(body_lines(body, body_start))
    heading = next((line[2:].strip() for _, line in visible if line.startswith("# ")), "")
    title = heading or _text(meta.get("title")) or _text(meta.get("name")) or target.rsplit("/", 1)[-1]
    links = [parse_link(match.group(1), line_no) for line_no, line in visible for match in WIKILINK.finditer(line)]
    return WikiPage(target=target, frontmatter=data, frontmatter_error=error, body=body, body_start=body_start,
                    title=title, type=_text(meta.get("type")) or FOLDER_TYPES.get(folder) or "page",
                    date=page_date(meta), sources=_text_list(meta.get("sources")), name=_text(meta.get("name")),
                    aliases=_text_list(meta.get("aliases")), links=links)


def read_page_file(root: Path, file: Path) -> WikiPage:
    """read_page of a file below the wiki root `root`: the pages under
    wiki/ are named by their path under it, the files at the top (index.md)
    by their name."""
    return read_page(file.read_text(encoding="utf-8", errors="replace"), page_target(file.relative_to(root).as_posix()))


def page_target(relative: str) -> str:
    """How links name the file at `relative` (a path under the wiki root):
    wiki/concepts/x.md -> concepts/x, index.md -> index."""
    return relative.strip().removeprefix(PAGES_FOLDER + "/").removesuffix(WIKI_PAGE_SUFFIX).strip()


def page_date(meta: dict) -> datetime | None:
    """The date of a page's frontmatter (read_page's rule), in UTC."""
    for key in DATE_KEYS:
        value = meta.get(key)
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
        if isinstance(value, date):
            return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
        if isinstance(value, str) and value.strip():
            try:
                parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                continue
            return parsed.astimezone(timezone.utc) if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    return None


def _text(value) -> str:
    return str(value).strip() if value not in (None, "") and not isinstance(value, (dict, list)) else ""


def _text_list(value) -> list[str]:
    return [_text(v) for v in value if _text(v)] if isinstance(value, list) else []


def body_lines(body: list[str], body_start: int = 1, keep_comments: bool = False) -> Iterator[tuple[int, str]]:
    """(line number, text) of the body lines outside code fences. Unless
    keep_comments, each HTML comment is blanked: a reader does not see it,
    so what a page says is never read from it (the marker line is one)."""
    lines = body if keep_comments or not body else blank_comments("\n".join(body)).split("\n")
    in_fence = False
    for offset, line in enumerate(lines):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield body_start + offset, line


class LinkResolver:
    """The one rule from a link to a page, over a set of page targets
    (concepts/x) and of files at the top (index, purpose). A link names a
    page by its path under wiki/ (`wiki/` in front and `.md` at the end are
    allowed), a file at the top by its name, or a page by its bare name
    when exactly one page has it (Obsidian resolves it so)."""

    def __init__(self, targets: Iterable[str], top: Iterable[str] = ()):
        self.targets = set(targets)
        self.top = set(top)
        self._stems: dict[str, list[str]] = {}
        for target in sorted(self.targets):
            if "/" in target:
                self._stems.setdefault(target.rsplit("/", 1)[1], []).append(target)

    def __call__(self, link: str | WikiLink) -> str | None:
        """The target or top file name that a link (the text between the
        brackets, or a parsed link) names, or None."""
        target = (link if isinstance(link, WikiLink) else parse_link(link)).target
        if not target:
            return None
        if target in self.targets or target in self.top:
            return target
        if "/" not in target and len(self._stems.get(target, [])) == 1:
            return self._stems[target][0]
        return None
