"""The system part of every bubblewrap room of kb: the browser's
(kb/x/browser_room.py) and the wiki agent's (kb/wiki/sandbox.py). One copy,
so that both rooms see the system folders the same way."""

from __future__ import annotations

import os

# Read-only in every room. /etc as a whole is not: it can hold keys; each
# room names the files of /etc that its program needs.
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")


def system_binds(files: tuple[str, ...]) -> list[str]:
    """bwrap arguments for the system folders (read-only; a folder that is a
    link, as /bin on a merged-/usr system, stays a link) and the named files,
    where they exist."""
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for path in files:
        args += ["--ro-bind-try", path, path]
    return args
