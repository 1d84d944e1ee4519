"""Reading one sync batch for normalize: every raw page and answer of the
batch, parsed and merged into the rows that the batch gives (BatchRows).
No DuckDB here: parsing can take seconds, and the DuckDB file allows one
writer, so the batch is read before a connection opens
(kb/x/bookmark_tables.py writes it). `kb inspect` reads batches with the
same code, so it shows what normalize would store.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kb.settings import get_settings
from kb.x.folder_list import parse_folder_list
from kb.x.graphql import FOLDER_TIMELINE, PageShapeError, load_page
from kb.x.post_rows import ParsedPage, parse_page
from kb.x.raw_store import CaptureManifest, RawAnswer, RawStore
from kb.x.thread_rows import ParsedThread, parse_thread


class EmptyBatchError(ValueError):
    """A batch with no raw page, no answer and no manifest: nothing to normalize."""


@dataclass
class BatchRows:
    """Every row of one batch, merged over its pages."""

    batch: str
    manifest: CaptureManifest | None
    pages: int = 0
    bookmarks: dict[str, dict] = field(default_factory=dict)
    authors: dict[str, dict] = field(default_factory=dict)
    media: dict[tuple[str, str], dict] = field(default_factory=dict)
    links: dict[tuple[str, str], dict] = field(default_factory=dict)
    seen_tweet_ids: set[str] = field(default_factory=set)
    unavailable_tweet_ids: set[str] = field(default_factory=set)
    unknown_entries: Counter = field(default_factory=Counter)
    unresolved_cards: list[str] = field(default_factory=list)
    bad_pages: dict[str, str] = field(default_factory=dict)       # raw_file -> reason
    entry_problems: dict[str, list[str]] = field(default_factory=dict)  # raw_file -> reasons
    folder_list: dict[str, dict] | None = None  # folder id -> folders row; None: no list in the batch
    folder_members: dict[str, set[str]] = field(default_factory=dict)  # folder id -> tweet ids
    folder_only: set[str] = field(default_factory=set)  # rows that only a folder page gave
    threads: dict[str, ParsedThread] = field(default_factory=dict)  # bookmark id -> its thread

    def add(self, page: ParsedPage, *, folder_id: str | None = None) -> None:
        # X can repeat a post on the next page of one capture; its first row
        # stays, with the media and links of that same page. Folder pages
        # come after the Bookmarks pages: a Bookmarks page's row wins.
        if folder_id is not None:
            self.folder_members.setdefault(folder_id, set()).update(page.seen_tweet_ids)
            self.folder_only.update(row["tweet_id"] for row in page.bookmarks if row["tweet_id"] not in self.bookmarks)
        for row in page.bookmarks:
            self.bookmarks.setdefault(row["tweet_id"], row)
        kept = set(self.bookmarks)
        for row in page.media:
            if row["tweet_id"] in kept and self.bookmarks[row["tweet_id"]]["raw_file"] == page.raw_file:
                self.media.setdefault((row["tweet_id"], row["media_key"]), row)
        for row in page.links:
            if row["tweet_id"] in kept and self.bookmarks[row["tweet_id"]]["raw_file"] == page.raw_file:
                self.links.setdefault((row["tweet_id"], row["url_norm"]), row)
        for row in page.authors:
            self.authors[row["author_id"]] = row
        self.seen_tweet_ids.update(page.seen_tweet_ids)
        self.unavailable_tweet_ids.update(page.unavailable_tweet_ids)
        self.unknown_entries.update(page.unknown_entries)
        self.unresolved_cards.extend(page.unresolved_cards)
        if page.problems:
            self.entry_problems[page.raw_file] = list(page.problems)

    def problem_rows(self) -> list[dict]:
        rows = [{"batch": self.batch, "raw_file": f, "reason": r} for f, r in self.bad_pages.items()]
        for raw_file, reasons in self.entry_problems.items():
            rows.extend({"batch": self.batch, "raw_file": raw_file, "reason": r} for r in dict.fromkeys(reasons))
        return rows


def raw_file_name(batch: str, path: Path) -> str:
    """How rows name their raw page: relative to the X raw folder, so the
    name stays right when KB_HOME moves."""
    return f"{batch}/{path.name}"


def capture_time(manifest: CaptureManifest | None, path: Path) -> datetime:
    """When the page was captured: the manifest's start, else the file time
    (raw files are never edited, so their time is the capture time)."""
    if manifest and manifest.started_at:
        try:
            moment = datetime.fromisoformat(manifest.started_at)
            return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    return datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)


def read_page_file(path: Path, *, batch: str, manifest: CaptureManifest | None) -> ParsedPage:
    """Parse one raw page file; PageShapeError names the file and the reason."""
    name = raw_file_name(batch, path)
    payload = load_page(path.read_bytes(), name=name)
    return parse_page(payload, raw_file=name, batch=batch, captured_at=capture_time(manifest, path))


def read_batch(raw_store: RawStore, batch: str, log: logging.Logger | None = None,
               max_posts: int | None = None) -> BatchRows:
    """Every row of one batch. `max_posts` caps each author's thread
    (KB_THREAD_MAX_POSTS when None)."""
    manifest = raw_store.manifest(batch)
    paths = raw_store.pages(batch)
    answers = raw_store.answers(batch)
    if not paths and not answers and manifest is None:
        raise EmptyBatchError(
            f"Batch {batch} has no raw pages and no capture.json in {raw_store.batch_dir(batch)}. "
            "Materialize x_raw_pages for this batch first.")
    rows = BatchRows(batch=batch, manifest=manifest, pages=len(paths) + len(answers))
    for path in paths:
        _read_into(rows, path, log, lambda: rows.add(read_page_file(path, batch=batch, manifest=manifest)))
    if max_posts is None:
        max_posts = get_settings().kb_thread_max_posts
    for answer in answers:  # after the Bookmarks pages: their rows win
        _read_into(rows, answer.path, log, lambda: _add_answer(rows, answer, max_posts))
    return rows


def _read_into(rows: BatchRows, path: Path, log, read) -> None:
    """Run `read`; a file that it cannot read is named with the reason, and kept."""
    try:
        read()
    except PageShapeError as exc:
        name = raw_file_name(rows.batch, path)
        rows.bad_pages[name] = str(exc).removeprefix(f"{name}: ")
        if log:
            log.warning(f"Raw page kept but not normalized: {exc}")


def _add_answer(rows: BatchRows, answer: RawAnswer, max_posts: int) -> None:
    """One folder list, folder page or thread answer of the batch."""
    name = raw_file_name(rows.batch, answer.path)
    if answer.kind == "unsorted":
        raise PageShapeError(f"{name}: an imported answer that names no folder or post; kept as it came")
    payload = load_page(answer.path.read_bytes(), name=name)
    captured_at = capture_time(rows.manifest, answer.path)
    if answer.kind == "folders":
        folders, problems = parse_folder_list(payload, name=name)
        listed = rows.folder_list if rows.folder_list is not None else {}
        for folder in folders:
            listed[folder["folder_id"]] = {**folder, "batch": rows.batch, "raw_file": name}
        rows.folder_list = listed
        if problems:
            rows.entry_problems.setdefault(name, []).extend(problems)
    elif answer.kind == "folder":
        rows.add(parse_page(payload, raw_file=name, batch=rows.batch, captured_at=captured_at,
                            operation=FOLDER_TIMELINE), folder_id=answer.key)
    else:
        thread = parse_thread(payload, tweet_id=answer.key, raw_file=name, batch=rows.batch,
                              captured_at=captured_at, max_posts=max_posts)
        rows.threads[answer.key] = thread  # a later answer of the same post wins
        if thread.problems:
            rows.entry_problems.setdefault(name, []).extend(thread.problems)


def folders_read_whole(rows: BatchRows) -> set[str]:
    """The folders whose pages in this batch reach the folder's end. An
    import is what the owner gave: whole."""
    manifest = rows.manifest
    if manifest is None or manifest.mode == "files":
        return set(rows.folder_members)
    return set(manifest.folders_done) & set(rows.folder_members)


def removal_sweep_allowed(rows: BatchRows) -> tuple[bool, str]:
    """Only a capture that saw the whole bookmark list can say what is gone."""
    m = rows.manifest
    if m is None or not m.full:
        return False, "not run: the capture was not --full"
    if not m.complete:
        return False, "not run: the --full capture did not reach the end"
    if m.resumed_from:
        # This batch holds only the tail of the list; the rest is in earlier batches.
        return False, f"not run: the --full capture went on from batch {m.resumed_from}; run `kb sync --full` again"
    if rows.bad_pages:
        # The bookmarks on an unreadable page are unknown; they must not be marked removed.
        return False, f"not run: {len(rows.bad_pages)} raw page(s) could not be read"
    if not rows.seen_tweet_ids:
        # A full list with no bookmark at all is much more likely a broken
        # capture (for example, a logged-out page) than a true empty list.
        return False, "not run: the --full capture saw no bookmark at all"
    return True, "run"
