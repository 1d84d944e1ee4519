"""The inbox: one JSON manifest per source, and its attachment.

Layout under KB_HOME/inbox (settings.inbox_dir):

    items/<stamp>-<id>.json          one manifest per item
    files/<id>/<name>                the attachment of an item
    requests/<stamp>-<kind>.json     /override, /lint and /synthesize from the bot
    notified/<id>.<state>            one empty file per notification sent
    unsupported/                     dropped files of a type kb cannot parse
    <any other file>                 dropped by the owner when there is no bot

Rules, and why:
- Writes are atomic (temp file, then rename): a reader never sees half an item.
- The stamp in a manifest name is the time of the write, in microseconds.
  Names are taken under a file lock and only go up, so the rename order is
  the name order. The inbox sensor's cursor is the last name it saw: with
  this rule, no item can appear behind the cursor and be missed.
- The item id comes from the Telegram chat and message ids, so the same
  message twice gives one item. A dropped file's id comes from its bytes.
- A dropped file is taken only when it is whole: when its size,
  modification time and change time have not changed for KB_INBOX_SETTLE_S
  seconds (2 s), and not while it has the name of a partial download
  (.part, .crdownload ...). The bot never needs this: it writes each file
  under a temp name and renames it when complete. Why: a file that another
  program still copied was taken with its first 1,009 bytes of 9 MB, and
  the rest was lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path

from kb.store.atomic_files import write_atomic
from kb.telegram.intake import MARKDOWN_SUFFIXES, extract_urls, source_type_of_url

STAMP_FORMAT = "%Y%m%dT%H%M%S%fZ"
ID_LENGTH = 10

# Dropped files: the suffix gives the type.
DROP_TYPES = {
    ".pdf": "pdf",
    **{suffix: "md" for suffix in MARKDOWN_SUFFIXES},
    ".txt": "text",
    ".ogg": "voice", ".oga": "voice", ".opus": "voice", ".mp3": "voice",
    ".m4a": "voice", ".wav": "voice", ".flac": "voice",
}


# Names that programs give a file while they still write it.
PARTIAL_SUFFIXES = (".part", ".partial", ".crdownload", ".download", ".tmp", ".temp", "~")


class InboxError(ValueError):
    """An inbox file that kb cannot read. The message names the file."""


class FileStillChanging(InboxError):
    """A dropped file changed while kb read it: it is taken at a later look."""


@dataclass(frozen=True)
class InboxItem:
    id: str
    type: str  # web, youtube, pdf, md, text, voice
    received_at: str  # ISO 8601, UTC
    origin: str  # telegram or drop
    url: str | None = None
    text: str | None = None
    file: str | None = None  # the attachment, relative to the inbox folder
    file_name: str | None = None
    mime_type: str | None = None
    file_size: int | None = None
    chat_id: int | None = None
    message_id: int | None = None
    user_id: int | None = None
    manifest: str = field(default="", compare=False)  # the manifest's file name, set on read

    @property
    def is_system(self) -> bool:
        """An item with no Telegram message to answer (a dropped file)."""
        return self.chat_id is None or self.message_id is None

    def to_json(self) -> bytes:
        data = {k: v for k, v in asdict(self).items() if k != "manifest"}
        return json.dumps(data, ensure_ascii=False, indent=2).encode()


def telegram_item_id(chat_id: int, message_id: int) -> str:
    return hashlib.sha256(f"telegram:{chat_id}:{message_id}".encode()).hexdigest()[:ID_LENGTH]


def dropped_item_id(content: bytes) -> str:
    return hashlib.sha256(b"drop:" + content).hexdigest()[:ID_LENGTH]


def item_id_of_manifest(name: str) -> str:
    """items/<stamp>-<id>.json -> <id>."""
    return name.removesuffix(".json").rsplit("-", 1)[-1]


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Inbox:
    def __init__(self, root: Path, settle_s: float = 2.0):
        self.root = Path(root)
        self.settle_s = settle_s  # see settled_dropped_files()

    # --- folders ---------------------------------------------------------------
    @property
    def items_dir(self) -> Path:
        return self.root / "items"

    @property
    def requests_dir(self) -> Path:
        return self.root / "requests"

    @property
    def notified_dir(self) -> Path:
        return self.root / "notified"

    def files_dir(self, item_id: str) -> Path:
        return self.root / "files" / item_id

    def attachment_path(self, item: InboxItem) -> Path | None:
        """The item's attachment. It must resolve inside files/<id>/, the
        item's own folder: a manifest comes from the bot, from a dropped
        file or from a restored archive, and an absolute `file` (or one
        with `..` or a link) would feed any file of the owner, for example
        ~/.config/kb/.env, to the gate, the index and the wiki."""
        if not item.file:
            return None
        folder = self.files_dir(str(item.id))
        plain = isinstance(item.file, str) and str(item.id).isalnum() and not os.path.isabs(item.file)
        path = self.root / item.file if plain else None
        if path is None or not path.resolve().is_relative_to(folder.resolve()) or path.resolve() == folder.resolve():
            raise InboxError(f"inbox item {item.id}: its file {item.file!r} is not inside {folder}. kb reads an "
                             "attachment only from the item's own folder; the item is not read.")
        return path

    # --- names that only go up ---------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _next_stamp(self) -> str:
        """Call with the lock held. The clock can stand still or step back;
        the stamp must not, so it is at least one microsecond after the last."""
        last_file = self.root / ".last-stamp"
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        if last_file.exists():
            last = datetime.strptime(last_file.read_text().strip(), STAMP_FORMAT)
            now = max(now, last + timedelta(microseconds=1))
        stamp = now.strftime(STAMP_FORMAT)
        write_atomic(last_file, stamp.encode())
        return stamp

    # --- items -----------------------------------------------------------------
    def find(self, item_id: str) -> InboxItem | None:
        if not item_id or not item_id.isalnum():
            return None
        matches = sorted(self.items_dir.glob(f"*-{item_id}.json")) if self.items_dir.is_dir() else []
        return self.read(matches[0]) if matches else None

    def get(self, item_id: str) -> InboxItem:
        item = self.find(item_id)
        if item is None:
            raise InboxError(f"inbox item {item_id!r}: no manifest in {self.items_dir}")
        return item

    def read(self, path: Path) -> InboxItem:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise InboxError(f"inbox manifest {path}: not readable JSON ({exc})") from None
        known = {f.name for f in fields(InboxItem)} - {"manifest"}
        if not isinstance(data, dict) or not {"id", "type", "received_at", "origin"} <= data.keys():
            raise InboxError(f"inbox manifest {path}: needs the keys id, type, received_at and origin")
        return InboxItem(**{k: v for k, v in data.items() if k in known}, manifest=path.name)

    def add(self, item: InboxItem) -> tuple[InboxItem, bool]:
        """Write the item's manifest. Returns (item, True), or (the existing
        item, False) when an item with this id is there already."""
        with self._locked():
            existing = self.find(item.id)
            if existing is not None:
                return existing, False
            name = f"{self._next_stamp()}-{item.id}.json"
            write_atomic(self.items_dir / name, item.to_json())
        return self.read(self.items_dir / name), True

    def manifest_names_after(self, cursor: str | None, limit: int | None = None) -> list[str]:
        """Manifest names that sort after the cursor, oldest first."""
        if not self.items_dir.is_dir():
            return []
        names = sorted(
            p.name for p in self.items_dir.iterdir()
            if p.suffix == ".json" and not p.name.startswith(".") and p.name > (cursor or "")
        )
        return names[:limit] if limit else names

    def items_of_user(self, user_id: int, limit: int = 10) -> list[InboxItem]:
        """The user's newest items, newest first. Unreadable manifests are skipped."""
        out: list[InboxItem] = []
        for name in reversed(self.manifest_names_after(None)):
            try:
                item = self.read(self.items_dir / name)
            except InboxError:
                continue
            if item.user_id == user_id:
                out.append(item)
                if len(out) == limit:
                    break
        return out

    # --- files that the owner drops in the inbox ----------------------------------
    def dropped_files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_file() and not p.name.startswith("."))

    def settled_dropped_files(self) -> list[Path]:
        """The dropped files that no program writes any more: not named as a
        partial download, and with a size, modification time and change time
        that have not changed for `settle_s` seconds. The change time counts
        too because a program can set the modification time (cp -p, touch)
        but not the change time."""
        now = time.time()
        settled = []
        for path in self.dropped_files():
            if path.name.lower().endswith(PARTIAL_SUFFIXES):
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                if now - max(stat.st_mtime, stat.st_ctime) >= self.settle_s:
                    settled.append(path)
        return settled

    def adopt_dropped_file(self, path: Path) -> InboxItem | None:
        """Make an item of a file that the owner dropped in the inbox.

        The steps can stop at any point and run again: the copy is made
        first, then the manifest, and the dropped file is removed last. The
        id comes from the bytes, so a second run finds the same item.
        Returns None (and moves the file to unsupported/) for a type that kb
        cannot parse."""
        kind = DROP_TYPES.get(path.suffix.lower())
        if kind is None:
            target = self.root / "unsupported" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            return None
        before = _signature(path.stat())
        content = path.read_bytes()
        after = path.stat()
        if _signature(after) != before or len(content) != after.st_size:
            raise FileStillChanging(f"inbox: {path.name} changed while kb read it ({len(content)} of "
                                    f"{after.st_size} bytes); kb takes it when it stays unchanged")
        item_id = dropped_item_id(content)
        url = None
        file_rel = None
        if kind == "text":
            urls = extract_urls(content.decode("utf-8", errors="replace"))
            if len(urls) == 1 and content.decode("utf-8", errors="replace").strip() == urls[0]:
                kind, url = source_type_of_url(urls[0]), urls[0]
        if url is None:
            target = self.files_dir(item_id) / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            file_rel = str(target.relative_to(self.root))
        item = InboxItem(
            id=item_id, type=kind, received_at=utc_now_iso(), origin="drop", url=url,
            file=file_rel, file_name=path.name, file_size=len(content),
        )
        item, _ = self.add(item)
        path.unlink(missing_ok=True)
        return item

    # --- requests from the bot's commands -------------------------------------------
    def add_request(self, kind: str, **payload) -> str:
        """Write a request for the requests sensor. Returns its file name."""
        with self._locked():
            name = f"{self._next_stamp()}-{kind}.json"
            body = {"kind": kind, "requested_at": utc_now_iso(), **payload}
            write_atomic(self.requests_dir / name, json.dumps(body, ensure_ascii=False).encode())
        return name

    def request_names_after(self, cursor: str | None) -> list[str]:
        if not self.requests_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.requests_dir.iterdir()
            if p.suffix == ".json" and not p.name.startswith(".") and p.name > (cursor or "")
        )

    def read_request(self, name: str) -> dict:
        path = self.requests_dir / name
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise InboxError(f"request file {path}: not readable JSON ({exc})") from None
        if not isinstance(data, dict) or "kind" not in data:
            raise InboxError(f"request file {path}: has no 'kind'")
        return data

    # --- notifications sent (at most once per item and state) ------------------------
    def claim_notification(self, item_id: str, state: str) -> bool:
        """Record that the notification is being sent. False when it was sent
        before. The record is made before the send: a crash after the send
        must not send it twice."""
        self.notified_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.notified_dir / f"{item_id}.{state}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def release_notification(self, item_id: str, state: str) -> None:
        """The send failed: remove the record, so that a later try can send it."""
        (self.notified_dir / f"{item_id}.{state}").unlink(missing_ok=True)


def _signature(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns
