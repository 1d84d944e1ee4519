"""The parsed files of the Telegram inflow, in the wiki's raw/ folder:
parse an inbox item, write its file, and move the file after the gate.

An accepted source's file is at raw/parsed/<type>/<slug>.md; a rejected or
duplicate source's file is in raw/rejected/. The wiki ingest reads it from
there and commits it: the wiki's citations point to its paragraphs.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from kb.settings import Settings
from kb.telegram.inbox import Inbox, InboxError, InboxItem
from kb.telegram.source_parsers import (
    ParsedSource,
    PermanentParseError,
    decode_text,
    parse_markdown,
    parse_pdf,
    parse_text,
    parse_voice,
    parse_web,
    parse_youtube,
    read_file,
    render_markdown,
    render_with_browser,
    split_frontmatter,
)
from kb.wiki.repo import Wiki
from kb.wiki.schema import ID_PREFIX_CHARS, NAME_MAX_CHARS, parsed_body, parsed_frontmatter, source_slug
from kb.wiki_files import inside_wiki, make_wiki_folder, read_frontmatter, write_wiki_file
from kb.x.browser import Browser

PARSED_DIR = Path("raw/parsed")
REJECTED_DIR = Path("raw/rejected")


def parse_item(item: InboxItem, inbox: Inbox, settings: Settings, browser: Browser | None) -> ParsedSource:
    """The parser for the item's type. Raises PermanentParseError or TransientParseError."""
    try:
        attachment = inbox.attachment_path(item)
    except InboxError as exc:
        raise PermanentParseError(str(exc)) from None  # a file outside the item's folder is never read
    if item.type in ("pdf", "md", "voice") and attachment is None:
        raise PermanentParseError(f"inbox item {item.id}: the {item.type} item has no attachment")
    if item.type in ("web", "youtube") and not item.url:
        raise PermanentParseError(f"inbox item {item.id}: the {item.type} item has no URL")
    timeout = settings.kb_browser_timeout_s
    if item.type == "web":
        render = (lambda url: render_with_browser(browser, url, timeout)) if browser is not None else None
        return parse_web(item.url, timeout_s=timeout, render=render)
    if item.type == "youtube":
        return parse_youtube(item.url, proxy=settings.kb_youtube_proxy,
                             insecure=settings.kb_youtube_insecure, timeout_s=timeout)
    if item.type == "pdf":
        return parse_pdf(attachment)
    if item.type == "md":
        return parse_markdown(attachment)
    if item.type == "text":
        text = item.text if item.text is not None else decode_text(read_file(attachment), str(attachment))
        return parse_text(text)
    if item.type == "voice":
        return parse_voice(attachment, settings.kb_whisper_model)
    raise PermanentParseError(f"inbox item {item.id}: unknown type {item.type!r}")


def write_parsed_file(wiki_dir: Path, item: InboxItem, parsed: ParsedSource, fetched_at: datetime) -> Path:
    """Write raw/parsed/<type>/<slug>.md in the format of kb.wiki.schema
    (the specification's frontmatter, then `# Title`). Returns the path
    relative to the wiki folder.

    A parsed file that an ingest committed never changes: the citations of
    the wiki point to its paragraphs. A new parse of the same text keeps
    that file; a new parse with another text is a new file that names the
    earlier one (`supersedes`), and the ingest of it marks the earlier one
    superseded. Copies that no ingest took yet are replaced."""
    wiki = Wiki(path=str(wiki_dir))
    slug = source_slug(item.id, parsed.title or item.type)
    frontmatter = parsed_frontmatter(
        resource_id=item.id, resource_type=item.type, source_url=parsed.url or item.url, title=parsed.title,
        fetched_at=fetched_at.isoformat(timespec="seconds"), char_count=parsed.char_count, parser=parsed.parser,
        extra=parsed.extra,
    )
    body = parsed_body(parsed.title, parsed.body)
    # The name holds only 8 characters of the id, so the frontmatter decides
    # which files are this item's.
    prefix = slug[:ID_PREFIX_CHARS]
    mine = sorted(old for old in [*wiki_dir.glob(f"{PARSED_DIR}/*/{prefix}*.md"), *wiki_dir.glob(f"{REJECTED_DIR}/{prefix}*.md")]
                  if str(read_frontmatter(old).get("resource_id")) == item.id)
    ingested = [old for old in mine if (wiki_dir / ".git").exists() and wiki.tracked(str(old.relative_to(wiki_dir)))]
    latest = max(ingested, key=lambda f: f.stat().st_mtime_ns, default=None)
    if latest is not None and split_frontmatter(latest.read_text(encoding="utf-8"))[1].strip() == body.strip():
        return latest.relative_to(wiki_dir)  # the same text: the ingested file stays the source
    relative = PARSED_DIR / item.type / f"{slug}.md"
    number = 2
    while relative in {f.relative_to(wiki_dir) for f in ingested}:
        relative = PARSED_DIR / item.type / f"{slug[:NAME_MAX_CHARS - 3].rstrip('-')}-{number}.md"
        number += 1
    if latest is not None:
        frontmatter["supersedes"] = str(latest.relative_to(wiki_dir))
    # inside_wiki: a link in the wiki (raw -> a folder outside) must not
    # take the file, or a removal, out of the wiki.
    write_wiki_file(wiki_dir, wiki_dir / relative, render_markdown(frontmatter, body).encode())
    for old in mine:
        if old not in ingested and old != wiki_dir / relative:
            inside_wiki(wiki_dir, old).unlink(missing_ok=True)
    return relative


def locate_parsed_file(wiki_dir: Path, parsed_path: str) -> Path:
    """The parsed file, in raw/parsed or (after an earlier rejection) raw/rejected."""
    path = wiki_dir / parsed_path
    if path.exists():
        return path
    moved = wiki_dir / REJECTED_DIR / Path(parsed_path).name
    if moved.exists():
        return moved
    raise FileNotFoundError(f"the parsed file {path} is missing; materialize parsed_sources for this partition again")


def move_parsed_file(wiki_dir: Path, current: Path, rejected: bool, item_type: str) -> Path:
    """Rejected and duplicate sources live in raw/rejected/, accepted ones in
    raw/parsed/<type>/. Returns the new path relative to the wiki folder."""
    target_dir = wiki_dir / (REJECTED_DIR if rejected else PARSED_DIR / item_type)
    target = target_dir / current.name
    if current != target:
        make_wiki_folder(wiki_dir, target_dir)
        os.replace(inside_wiki(wiki_dir, current), inside_wiki(wiki_dir, target))
    return target.relative_to(wiki_dir)
