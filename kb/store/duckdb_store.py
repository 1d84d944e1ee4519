"""The DuckDB store: the normalized relational data.

Hard-won rule: while one process holds a read-write connection, no other
process can open the file, not even read-only. So connections are short
(one `with` block), never held across a network or model call; each one
holds the writer lock of the file (kb/store/writer_lock.py), so the processes of
kb take turns, a few seconds each; and the serving side (search, MCP, bot)
never opens this file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
from pydantic import BaseModel

from kb.store.duckdb_schema import MIGRATIONS, SCHEMA_VERSION, TABLES
from kb.store import writer_lock
from kb.settings import Settings, get_settings

# DuckDB's own lock of a file ("Could not set lock on file"): a process
# outside kb (the duckdb shell) holds it, as it takes no writer lock. Such a
# hold is short, so kb waits: 20 tries, 0.25 s more before each next one
# (about 47 s in all), then the error goes to the caller.
LOCK_ATTEMPTS = 20


def file_is_locked(exc: BaseException) -> bool:
    """The error of DuckDB when another process holds the file."""
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


def retry_while_locked(attempts: int = LOCK_ATTEMPTS, before_sleep: Callable[[], None] | None = None):
    """A decorator: call the function again while DuckDB says that another
    process holds the file. Another error, or the last try's error, goes to
    the caller as it is. `before_sleep` runs before each wait."""
    import tenacity  # here: a process that imports this module but opens no file does not pay for it

    return tenacity.retry(retry=tenacity.retry_if_exception(file_is_locked),
                          stop=tenacity.stop_after_attempt(attempts),
                          wait=tenacity.wait_incrementing(start=0.25, increment=0.25),
                          before_sleep=(lambda _state: before_sleep()) if before_sleep else None,
                          reraise=True)


# Each connect() attaches the file to one in-memory DuckDB of the process,
# and detaches it at the end. A new DuckDB instance fills its catalog of
# functions, which costs much more CPU than an ATTACH to a live one, and a
# sync connects many times (the figures: benchmarks/index_and_retrieval.md,
# "DuckDB"). DETACH releases the file lock as close() did,
# so the rule above (short connections) stays. Uses of the same file in one
# process share the attachment (as duckdb.connect shares its instance).
#
# The writer lock (kb/store/writer_lock.py, a file beside the DuckDB file) is held
# from the ATTACH to the DETACH: another process waits for it instead of
# failing on DuckDB's own lock. It replaces the Dagster pool that held one
# slot for a whole step (see the module text of kb/store/writer_lock.py).
_host_lock = threading.Lock()
_attaching = threading.Lock()  # one thread of the process waits for the writer lock
_host: list[duckdb.DuckDBPyConnection] = []
_attached: dict[str, list] = {}  # file -> [alias, users, writer lock fd, attached at]
# Hosts that a forked child got from its parent. The child never uses them:
# a DuckDB instance does not survive a fork (its threads stay behind).
_inherited: list[duckdb.DuckDBPyConnection] = []


def writer_lock_path(path: Path) -> Path:
    """The lock file of the DuckDB file at `path`."""
    return path.with_name(path.name + ".lock")


def _forget_host_in_child() -> None:
    global _host_lock, _attaching
    _host_lock = threading.Lock()
    _attaching = threading.Lock()
    for entry in _attached.values():
        with contextlib.suppress(OSError):
            os.close(entry[2])  # the parent's writer lock: the child must not keep it held
    _inherited.extend(_host)
    _host.clear()
    _attached.clear()


os.register_at_fork(after_in_child=_forget_host_in_child)


def _join(key: str) -> list | None:
    with _host_lock:
        entry = _attached.get(key)
        if entry is not None:
            entry[1] += 1
        return entry


def _attach(key: str) -> list:
    """Join this process's attachment of the file, or take the writer lock and attach it."""
    entry = _join(key)
    if entry is not None:
        return entry
    with _attaching:
        entry = _join(key)
        if entry is not None:
            return entry
        fd = writer_lock.acquire(writer_lock_path(Path(key)), what=f"DuckDB {key}")
        try:
            with _host_lock:
                if not _host:
                    _host.append(duckdb.connect(":memory:"))
                alias = "kb_" + hashlib.sha1(key.encode()).hexdigest()[:16]
                quoted = key.replace("'", "''")
                # A process outside kb (the duckdb shell) takes no writer lock: wait for DuckDB's own.
                retry_while_locked()(_host[0].execute)(f"ATTACH '{quoted}' AS {alias}")
                entry = _attached[key] = [alias, 1, fd, time.monotonic()]
                return entry
        except BaseException:
            writer_lock.release(fd)
            raise


def _detach(key: str, entry: list) -> None:
    with _host_lock:
        entry[1] -= 1
        if entry[1] == 0 and _attached.get(key) is entry:
            del _attached[key]
            try:
                _host[0].execute(f"DETACH {entry[0]}")
            finally:
                writer_lock.release(entry[2])
            writer_lock.note_hold(f"DuckDB {key}", time.monotonic() - entry[3])


@contextlib.contextmanager
def signals_reach_caller(what: str) -> Iterator[None]:
    """Inside the block, a query that a signal stopped reaches the caller as
    KeyboardInterrupt, with DuckDB's error as its cause: Dagster then ends the
    run as interrupted, and its run retry takes it. `what` names the file or
    the work in the message. Used by attached_duckdb() below (every
    connection of the store) and by the backup's copy (kb/backup/archive.py).

    Why: a signal handler that raises during a query (Dagster's run worker
    raises its interrupt error on SIGTERM, Python raises KeyboardInterrupt on
    SIGINT) does not reach the caller: DuckDB (2.0) ends the query and
    raises a plain RuntimeError "Query interrupted" in its place. Dagster then
    saw an error of the asset, not an interruption: the run failed for good
    (STEP_FAILURE, no run retry). Found by the month test of 6 December 2026:
    the SIGKILL of kb up came while parsed_sources committed its row, and the
    source failed instead of its run retry."""
    try:
        yield
    except RuntimeError as exc:
        if type(exc) is RuntimeError and str(exc).startswith("Query interrupted"):
            raise KeyboardInterrupt(f"DuckDB {what}: the query was interrupted by a signal") from exc
        raise


@contextlib.contextmanager
def attached_duckdb(path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection whose default database is the file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    entry = _attach(key)
    try:
        with _host_lock:
            conn = _host[0].cursor()
    except BaseException:
        _detach(key, entry)
        raise
    try:
        with signals_reach_caller(key):
            conn.execute(f"USE {entry[0]}")
            yield conn
    finally:
        conn.close()
        _detach(key, entry)


class SchemaError(RuntimeError):
    """The DuckDB file has a schema version that this kb cannot use."""


def ensure_schema(conn: duckdb.DuckDBPyConnection, *, version: int = SCHEMA_VERSION,
                  migrations: dict[int, tuple[str, ...]] | None = None, tables_known: bool = False) -> list[int]:
    """Create the tables, or bring an older file up to `version` with the
    migrations (see kb.store.duckdb_schema). Returns the versions applied.
    `tables_known`: this process already made sure that the file at this
    version has every table; only the version is read.

    All migrations run in one transaction: when one statement fails, the
    file keeps its old version and every row, and the error names the step.
    """
    migrations = MIGRATIONS if migrations is None else migrations
    conn.execute(TABLES["schema_info"])
    row = conn.execute("SELECT max(version) FROM schema_info").fetchone()
    stored = row[0] if row else None
    if stored == version:
        if tables_known:
            return []
        for ddl in TABLES.values():
            conn.execute(ddl)  # a table that a later release added without a version bump
        return []
    if stored is not None and stored > version:
        raise SchemaError(f"The DuckDB file has schema version {stored}, but this kb knows version "
                          f"{version} only. Update kb, or restore a backup made by this version.")
    steps = [] if stored is None else list(range(stored + 1, version + 1))
    missing = [step for step in steps if step not in migrations]
    if missing:
        raise SchemaError(f"No migration to schema version {missing[0]} (the file has version {stored}). "
                          "Add it to MIGRATIONS in kb/store/duckdb_schema.py.")
    conn.execute("BEGIN")
    try:
        for step in steps:
            for statement in migrations[step]:
                try:
                    conn.execute(statement)
                except duckdb.Error as exc:
                    raise SchemaError(f"Migration to schema version {step} failed at {statement!r}: {exc}. "
                                      f"The file keeps version {stored} and all its rows.") from exc
        for ddl in TABLES.values():
            conn.execute(ddl)
        conn.execute("DELETE FROM schema_info")
        conn.execute("INSERT INTO schema_info VALUES (?)", [version])
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return steps


def insert_rows(conn: duckdb.DuckDBPyConnection, table: str, rows: list[dict]) -> None:
    """Insert dict rows through Arrow: far faster than executemany."""
    if not rows:
        return
    conn.register("incoming_rows", pa.Table.from_pylist(rows))
    try:
        columns = ", ".join(rows[0])
        conn.execute(f"INSERT OR REPLACE INTO {table} ({columns}) SELECT {columns} FROM incoming_rows")
    finally:
        conn.unregister("incoming_rows")


# The files (device, inode) for which this process ran every CREATE TABLE IF
# NOT EXISTS. Each stage of a sync connects once or more, and the
# statements took a large part of each connection's time
# (benchmarks/figures_from_comments.md).
_TABLES_CHECKED: set[tuple[int, int]] = set()


def _file_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_dev, stat.st_ino


class DuckDBStore(BaseModel):
    """Short-lived connections to the kb DuckDB file."""

    path: str

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> DuckDBStore:
        settings = settings or get_settings()
        return cls(**{"path": str(settings.duckdb_path), **overrides})

    def db_path(self) -> Path:
        return Path(self.path)

    @contextlib.contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        path = self.db_path()
        with attached_duckdb(path) as conn:
            key = _file_key(path)
            ensure_schema(conn, tables_known=key in _TABLES_CHECKED)
            _TABLES_CHECKED.add(key)
            yield conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One connection, one transaction: all of it lands or none of it."""
        with self.connect() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
