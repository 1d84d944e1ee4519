"""Beat files: the time of the last run of a periodic check, for a watchdog
in another process (kb/apps/watchdog.py reads the stuck check's beat).
A file, not the Dagster instance: `kb up` reads it without Dagster."""

from __future__ import annotations

import time
from pathlib import Path

from kb.store.atomic_files import write_atomic

STUCK_CHECK = "stuck-check"


def beat_path(home: Path, name: str) -> Path:
    return home / "run" / f"{name}.beat"


def note_beat(home: Path, name: str, now: float | None = None) -> None:
    """`name` ran now."""
    path = beat_path(home, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, f"{time.time() if now is None else now:.3f}\n".encode())


def last_beat(home: Path, name: str) -> float | None:
    """The Unix time of the last beat of `name`, or None."""
    try:
        return float(beat_path(home, name).read_text().strip())
    except (OSError, ValueError):
        return None
