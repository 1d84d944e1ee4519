"""The record of the `kb up` that runs for a KB_HOME, and the clean-up of
the parts of an earlier kb up that died.

kb up holds $KB_HOME/run/kb-up.lock (an flock) for all its life, and writes
$KB_HOME/run/kb-up.json: its pid and start time, and the pid, process group,
start time and address of each part. The kernel frees the lock when kb up ends, also
after SIGKILL. So a held lock means that a kb up runs, and a free lock with
a record means that the kb up of the record died without its stop.

Each part stops itself when kb up dies (kb/apps/lifeline.py). A part that
could not (it was stopped, or hung) is found here by the next kb up, which
stops its process group. The record also keeps the group of an earlier
process of a part (it died, kb up started it again) while a child of it
lives: kb up stops that child at its stop.

Two rules keep the clean-up on kb's own processes:
- A pid is used again after its process ends: a process counts as the
  recorded one only when its start time is the recorded start time.
- A record is a file, and a file can lie: kb up signals only a process
  that started with this KB_HOME in its environment (kb up gives it to each
  part, and the part's children inherit it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from kb.apps.lifeline import group_members
from kb.store.atomic_files import write_atomic
from kb.store.writer_lock import WriterLockTimeout, acquire

RECORD_NAME, LOCK_NAME = "kb-up.json", "kb-up.lock"
# psutil gives a start time to 10 ms; two reads of one process agree within this.
START_SLACK_S = 0.05
# SIGTERM first; SIGKILL after this, as kb up's own stop (kb.apps.up imports it).
STOP_WAIT_S = 10.0  # within the 15 s promise of a stop


class RecordError(Exception):
    """kb up must not start for this KB_HOME; the text says why."""


def start_time(pid: int) -> float | None:
    """The start time of process pid (Unix time), or None when it does not run."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None


def is_recorded_process(pid: int, started: float) -> bool:
    now = start_time(pid)
    return now is not None and abs(now - started) <= START_SLACK_S


@dataclass
class Leftover:
    """A part of an earlier kb up whose process group still has a process."""
    name: str
    pid: int
    pgid: int


@dataclass
class UpRecord:
    """The record of this kb up. Hold it for the life of kb up."""
    folder: Path
    lock_fd: int
    started: float = field(default_factory=lambda: start_time(os.getpid()) or time.time())
    earlier: dict | None = None  # the record of an earlier kb up that died, if there was one
    entries: dict[int, dict] = field(default_factory=dict)  # by pid: what note() writes

    @property
    def path(self) -> Path:
        return self.folder / RECORD_NAME

    @property
    def home(self) -> Path:
        return self.folder.parent

    def note(self, parts: Iterable) -> None:
        """Write the record (atomically): the parts that run now, and the
        earlier processes of a part (it died, kb up started it again) whose
        group still has a process. Such a child (a run worker of a code
        server that crashed) must not outlive kb up either.
        Each part is a kb.apps.up.Part with a started process."""
        parts = list(parts)
        running = {p.process.pid for p in parts if p.process is not None and p.process.poll() is None}
        for part in parts:
            pid = part.process.pid if part.process is not None else None
            if pid not in running or pid in self.entries:
                continue
            started = start_time(pid)
            if started is not None:
                # Each part leads its own group (start_new_session): its pgid is its pid.
                # "where": the part's address; `kb sync` finds kb up's webserver by it (kb/apps/run_paths.py).
                self.entries[pid] = {"name": part.name, "pid": pid, "pgid": pid, "started": started,
                                     "where": part.where}
        for pid in [pid for pid in self.entries if pid not in running and not home_members(pid, self.home)]:
            del self.entries[pid]  # an earlier process whose group is empty
        record = {"pid": os.getpid(), "started": self.started, "parts": list(self.entries.values())}
        write_atomic(self.path, (json.dumps(record, indent=2) + "\n").encode())

    def stop_orphans(self) -> list[Leftover]:
        """After kb up stopped its parts: stop what is left in the groups of
        the earlier processes of its parts. Returns what it stopped."""
        found = leftovers({"parts": list(self.entries.values())}, self.home)
        stop_leftovers(found, self.home)
        return found

    def release(self, *, forget: bool = True) -> None:
        """Free the lock. forget: remove the record too (kb up has stopped
        every part). Keep it when parts of it may still run."""
        try:
            if forget:
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self.lock_fd)


def read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # a record that kb up could not finish: its parts have their lifelines
    return record if isinstance(record, dict) else None


def claim(home: Path) -> UpRecord:
    """Take the lock of this KB_HOME for this kb up.

    A RecordError when an earlier kb up of this KB_HOME still runs. When
    one died without its stop, its record is in UpRecord.earlier: call
    stop_leftovers() with it."""
    folder = home / "run"
    try:
        # The writer lock's flock (O_CLOEXEC: no part holds it after kb up ends), with no wait.
        fd = acquire(folder / LOCK_NAME, what="kb up", wait_s=0)
    except WriterLockTimeout:
        running = read_record(folder / RECORD_NAME) or {}
        pid = running.get("pid", "unknown")
        raise RecordError(f"kb up (pid {pid}) already runs for this KB_HOME ({home}). "
                          "Stop it first (Ctrl-C in its terminal, or SIGTERM to its pid).") from None
    return UpRecord(folder, fd, earlier=read_record(folder / RECORD_NAME))


def of_this_home(pid: int, home: Path) -> bool:
    """True when process pid runs for this KB_HOME: kb up gives each part
    KB_HOME, and the part's children inherit it. The environment of
    /proc is the one that the process started with."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False  # it ended, or it belongs to another user
    return f"KB_HOME={home}".encode() in environ


def home_members(pgid: int, home: Path) -> list[int]:
    """The live processes of group pgid that run for this KB_HOME."""
    return [pid for pid in group_members(pgid) if of_this_home(pid, home)]


def leftovers(earlier: dict, home: Path) -> list[Leftover]:
    """The recorded parts whose process group still has a process of this KB_HOME."""
    found = []
    for entry in earlier.get("parts", []):
        try:
            name, started = str(entry["name"]), float(entry["started"])
            pid, pgid = int(entry["pid"]), int(entry["pgid"])
        except (KeyError, TypeError, ValueError):
            continue
        if pgid <= 1 or pid != pgid:
            continue  # kb up records only group leaders: a record that says else is not kb up's
        if not is_recorded_process(pid, started) and start_time(pid) is not None:
            # The pid runs another program now, so the old group had no
            # process left when the pid was used again: nothing of ours is in it.
            continue
        # The leader is the recorded one, or it has ended. While one process
        # of a group lives, Linux does not give its number to a new process,
        # so the live processes of this group are the part's children.
        if home_members(pgid, home):
            found.append(Leftover(name, pid, pgid))
    return found


def stop_leftovers(found: list[Leftover], home: Path, wait_s: float = STOP_WAIT_S) -> list[Leftover]:
    """Stop the processes of each leftover's group: SIGTERM (and SIGCONT,
    for a stopped process), then SIGKILL after wait_s. Only processes of
    this KB_HOME: a record is a file, and a file can lie. Returns the groups
    that still have such a process (none, unless one cannot be stopped)."""
    def signal_all(signals: tuple[int, ...], told: set[int]) -> bool:
        members = [pid for part in found for pid in home_members(part.pgid, home)]
        for pid in members:
            if pid in told:
                continue
            for sig in signals:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            told.add(pid)
        return bool(members)

    for signals in ((signal.SIGTERM, signal.SIGCONT), (signal.SIGKILL,)):
        told: set[int] = set()
        deadline = time.monotonic() + wait_s
        # Again and again: a process may start a child while it stops.
        while signal_all(signals, told) and time.monotonic() < deadline:
            time.sleep(0.1)
    return [p for p in found if home_members(p.pgid, home)]
