"""What a test of private modes needs: the paths under a folder that group
or others may read, write or enter (kb/store/private_files.py)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def open_to_others(root: Path) -> list[str]:
    """Each folder and file under `root` (and `root` itself) whose mode
    gives group or others any right. Links are skipped: their mode means
    nothing."""
    found = []
    for path in [root, *root.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):  # a part of kb up may remove a file meanwhile
            info = path.lstat()
            if not stat.S_ISLNK(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
                found.append(f"{path.relative_to(root.parent)} {stat.S_IMODE(info.st_mode):04o}")
    return found


@contextlib.contextmanager
def open_umask():
    """A umask that leaves new files readable by all (the default of many
    systems), to show that kb does not depend on the owner's umask."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)
