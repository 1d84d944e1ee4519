"""The one door to Dagster's private modules (`dagster._...`).

Every other module of kb uses Dagster's public API (`import dagster as dg`).
tests/test_dagster_internals.py checks that no other module of the product
imports `dagster._`, that this module imports at most 5 private module
paths, and that each name below still exists and acts as kb needs. When a
Dagster release changes one of them, that test fails and names the use and
the reason here. pyproject.toml allows one minor release of Dagster; try a
new one with that test first.

The private module paths, and what each keeps that no public name gives:

1. `dagster._core.launcher`: the health of a run worker
   (`CheckRunHealthResult`, `WorkerStatus`; used by
   kb_assets/run_launcher.py and kb_assets/backups.py), and the argument of
   `launch_run` (`LaunchRunContext`), where kb's launcher refuses a run config. A run launcher
   answers Dagster's run monitoring with these classes; `dagster` does not
   export them. Without the health check, a run whose worker was killed
   stays STARTED and holds its pool slot for ever (tests/test_crash_safety.py).
2. `dagster._core.storage.event_log`, 3. `dagster._core.storage.runs`,
   4. `dagster._core.storage.schedules`: the SQLite storages of the instance
   (kb_assets/sqlite_instance.py subclasses them). kb's classes keep one
   engine and one open WAL per file. benchmarks/index_and_retrieval.md
   ("Issue 50: kb's SQLite storage against Dagster's") gives what they save:
   more than half of the CPU time of a sync with nothing new. The subclasses
   override Dagster's `_connect`, `_initdb`, `connect` and `from_local`.

5. `dagster._core.storage.local_compute_log_manager`: Dagster's local
   compute logs (`LocalComputeLogManager`, and the `CapturedLogContext`
   that its capture yields). kb_assets/compute_logs.py subclasses it to
   capture a step's output with no `tail -F` helper: Dagster's helpers
   outlive a stopped step (issue 55). No public name gives the class.

Values that Dagster keeps in private modules are copied below, not
imported: tests/test_dagster_internals.py compares each copy with Dagster's.

`kb sync` and the other run commands use no private name: they launch runs
through the GraphQL client or `dg.execute_job` (kb/apps/run_paths.py).
"""

from __future__ import annotations

import importlib
import os

from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus

# Names that load on first use: the SQLite storages bring in SQLAlchemy and
# Alembic, which a process on PostgreSQL, or one that opens no instance,
# does not need. {name here: (Dagster's module, Dagster's name)}
LAZY = {
    "DagsterEventLog": ("dagster._core.storage.event_log", "SqliteEventLogStorage"),
    "SqlEventLogStorageMetadata": ("dagster._core.storage.event_log", "SqlEventLogStorageMetadata"),
    "RunStorageSqlMetadata": ("dagster._core.storage.runs", "RunStorageSqlMetadata"),
    "ScheduleStorageSqlMetadata": ("dagster._core.storage.schedules", "ScheduleStorageSqlMetadata"),
    "DagsterRunStorage": ("dagster._core.storage.runs", "SqliteRunStorage"),
    "DagsterScheduleStorage": ("dagster._core.storage.schedules", "SqliteScheduleStorage"),
    "LocalComputeLogManager": ("dagster._core.storage.local_compute_log_manager", "LocalComputeLogManager"),
    "CapturedLogContext": ("dagster._core.storage.local_compute_log_manager", "CapturedLogContext"),
}

# --- copies of values of Dagster's private modules (each compared by a test) --------------
# The tags of a run over a range of partitions (dagster._core.storage.tags):
# Dagster reads them to know the partitions of such a run (kb caption and
# the sensor waiting_photos set and read them).
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"
# The shard of the SQLite event log that holds the index of every run
# (dagster._core.storage.event_log.sqlite.sqlite_event_log): index.db.
INDEX_SHARD_NAME = "index"
# Dagster's busy timeout of its SQLite connections (dagster._core.storage.sqlite).
SQLITE_BUSY_TIMEOUT_SECONDS = 30
# Where Dagster's Alembic migration scripts are (dagster._core.storage.sql).
ALEMBIC_SCRIPTS_LOCATION = "dagster:_core/storage/alembic"


def create_db_conn_string(base_dir: str, db_name: str) -> str:
    """The SQLAlchemy URL of Dagster's SQLite file `db_name`.db in
    `base_dir`, as dagster._core.storage.sqlite.create_db_conn_string makes it."""
    return "sqlite:///" + "/".join([*os.path.abspath(base_dir).split(os.sep), f"{db_name}.db"])


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


__all__ = [
    "ALEMBIC_SCRIPTS_LOCATION", "ASSET_PARTITION_RANGE_END_TAG", "ASSET_PARTITION_RANGE_START_TAG",
    "CapturedLogContext", "CheckRunHealthResult", "DagsterEventLog", "DagsterRunStorage", "DagsterScheduleStorage", "INDEX_SHARD_NAME",
    "LocalComputeLogManager", "RunStorageSqlMetadata", "SQLITE_BUSY_TIMEOUT_SECONDS", "ScheduleStorageSqlMetadata",
    "SqlEventLogStorageMetadata", "WorkerStatus", "create_db_conn_string",
]
