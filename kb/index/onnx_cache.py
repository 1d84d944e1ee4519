"""Where the ONNX files of the local model live (kb/index/embed_onnx.py makes
them at the first search): once per machine, not once per HOME.

The files were in the user's cache folder only (~/.cache/kb/onnx). So each
HOME that had not run kb before (another user, a service, an agent's MCP
client) made them again at its first search: 5.8 s for the int8 file, with
a warning of ONNX Runtime that is for developers (issue 48). Now kb looks
first in a folder of the install, which every user and HOME of that install
reads: `<venv>/share/kb/onnx` (KB_ONNX_SHARED_DIR names another). kb writes
a new file there when it can, else in the user's cache folder. It uses the
shared folder only when no other user can write to it (trusted()).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path


def user_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "kb" / "onnx"


def shared_dir() -> Path:
    return Path(os.environ.get("KB_ONNX_SHARED_DIR") or Path(sys.prefix) / "share" / "kb" / "onnx")


def trusted(path: Path) -> bool:
    """True when only this user or root can have written `path`: its owner
    is one of them, and no group or other user may write it. kb loads the
    model that it finds in the shared folder, so a file that another user
    could plant or change there is not used."""
    try:
        status = path.stat()
    except OSError:
        return False
    return status.st_uid in (0, os.getuid()) and not status.st_mode & 0o022


def existing(name: str) -> Path | None:
    """The ONNX file `name` in the shared folder (when the folder and the
    file are trusted), else in the user's, else None."""
    shared = shared_dir()
    if (shared / name).is_file() and trusted(shared) and trusted(shared / name):
        return shared / name
    if (user_dir() / name).is_file():
        return user_dir() / name
    return None


def new_path(name: str) -> Path:
    """Where to write the ONNX file `name`: the shared folder when this user
    can write to it and it is trusted (it is made when its parent can be
    written), else the user's cache folder."""
    shared = shared_dir()
    with contextlib.suppress(OSError):
        shared.mkdir(mode=0o755, parents=True, exist_ok=True)
        if os.access(shared, os.W_OK) and trusted(shared):
            return shared / name
    return user_dir() / name


class _NotForTheOwner(logging.Filter):
    """Drops the records of ONNX Runtime's quantization: it tells developers
    to pre-process their model ("Please consider to run pre-processing
    before quantization"), through the root logger, on the owner's terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname


@contextlib.contextmanager
def quiet_quantization() -> Iterator[None]:
    root = logging.getLogger()
    quiet = _NotForTheOwner()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)
