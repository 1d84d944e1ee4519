"""Wiki files: which files are pages, and a page's frontmatter.

One copy of each rule. The wiki index, the checks, the MCP server, the web
page and the wiki stage all list and read pages here. Two listings once
drifted apart, and one of them let a symbolic link to .git/config into the
search index.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import NamedTuple

import yaml

PAGES_FOLDER = "wiki"  # the pages live in <wiki root>/wiki/
WIKI_PAGE_SUFFIX = ".md"
# How wiki pages appear in the search index: source kind, id prefix, author.
WIKI_SOURCE = "wiki"
WIKI_ID_PREFIX = "wiki:"
WIKI_AUTHOR = "wiki"


def _hidden_or_not_a_page(relative: PurePath) -> bool:
    return relative.suffix != WIKI_PAGE_SUFFIX or any(part.startswith(".") for part in relative.parts)


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
    for the checks and for the readers."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return Frontmatter(None, "no frontmatter", lines, 1)
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            body = lines[end + 1:]
            try:
                data = yaml.safe_load("\n".join(lines[1:end])) or {}
            except yaml.YAMLError as exc:
                return Frontmatter(None, f"frontmatter is not valid YAML: {str(exc).splitlines()[0]}", body, end + 2)
            if not isinstance(data, dict):
                return Frontmatter(None, "frontmatter is not a mapping", body, end + 2)
            return Frontmatter(data, None, body, end + 2)
    return Frontmatter(None, "frontmatter has no closing ---", lines, 1)


def read_frontmatter(path: Path) -> dict:
    """The frontmatter of a file as a dict: {} when it has none or it is not valid."""
    return split_frontmatter(path.read_text(encoding="utf-8", errors="replace")).data or {}
