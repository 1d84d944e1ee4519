"""Raw files: captured pages exactly as they came. Never edited.

Layout under KB_HOME/raw/x:
    <batch>/page-0001.json ...        one file per GraphQL Bookmarks response
    <batch>/folders-0001.json         a BookmarkFoldersSlice answer (the folder list)
    <batch>/folder-<id>-0001.json ... the BookmarkFolderTimeline pages of folder <id>
    <batch>/thread-<id>.json          the TweetDetail answer of bookmark <id>
    <batch>/capture.json              the capture's manifest (written last)
    watermark.json                    newest bookmark of the last complete capture

A folder timeline answer does not name its folder, and a TweetDetail answer
does not say which post was asked for: the file name keeps both. So the
names are the one rule that the capture, `kb import` and normalize share.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kb.store.atomic_files import write_atomic

from pydantic import BaseModel

from kb.settings import Settings, get_settings


@dataclass
class CaptureManifest:
    batch: str
    mode: str  # browser or files
    full: bool
    complete: bool
    pages: list[str] = field(default_factory=list)
    newest_tweet_id: str | None = None
    newest_sort_index: str | None = None
    met_watermark: bool = False
    error: str | None = None
    started_at: str = ""
    finished_at: str = ""
    # A capture that did not complete: the bottom cursor of its last kept
    # page. The next browser capture starts there, not at the top.
    resume_cursor: str | None = None
    # A capture that started at an earlier batch's resume_cursor: that batch.
    # Then newest_* is the newest bookmark of the first batch of the chain:
    # the chain as a whole reaches from it down to the end or the watermark.
    resumed_from: str | None = None
    # Folders that the folder list named, and those whose timeline this batch
    # holds to its end: only these replace the folder's bookmarks.
    folders: list[str] = field(default_factory=list)
    folders_done: list[str] = field(default_factory=list)
    # Bookmarks whose TweetDetail answer this batch holds.
    threads: list[str] = field(default_factory=list)


# The answers of a batch, by file name (see the module text).
BOOKMARKS_PAGE = re.compile(r"^page-\d{4,}\.json$")
FOLDER_LIST_FILE = re.compile(r"^folders-\d{4,}\.json$")
FOLDER_PAGE_FILE = re.compile(r"^folder-(?P<id>[A-Za-z0-9]{1,64})-\d{4,}\.json$")
THREAD_FILE = re.compile(r"^thread-(?P<id>[A-Za-z0-9]{1,64})(?:-\d+)?\.json$")
# An imported answer that names no folder or post: kept, and named as unreadable.
UNSORTED_FILE = re.compile(r"^unsorted-\d{4,}\.json$")


@dataclass(frozen=True)
class RawAnswer:
    """One raw answer of a batch that is not a Bookmarks page."""

    kind: str  # folders, folder, thread, unsorted
    path: Path
    key: str | None = None  # the folder id (folder) or the bookmark id (thread)


def answer_of(path: Path) -> RawAnswer | None:
    """What a raw file holds, by its name; None for a Bookmarks page or another file."""
    if FOLDER_LIST_FILE.match(path.name):
        return RawAnswer("folders", path)
    if UNSORTED_FILE.match(path.name):
        return RawAnswer("unsorted", path)
    for kind, pattern in (("folder", FOLDER_PAGE_FILE), ("thread", THREAD_FILE)):
        found = pattern.match(path.name)
        if found:
            return RawAnswer(kind, path, found["id"])
    return None


class RawStore(BaseModel):
    """The folder of raw captured pages."""

    root: str

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> RawStore:
        settings = settings or get_settings()
        return cls(**{"root": str(settings.x_raw_dir), **overrides})

    def x_dir(self) -> Path:
        return Path(self.root)

    def batch_dir(self, batch: str) -> Path:
        if not batch or "/" in batch or batch.startswith("."):
            raise ValueError(f"batch name {batch!r} is not a safe folder name")
        return self.x_dir() / batch

    def page_path(self, batch: str, number: int) -> Path:
        return self.batch_dir(batch) / f"page-{number:04d}.json"

    def write_page(self, batch: str, number: int, body: bytes) -> Path:
        path = self.page_path(batch, number)
        write_atomic(path, body)
        return path

    def pages(self, batch: str) -> list[Path]:
        folder = self.batch_dir(batch)
        return sorted(folder.glob("page-*.json")) if folder.is_dir() else []

    def write_answer(self, batch: str, name: str, body: bytes) -> Path:
        """Keep one more answer (folders-, folder-<id>-, thread-<id>, unsorted-) as it came."""
        # Allowlist: one of the names above, and nothing but a file name (no folder part).
        if Path(name).name != name or BOOKMARKS_PAGE.match(name) or answer_of(Path(name)) is None:
            raise ValueError(f"{name!r} is not a name of a folder list, folder page or thread answer")
        path = self.batch_dir(batch) / name
        write_atomic(path, body)
        return path

    def answers(self, batch: str) -> list[RawAnswer]:
        """The folder lists, folder pages and thread answers of a batch, in
        file name order."""
        folder = self.batch_dir(batch)
        found = [answer_of(path) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
        return [answer for answer in found if answer is not None]

    def threads_read(self) -> set[str]:
        """The bookmarks whose TweetDetail answer some batch keeps: the
        capture reads each thread once."""
        read: set[str] = set()
        for batch in self.batches():
            read.update(a.key for a in self.answers(batch) if a.kind == "thread" and a.key)
        return read

    def batches(self) -> list[str]:
        root = self.x_dir()
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def write_manifest(self, manifest: CaptureManifest) -> None:
        path = self.batch_dir(manifest.batch) / "capture.json"
        write_atomic(path, json.dumps(asdict(manifest), indent=2).encode())

    def last_browser_capture(self) -> CaptureManifest | None:
        """The manifest of the last browser capture, or None."""
        captures = []
        for batch in self.batches():
            try:
                manifest = self.manifest(batch)
            except (ValueError, TypeError):
                continue
            if manifest is not None and manifest.mode == "browser":
                captures.append(manifest)
        return max(captures, key=lambda m: (m.started_at, m.batch)) if captures else None

    def resume_point(self, *, full: bool) -> CaptureManifest | None:
        """The manifest of the last browser capture when it did not complete
        and left a cursor to go on from (with the same `full`), else None.
        Hard-won fact: a first capture of thousands of bookmarks meets HTTP
        429; when each sync starts at the top again, it never completes."""
        last = self.last_browser_capture()
        if last is None or last.complete or not last.resume_cursor or last.full != full:
            return None
        return last

    def manifest(self, batch: str) -> CaptureManifest | None:
        path = self.batch_dir(batch) / "capture.json"
        if not path.exists():
            return None
        return CaptureManifest(**json.loads(path.read_text()))

    def watermark(self) -> dict | None:
        """{"tweet_id", "sort_index", "batch"} of the newest bookmark that a
        complete capture stored, or None before the first one."""
        path = self.x_dir() / "watermark.json"
        return json.loads(path.read_text()) if path.exists() else None

    def move_watermark(self, tweet_id: str, sort_index: str, batch: str) -> None:
        payload = {"tweet_id": tweet_id, "sort_index": sort_index, "batch": batch}
        write_atomic(self.x_dir() / "watermark.json", json.dumps(payload).encode())

    def capture_counts(self) -> dict:
        """What the captures on disk hold, for `kb status` and the web page's
        status panel (one count for both). Never raises on a bad manifest:
        it names the batch in `error`."""
        batches = self.batches()
        manifests = []
        for batch in batches:
            try:
                manifest = self.manifest(batch)
            except (ValueError, TypeError) as exc:
                return {"batches": len(batches), "error": f"capture manifest of batch {batch} is not readable: {exc}"}
            if manifest:
                manifests.append(manifest)
        complete = [m for m in manifests if m.complete]
        last = max(complete, key=lambda m: m.finished_at, default=None)
        return {
            "batches": len(batches),
            "pages": sum(len(self.pages(b)) for b in batches),
            "incomplete_batches": len(manifests) - len(complete),
            "last_capture": last.finished_at if last else None,
            "last_batch": last.batch if last else None,
            "watermark": (self.watermark() or {}).get("tweet_id"),
        }
