"""The lifeline between `kb up` and its parts: a part stops when kb up dies.

kb up starts each part in its own session and process group, so that
Ctrl-C in the terminal reaches kb up only. The cost: when kb up dies
without its stop (SIGKILL, the out-of-memory killer), nothing stops the
parts. Measured before this module: 2 to 4 parts of each killed kb up ran
on 5 to 10 minutes later, and the orphaned daemons went on with wiki runs.

The lifeline is a pipe. kb up holds its write end and never writes; each
part gets the read end (its number in KB_UP_LIFELINE) and watches it in a
thread. The kernel closes the write end when kb up ends, for any cause, and
the part then reads end-of-file. The part then stops its whole process
group: first the other members (the process of the code server that loads
the graph, run workers of the code server), then itself.

Why not only PR_SET_PDEATHSIG: it stops the part at once, and the part's
children then have no process that stops them. Run workers stay in the
group of the code server (Dagster starts them with multiprocessing "spawn",
in no new session), so a stop of the group reaches them. PR_SET_PDEATHSIG
also fires when the *thread* that started the part ends, not the process.
The pipe depends on no thread: its write end belongs to the process.

Only kb up gives a part the lifeline. The part removes KB_UP_LIFELINE from
its environment at once, so its children do not get it. A process that is
not the leader of its process group stops nothing: the group is not its to
stop (a group leader is what kb up starts).
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import threading
import time

ENV_NAME = "KB_UP_LIFELINE"
# The part gives the other members of its group this long after SIGTERM,
# and then itself this long, before SIGKILL. Together well within the 10 s
# in which no part of a dead kb up may run.
OTHERS_WAIT_S = 3.0
SELF_WAIT_S = 2.0
_POLL_S = 0.1

log = logging.getLogger(__name__)


class Lifeline:
    """kb up's side: the pipe. Both ends are not inheritable (Python's
    default): only the read end goes to a part, through pass_fds. If a part
    held a copy of the write end, its lifeline would never break."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def env(self) -> dict[str, str]:
        return {ENV_NAME: str(self.read_fd)}

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def group_members(pgid: int, *, skip: int | None = None) -> list[int]:
    """The live processes (no zombies) of process group `pgid`, but `skip`."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == skip:
            continue
        pid = int(entry)
        try:
            if os.getpgid(pid) != pgid:
                continue
            with open(f"/proc/{pid}/stat", "rb") as fh:
                # The state follows the name in parentheses; a name can hold ")".
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # it ended while we looked
        if state not in (b"Z", b"X"):
            members.append(pid)
    return members


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to process group pgid. False when the group has no process,
    or none that this user may signal."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_others(pgid: int, me: int, wait_s: float) -> None:
    """SIGTERM to each member of the group but `me`, also to a member that
    starts meanwhile; SIGKILL to the group if any of them is left after
    wait_s (that ends `me` too)."""
    told: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        others = group_members(pgid, skip=me)
        if not others:
            return
        if time.monotonic() > deadline:
            signal_group(pgid, signal.SIGKILL)
            return
        for pid in others:
            if pid not in told:
                try:
                    os.kill(pid, signal.SIGTERM)
                    os.kill(pid, signal.SIGCONT)  # a stopped process must run to act on SIGTERM
                except ProcessLookupError:
                    pass
                told.add(pid)
        time.sleep(_POLL_S)


def stop_own_group() -> None:
    """Stop every process of this group: the others first, then this one
    (its own SIGTERM handler runs), then SIGKILL to what is left."""
    me = os.getpid()
    stop_others(me, me, OTHERS_WAIT_S)
    os.kill(me, signal.SIGTERM)
    time.sleep(SELF_WAIT_S)
    signal_group(me, signal.SIGKILL)


def _watch(fd: int) -> None:
    while os.read(fd, 1):
        pass  # kb up never writes; only end-of-file counts
    log.warning("kb up ended without stopping this part: this part stops its process group now.")
    stop_own_group()


def watch_lifeline() -> bool:
    """A part's side: when kb up gave this process a lifeline, watch it in a
    daemon thread. True when it watches. Call it first in each entry point
    that kb up starts."""
    value = os.environ.pop(ENV_NAME, None)
    if value is None:
        return False
    if not value.isdigit():
        log.warning("%s=%r is not a file descriptor number: no lifeline to kb up.", ENV_NAME, value)
        return False
    fd = int(value)
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:
        log.warning("%s=%s is not an open pipe: no lifeline to kb up.", ENV_NAME, fd)
        return False
    if os.getpgid(0) != os.getpid():
        # Not the leader of its group: the group belongs to another
        # process (the terminal's, or kb up's own). Stop nothing.
        log.warning("%s: this process does not lead its process group: no lifeline to kb up.", ENV_NAME)
        os.close(fd)
        return False
    threading.Thread(target=_watch, args=(fd,), name="kb up lifeline", daemon=True).start()
    return True
