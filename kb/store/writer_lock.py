"""A short lock across processes around each write of a store.

Why: DuckDB lets one process at a time open its file, and two processes that
commit to one LanceDB table at the same time (a compaction and a merge) make
commit conflicts. Before this lock, a Dagster pool of size one kept the
writers apart, but a step holds its pool slot for the whole step: also while
it fetches pages, waits for a GPU or embeds. An inbox item then waited for
minutes behind a sync. This lock is held only for the write itself (seconds),
so the network, GPU, model and embedding work of one run goes on while
another run writes.

The lock is an flock(2) on a file beside the store. The kernel frees it when
the process ends, also after SIGKILL: a killed run never leaves it held.

Why not the `filelock` library (it takes the same flock(2)): measured in
benchmarks/libraries.md, it is no faster with no other holder, and a
second thread of the same process waits for its poll interval (about 40 ms
after the release, against 0.3 ms here: the threads of one process take
turns on an RLock, not on the file). And a child process after fork() keeps
the parent's open lock file, which holds the flock until the child closes
it: `_forget_locks_in_child` closes it, and filelock has no public way to
do that.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# A hold longer than this is logged: a write of kb takes seconds. A longer
# hold makes the other writers (the Telegram intake) wait.
LONG_HOLD_S = 30.0
_POLL_S = 0.02


class WriterLockTimeout(RuntimeError):
    """Another process held the writer lock for longer than the wait limit."""


def default_wait_s() -> float:
    from kb.settings import get_settings

    return get_settings().kb_writer_lock_wait_s


def acquire(path: Path, *, what: str, wait_s: float | None = None) -> int:
    """Take the lock file at `path`; wait while another process holds it.
    Returns the open file descriptor: close it (release()) to free the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # The usual case: no other holder. One flock(2) call; the wait loop
        # below (a tenacity object for each call, and a read of the
        # settings) cost 0.1 to 0.4 ms more (benchmarks/libraries.md).
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    try:
        # The settings only now: get_settings() costs about 0.1 ms, more than the lock.
        wait_s = default_wait_s() if wait_s is None else wait_s
        # Imported here: the serving processes import this module but never write.
        import tenacity

        # A non-blocking try at each poll: a blocking flock(2) has no time limit.
        take = tenacity.retry(retry=tenacity.retry_if_exception_type(BlockingIOError),
                              stop=tenacity.stop_after_delay(wait_s), wait=tenacity.wait_fixed(_POLL_S),
                              reraise=True)(fcntl.flock)
        take(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        raise WriterLockTimeout(
            f"{what}: another process held the writer lock {path} for more than {wait_s:g} s "
            "(KB_WRITER_LOCK_WAIT_S). A write of kb takes seconds: look for a process that hangs "
            "in a write.") from None
    except BaseException:
        os.close(fd)
        raise


def release(fd: int) -> None:
    os.close(fd)  # closing the last descriptor of the open file frees the flock


class WriterLock:
    """The writer lock of one store, for the threads of this process.

    Re-entrant in one thread (a write method may call another one); the
    threads of the process take turns; other processes wait on the file."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self._turn = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._since = 0.0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._turn:
            if self._depth == 0:
                self._fd = acquire(self.path, what=self.what)
                self._since = time.monotonic()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fd, self._fd = self._fd, None
                    release(fd)
                    note_hold(self.what, time.monotonic() - self._since)

    def forget_in_child(self) -> None:
        """After a fork: the child must not keep the parent's lock open."""
        self._turn = threading.RLock()
        self._depth = 0
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def note_hold(what: str, seconds: float) -> None:
    if seconds > LONG_HOLD_S:
        log.warning("%s held its writer lock for %.0f s; other writers waited.", what, seconds)


_locks_guard = threading.Lock()
_locks: dict[str, WriterLock] = {}


def writer_lock(path: Path, what: str) -> WriterLock:
    """The one WriterLock of this process for the lock file at `path`."""
    key = os.path.abspath(path)
    with _locks_guard:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = WriterLock(Path(key), what)
        return lock


def _forget_locks_in_child() -> None:
    global _locks_guard
    _locks_guard = threading.Lock()
    for lock in _locks.values():
        lock.forget_in_child()


os.register_at_fork(after_in_child=_forget_locks_in_child)
