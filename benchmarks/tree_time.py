"""Wall and CPU time of a command and of every process under it.

    .venv/bin/python benchmarks/tree_time.py COMMAND [ARG ...]

Why not /usr/bin/time: it counts only the processes that their parents
waited for. When kb up kills a part's process group, an orphan (a code
server of the daemon, a run worker) goes to init, and its CPU time is lost.
This script is a child subreaper (Linux prctl): every orphan under it comes
back to it, and it waits for each one.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl failed: {os.strerror(ctypes.get_errno())}")
    started = time.monotonic()
    command = subprocess.Popen(sys.argv[1:])
    code = command.wait()
    while True:  # the orphans that still run
        try:
            os.wait()
        except ChildProcessError:
            break
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"tree_time: exit {code}, wall {wall:.1f} s, CPU user {usage.ru_utime:.1f} s + system "
          f"{usage.ru_stime:.1f} s = {usage.ru_utime + usage.ru_stime:.1f} s", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
