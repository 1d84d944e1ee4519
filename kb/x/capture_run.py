"""Stage 1, X: capture the owner's bookmarks as raw GraphQL pages, one sync
batch at a time. capture_batch() is the one entry; the asset x_raw_pages
(kb_assets/x/raw_pages.py) calls it.

A capture opens the X bookmarks page with the saved login, scrolls, and
keeps every GraphQL response of the `Bookmarks` operation as it came, one
file per page, under the sync batch. There is no X API here: the
X web client asks for the pages, and we keep what X answers.

When to stop:
- one page after the page that holds the watermark (the newest bookmark of
  the last complete capture). The extra page overlaps the last capture, so
  a page boundary that moved between two captures (a bookmark removed, or
  added again) hides no bookmark;
- at the end of the bookmarks: a page with no tweets, as X ends a timeline;
- when X asks for no more pages and the last page had no bottom cursor;
- with `full`, the watermark does not count: the capture goes to the end.

Under a rate limit (HTTP 429) the capture waits as X says (retry-after or
x-rate-limit-reset, else a growing back-off), then opens the page again and
goes on from the last kept page: it rewrites the X client's first Bookmarks
request to carry that page's bottom cursor. When the waits would pass
KB_CAPTURE_MAX_WAIT_S, the capture is cut off, and its manifest keeps the
cursor: the next sync goes on from there (RawStore.resume_point) and counts
the chain as one capture. Only a chain that reached the end or the watermark
is complete and moves the watermark, to the newest bookmark of its first
batch. Hard-won fact: a first capture of thousands of bookmarks meets 429,
and when each sync started at the top again, it never completed.

A capture that is cut off (an error, a timeout, a stall) keeps its pages,
writes a manifest with complete=False, and fails. A capture stopped by
`max_pages` is not complete either, but it succeeds. Neither moves the
watermark, so the next sync goes back over the same ground, and normalize
must not mark bookmarks removed after an incomplete `full` capture.

After a capture that met the watermark or the end, two more reads follow in
the same browser (kb/x/raw_store.py names their files):
- Folders (KB_CAPTURE_FOLDERS). The bookmarks page asks for the folder list
  (BookmarkFoldersSlice); the capture keeps it, then opens each folder
  (/i/bookmarks/<id>) and scrolls it to its end, as it scrolls the bookmarks,
  and keeps its BookmarkFolderTimeline pages. Every folder is read to its end
  at each sync: only a whole folder shows which posts left it. The 429 rules
  and the cursor resume above apply, with one wait budget for the whole
  capture. A folder that a limit or an error cut off is named in the
  metadata; its earlier bookmarks stay, and the next sync reads it first.
- Threads (KB_CAPTURE_THREADS). For the newest bookmarked posts with replies
  whose thread no batch holds yet, the capture opens the post and keeps its
  TweetDetail answer once. Normalize takes the author's own chain from it.
Neither read makes the bookmarks capture fail: the batch stays complete.

With `files`, the capture imports saved answers byte for byte, with no browser
(the demo and `kb import`): Bookmarks pages, folder lists, folder pages and
TweetDetail answers, in any order; it sorts them by their shape. An import
does not move the watermark: we cannot know that the files reach down to
the last capture, and a watermark above a gap would hide that gap from every
later sync.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kb.x.browser import Browser
from kb.x.capture import BookmarksCapture, CaptureProgress, CaptureRules
from kb.x.capture_extras import ExtraReads
from kb.x.capture_import import ImportInputError, import_files
from kb.x.raw_store import CaptureManifest, RawStore


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class CaptureOutcome:
    """What one capture of a batch did. `error` is the cause of a cut-off:
    the pages and the manifest are kept, and the watermark did not move."""

    batch: str
    mode: str  # browser or files
    progress: CaptureProgress
    manifest: CaptureManifest
    error: Exception | None = None

    def cut_off_message(self) -> str:
        return (f"The capture of batch {self.batch} was cut off after {len(self.progress.pages)} pages: "
                f"{self.manifest.error} The pages are kept; the watermark did not move.")


def capture_batch(browser: Browser, raw_store: RawStore, batch: str, *, full: bool = False,
                  files: list[str] | None = None, max_pages: int = 0, log: logging.Logger,
                  rules: CaptureRules | None = None) -> CaptureOutcome:
    """Capture one sync batch: from the browser, or from `files` (an import).
    The manifest is written first (a killed capture is seen as cut off) and
    last. A cut-off comes back in CaptureOutcome.error; ImportInputError (a
    file to import is not there) and KeyboardInterrupt/SystemExit are raised."""
    rules = rules or CaptureRules.from_settings(timeout_s=browser.timeout_s)
    mode = "files" if files else "browser"
    moved = set_aside_earlier_attempt(raw_store, batch)
    if moved:
        log.warning(f"Batch {batch} held pages of an earlier attempt; they are kept in {moved}.")
    # Before this batch's first manifest: the last capture before this one.
    resume = None if files else raw_store.resume_point(full=full)
    previous = None if files else raw_store.last_browser_capture()
    if resume is not None:
        log.info(f"Batch {resume.batch} did not complete: this capture goes on from its last kept page.")
    manifest = CaptureManifest(batch=batch, mode=mode, full=full, complete=False, started_at=now_iso(),
                               error="the capture started and did not finish",
                               resumed_from=resume.batch if resume else None)
    # A manifest first, so that a capture that is killed is seen as cut off.
    raw_store.write_manifest(manifest)

    watermark = None if (full or files) else raw_store.watermark()
    outcome = CaptureOutcome(batch=batch, mode=mode, progress=CaptureProgress(), manifest=manifest)
    try:
        if files:
            outcome.progress = import_files(raw_store, batch, files, log)
        else:
            capture = BookmarksCapture(raw_store=raw_store, batch=batch,
                                       watermark_id=watermark["tweet_id"] if watermark else None,
                                       max_pages=max_pages, log=log, resume=resume, rules=rules)
            outcome.progress = capture.progress
            extras = ExtraReads(raw_store=raw_store, batch=batch, progress=capture.progress, log=log,
                                previous=previous, rules=rules)
            with browser.x_context() as x:
                extras.folder_list.attach(x)  # the bookmarks page asks for the folder list at load
                capture.run(x)
                extras.run(x)
        manifest.error = None
    except BaseException as exc:
        manifest.error = str(exc) or type(exc).__name__
        if isinstance(exc, ImportInputError) or not isinstance(exc, Exception):
            raise  # already clear (bad import input), or KeyboardInterrupt/SystemExit
        outcome.error = exc
    finally:
        _finish_manifest(manifest, outcome.progress)
        raw_store.write_manifest(manifest)  # the manifest comes last

    progress = outcome.progress
    if outcome.error is None:
        if mode == "browser" and manifest.complete and progress.newest:
            raw_store.move_watermark(progress.newest[0], progress.newest[1], batch)
        elif not manifest.complete:
            log.warning(f"Batch {batch} is not complete ({progress.stop_reason}); the watermark did not move.")
    return outcome


def _finish_manifest(manifest: CaptureManifest, progress: CaptureProgress) -> None:
    manifest.pages = list(progress.pages)
    manifest.complete = progress.complete and manifest.error is None
    manifest.met_watermark = progress.met_watermark
    manifest.folders, manifest.folders_done = list(progress.folders), list(progress.folders_done)
    manifest.threads = list(progress.threads)
    manifest.resume_cursor = None if manifest.complete else progress.resume_cursor
    if progress.newest:
        manifest.newest_tweet_id, manifest.newest_sort_index = progress.newest
    manifest.finished_at = now_iso()


def set_aside_earlier_attempt(raw_store: RawStore, batch: str) -> Path | None:
    """Move the pages of an earlier attempt at this batch (a retry, a
    re-materialization) out of the way, so that pages of two attempts never
    mix. Raw files are never deleted: they go to .superseded/."""
    folder = raw_store.batch_dir(batch)
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = raw_store.x_dir() / ".superseded" / f"{batch}-{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(folder, target)
    return target
