"""Where the ONNX files of the local model live (kb/index/embedder.py makes
them at the first search): once per machine, not once per HOME.

The files were in the user's cache folder only (~/.cache/kb/onnx). So each
HOME that had not run kb before (another user, a service, an agent's MCP
client) made them again at its first search: 5.8 s for the int8 file, with
a warning of ONNX Runtime that is for developers (issue 48). Now kb looks
first in a folder of the install, which every user and HOME of that install
reads: `<venv>/share/kb/onnx` (KB_ONNX_SHARED_DIR names another). kb writes
a new file there when it can, else in the user's cache folder.
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


def existing(name: str) -> Path | None:
    """The ONNX file `name` in the shared folder, else in the user's, else None."""
    for folder in (shared_dir(), user_dir()):
        if (folder / name).is_file():
            return folder / name
    return None


def new_path(name: str) -> Path:
    """Where to write the ONNX file `name`: the shared folder when this user
    can write to it (it is made when its parent can be written), else the
    user's cache folder."""
    shared = shared_dir()
    with contextlib.suppress(OSError):
        shared.mkdir(parents=True, exist_ok=True)
        if os.access(shared, os.W_OK):
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
