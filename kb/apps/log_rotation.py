"""The logs that kb up keeps in KB_HOME stay within a bound.

- The log of each part ($KB_HOME/logs/<part>.log): when it is larger than
  LOG_MAX_BYTES, kb up copies it to `<part>.log.1` (the older copies move to
  `.2` ... `.LOG_KEEP`; the oldest goes) and empties it. The part keeps its
  file open for appends, so it writes on at the start of the empty file. A
  line that the part writes between the copy and the truncation is lost.
- Dagster's compute logs ($DAGSTER_HOME/storage/<run id>/compute_logs/):
  when all of them hold more than COMPUTE_LOGS_MAX_BYTES, kb up deletes the
  compute logs of the oldest finished runs (a `.complete` file marks each
  finished step) until they hold less. The runs and their events stay.

- The write-ahead logs of Dagster's run files ($DAGSTER_HOME/history/runs/
  <run id>.db-wal): a process that ends closes its connections, and the last
  close folds the WAL into its file (kb_assets/sqlite_instance.py). A
  process that is killed, or that still had the file open when the run
  ended, left a WAL of 2 to 3 MB for ever (issue 55's month: 23 of about 100
  runs). kb up folds each WAL untouched for WAL_IDLE_S into its file.

kb up does all three at its start and then every ROTATE_EVERY_S seconds
(kb/apps/up.py). Without it, the logs grew for ever (issue 55's month).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

LOG_MAX_BYTES = 10 * 1024 * 1024
LOG_KEEP = 2
COMPUTE_LOGS_MAX_BYTES = 50 * 1024 * 1024
ROTATE_EVERY_S = 60.0
WAL_IDLE_S = 600.0


def rotate_log(path: Path, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> bool:
    """Copy the log to `.1` and empty it when it holds more than max_bytes.
    True when it did."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for number in range(keep, 1, -1):
        older = path.with_name(f"{path.name}.{number - 1}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{number}"))
    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    os.truncate(path, 0)
    return True


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _finished(folder: Path) -> bool:
    """Every step log of the run has its `.complete` mark."""
    logs = {p.stem for p in folder.iterdir() if p.suffix in (".out", ".err")}
    return all((folder / f"{stem}.complete").exists() for stem in logs)


def prune_compute_logs(storage: Path, max_bytes: int = COMPUTE_LOGS_MAX_BYTES) -> list[str]:
    """Delete the compute logs of the oldest finished runs until all of them
    hold at most max_bytes. Returns the run ids whose compute logs went."""
    if not storage.is_dir():
        return []
    runs = [(folder / "compute_logs", folder.name) for folder in storage.iterdir()
            if (folder / "compute_logs").is_dir()]
    sizes = {run: _size(logs) for logs, run in runs}
    total = sum(sizes.values())
    deleted = []
    for logs, run in sorted(runs, key=lambda entry: entry[0].stat().st_mtime):
        if total <= max_bytes:
            break
        if not _finished(logs):
            continue
        shutil.rmtree(logs, ignore_errors=True)
        total -= sizes[run]
        deleted.append(run)
    return deleted


def fold_idle_wals(runs: Path, idle_s: float = WAL_IDLE_S) -> list[str]:
    """Fold each WAL of a run file that nobody wrote for idle_s into its file
    (a checkpoint; the close of the last connection deletes it). A file that
    another process uses stays as it is. Returns the files folded."""
    folded = []
    now = time.time()
    for wal in sorted(runs.glob("*.db-wal")) if runs.is_dir() else []:
        try:
            stat = wal.stat()
        except FileNotFoundError:
            continue
        if stat.st_size == 0 or now - stat.st_mtime < idle_s:
            continue
        database = wal.with_name(wal.name.removesuffix("-wal"))
        try:
            conn = sqlite3.connect(database, timeout=1)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            continue  # busy or damaged: the next pass tries again
        folded.append(database.name)
    return folded


def keep_logs_small(logs: Path, dagster_home: Path) -> None:
    """One pass over the part logs, the compute logs and the run files' WALs."""
    for path in sorted(logs.glob("*.log")):
        rotate_log(path)
    prune_compute_logs(dagster_home / "storage")
    fold_idle_wals(dagster_home / "history" / "runs")
