"""Raw files: captured pages exactly as they came. Never edited.

Layout under KB_HOME/raw/x:
    <batch>/page-0001.json ...   one file per GraphQL Bookmarks response
    <batch>/capture.json         the capture's manifest (written last)
    watermark.json               newest bookmark of the last complete capture
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kb.atomic_files import write_atomic

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

    def batches(self) -> list[str]:
        root = self.x_dir()
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def write_manifest(self, manifest: CaptureManifest) -> None:
        path = self.batch_dir(manifest.batch) / "capture.json"
        write_atomic(path, json.dumps(asdict(manifest), indent=2).encode())

    def resume_point(self, *, full: bool) -> CaptureManifest | None:
        """The manifest of the last browser capture when it did not complete
        and left a cursor to go on from (with the same `full`), else None.
        Hard-won fact: a first capture of thousands of bookmarks meets HTTP
        429; when each sync starts at the top again, it never completes."""
        captures = []
        for batch in self.batches():
            try:
                manifest = self.manifest(batch)
            except (ValueError, TypeError):
                continue
            if manifest is not None and manifest.mode == "browser":
                captures.append(manifest)
        if not captures:
            return None
        last = max(captures, key=lambda m: (m.started_at, m.batch))
        if last.complete or not last.resume_cursor or last.full != full:
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
