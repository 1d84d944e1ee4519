"""`kb import` and the demo: saved X answers into a batch, byte for byte,
with no browser. Bookmarks pages, folder lists, folder pages and TweetDetail
answers come in any order; each is sorted by its shape and gets the file
name of its kind (kb/x/raw_store.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kb.x.capture import CaptureProgress
from kb.x.folder_list import parse_folder_list
from kb.x.graphql import (FOLDER_LIST, FOLDER_TIMELINE, TWEET_DETAIL, PageShapeError, answer_kind, load_page,
                          summarize_page)
from kb.x.raw_store import FOLDER_PAGE_FILE, THREAD_FILE, RawStore
from kb.x.thread_rows import focal_post_id


# An X answer is some MB: the largest of the real captures (a list
# timeline) has 3.7 MB. The files are read whole, so a larger file (a
# disk image given by mistake, or an archive that a stranger made) is
# refused before anything is read.
MAX_IMPORT_FILE_BYTES = 64 * 1024 * 1024


class ImportInputError(ValueError):
    """A file to import is not there, or too large. Nothing was imported."""


def import_files(raw_store: RawStore, batch: str, files: list[str], log) -> CaptureProgress:
    """Copy saved answers into the batch, byte for byte, in any order: each
    gets the file name of its kind (kb/x/raw_store.py). A file that does not
    parse is kept too, and named with the reason."""
    paths = [Path(f).expanduser() for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ImportInputError(f"Cannot import: no such file: {', '.join(missing)}. Nothing was imported.")
    large = [f"{p} ({p.stat().st_size:,} bytes)" for p in paths if p.stat().st_size > MAX_IMPORT_FILE_BYTES]
    if large:
        raise ImportInputError(f"Cannot import: larger than the {MAX_IMPORT_FILE_BYTES:,} bytes of an X answer: "
                               f"{', '.join(large)}. Nothing was imported.")
    progress = CaptureProgress()
    counts: Counter = Counter()
    for source in paths:
        body = source.read_bytes()
        try:
            payload = load_page(body, name=str(source))
        except PageShapeError:
            payload = None
        kind = answer_kind(payload)
        if kind == FOLDER_LIST:
            _import_folder_list(raw_store, batch, source, body, payload, counts, progress)
        elif kind in (FOLDER_TIMELINE, TWEET_DETAIL):
            _import_named_answer(raw_store, batch, source, body, payload, kind, counts, progress)
        else:
            counts["page"] += 1
            target = raw_store.write_page(batch, counts["page"], body)
            progress.pages.append(target.name)
            try:
                progress.add_tweets(summarize_page(load_page(body, name=str(source)), name=str(source)).tweets)
            except PageShapeError as exc:
                progress.bad_pages.append(str(exc))
                log.warning(f"Kept {target.name} as it came, but it is not a Bookmarks page: {exc}")
    # The owner gave these folders' pages: they say what each folder holds now.
    progress.folders_done = sorted(set(progress.folders_done))
    progress.complete = True
    progress.stop_reason = f"imported {len(paths)} files"
    return progress


def _import_folder_list(raw_store, batch, source, body, payload, counts, progress) -> None:
    counts["folders"] += 1
    target = raw_store.write_answer(batch, f"folders-{counts['folders']:04d}.json", body)
    try:
        folders, _problems = parse_folder_list(payload, name=str(source))
    except PageShapeError as exc:
        progress.bad_pages.append(f"{exc} (kept as {target.name})")
        return
    progress.folders += [folder["folder_id"] for folder in folders if folder["folder_id"] not in progress.folders]


def _import_named_answer(raw_store, batch, source, body, payload, kind, counts, progress) -> None:
    """A folder page or a TweetDetail answer. Neither names its folder or
    post inside; the capture's file name does (folder-<id>-0001.json,
    thread-<id>.json). A TweetDetail answer of another name is about its focal post."""
    if kind == FOLDER_TIMELINE:
        found = FOLDER_PAGE_FILE.match(source.name)
        key = found["id"] if found else None
        why = ("a BookmarkFolderTimeline answer does not name its folder: give the file the name that the "
               "capture gives it, folder-<folder id>-0001.json")
    else:
        found = THREAD_FILE.match(source.name)
        key = found["id"] if found else focal_post_id(payload, name=str(source))
        why = "a TweetDetail answer with no post in it"
    if key is None:
        counts["unsorted"] += 1
        target = raw_store.write_answer(batch, f"unsorted-{counts['unsorted']:04d}.json", body)
        progress.bad_pages.append(f"{source}: {why} (kept as {target.name})")
        return
    counts[(kind, key)] += 1
    if kind == FOLDER_TIMELINE:
        raw_store.write_answer(batch, f"folder-{key}-{counts[(kind, key)]:04d}.json", body)
        progress.folders_done.append(key)
    else:
        n = counts[(kind, key)]
        raw_store.write_answer(batch, f"thread-{key}.json" if n == 1 else f"thread-{key}-{n}.json", body)
        progress.threads.append(key)
