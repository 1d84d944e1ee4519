"""A process of kb that ends without Python's last garbage collection.

Why: when Python ends, it collects every object of the heap once more. A
process that has loaded Dagster holds millions of them. After SIGTERM,
dagster-daemon stopped its threads in well under a second, then spent
seconds of CPU in that collection (seen with gdb), and `kb up` had to
SIGKILL it after STOP_WAIT_S. With gc.freeze() at exit, the collection
has nothing to look at, and the daemon ends at once (the figures:
benchmarks/figures_from_comments.md). The
operating system frees the memory; each `with` block, atexit handler and
weakref finalizer still runs, so files and databases close as before.

`kb up` runs the code server (`dagster code-server start`) and
dagster-daemon through this module:
    python -m kb.apps.quick_exit /path/to/dagster-daemon run -w workspace.yaml
dagster-webserver runs through kb.apps.guarded_webserver, which does the same
and puts kb's guard in front of the UI.
Each `kb` command and `kb-bot` call skip_final_collection() themselves.
"""

from __future__ import annotations

import atexit
import gc
import runpy
import sys


_REGISTERED: list[bool] = []


def skip_final_collection() -> None:
    """Let this process end without the full collection of its heap. A
    second call does nothing: tests run many commands in one process."""
    if not _REGISTERED:
        atexit.register(gc.freeze)
        _REGISTERED.append(True)


def run_console_script(before_run=None) -> None:
    """Run the console script in argv[1] with the arguments after it, as a
    part of kb up: it watches its lifeline and skips the last collection.
    before_run (for example the guard of the webserver) runs just before
    the script."""
    from kb.apps.lifeline import watch_lifeline

    watch_lifeline()  # before the tool starts a child: the tool's group stops when kb up dies
    sys.argv = sys.argv[1:]
    if not sys.argv:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'kb.apps.quick_exit'} "
                 "/path/to/console-script [options]")
    skip_final_collection()
    if before_run is not None:
        before_run()
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    run_console_script()


if __name__ == "__main__":
    main()
