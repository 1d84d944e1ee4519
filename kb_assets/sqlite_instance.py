"""Faster SQLite files for the Dagster instance under KB_HOME.

Dagster's SQLite storage opens a new connection for each event that it
writes, and closes it after one transaction. A run of x_sync writes about
80 events, each in the run's own file and most also in index.db. Measured on
this machine (ext4, fsync about 5 ms):

- The close of the last connection to a WAL file checkpoints the WAL and
  deletes it, and the next connection makes it again: fsync of the WAL, of
  the folder and of the database each time. One event cost 30 to 40 ms.
- With `synchronous=NORMAL` and one idle connection that keeps the WAL open,
  the same event costs less than 1 ms.

So the dagster.yaml that kb writes names the three storage classes below
(runs, event log, schedules), and each process that opens the instance does
these things for the SQLite files of its Dagster home:
1. One SQLAlchemy engine per file, with a small pool of connections. Dagster
   makes a new engine for each connection (a new engine compiles each SQL
   statement again: 2.6 ms of CPU against 0.8 ms) and opens a new SQLite
   connection for each statement group. A run of x_sync did that about 470
   times. An idle connection in the pool holds no lock (SQLAlchemy rolls it
   back when it returns to the pool), so other processes still write.
2. Each new connection sets `PRAGMA synchronous=NORMAL`. In WAL mode this
   keeps the file consistent after a crash of the process (SIGKILL) and of the
   machine; a power loss can lose the last transactions, not the file.
   Dagster's run monitoring finds such a run (its worker is gone) and fails it.
3. A new file goes to WAL mode at its first connection (Dagster switches
   only after it made the tables, with fsyncs for each table).
4. The first connection to a WAL file also opens a "keeper" connection that
   is never used again. While it is open, no close is the last one, so the
   WAL stays. It holds no transaction, so checkpoints still run.
5. Dagster checks the schema version of each file (its migrations) with a
   new parse of its about 60 migration scripts: 85 ms of CPU each time, four
   times per process and twice more for each new file. kb parses them once
   per process. A new file (a run's file, index.db, runs.db, schedules.db)
   gets its tables and its version stamp directly, and then the data
   migrations that Dagster's from_local() runs on a new file; any other case
   goes through Dagster's own code. A new Dagster home (a first start, and
   each test) cost 216 ms of CPU with Dagster's code, 76 ms so (6 December
   2026); tests/test_sqlite_instance.py compares the files with Dagster's.

PostgreSQL storage (KB_DAGSTER_POSTGRES_URL) is not touched.

Why kb keeps these classes (issue 50 asked to remove them unless they save
more than 10% of a sync of 1,500 bookmarks): benchmarks/bench_sync.py
`--dagster-storage kb|dagster`, hash embedder, two runs of each, in turn.
A sync with nothing new took 0.5 to 0.6 s of CPU with them and 1.2 s with
Dagster's own storage (wall 0.9 to 1.2 s against 2.8 to 3.8 s); the import
of all 1,500 took 1.3 s of CPU against 2.0 s. That is about 35% of the
import and more than half of each later sync. With the local model the
import is mostly embedding: there they save 3% of it, and 47% of the CPU
of each later sync. benchmarks/index_and_retrieval.md
("Issue 50: kb's SQLite storage against Dagster's") has the table.

The classes override private methods of Dagster's SQLite storages
(`_connect`, `_initdb`, `connect`, `from_local`); the bases come through
kb_assets/dagster_internals.py. tests/test_dagster_internals.py checks those
names, and tests/test_sqlite_instance.py checks the classes, against the
Dagster that is installed.
"""

from __future__ import annotations

import atexit
import functools
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from cachetools import LRUCache

from kb_assets import dagster_internals
from kb_assets.dagster_internals import (
    ALEMBIC_SCRIPTS_LOCATION,
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    DagsterEventLog,
    DagsterRunStorage,
    DagsterScheduleStorage,
    SqlEventLogStorageMetadata,
    create_db_conn_string,
)

# The engines of the files used last, and the keepers of the files opened
# last (a connection to a file that has its keeper does not touch the list:
# one PRAGMA less per connection). A run writes its own file, so the oldest
# keepers close: a long-lived process keeps no file of old runs open. A hot
# file (index.db) whose keeper closes gets a new one at its next connection.
MAX_KEEPERS = 16
MAX_ENGINES = 16

_lock = threading.Lock()
class _Keepers(LRUCache):
    """At most MAX_KEEPERS open connections; the one used least recently
    closes when a new one comes."""

    def popitem(self):
        path, keeper = super().popitem()
        keeper.close()
        return path, keeper


_keepers: _Keepers = _Keepers(maxsize=MAX_KEEPERS)
_installed = False
# Keepers that a forked child got from its parent. The child must not close
# them: SQLite's close of a copied connection can act on the parent's file.
_inherited: list[sqlite3.Connection] = []


def speed_up_sqlite_storage() -> None:
    """Install the connect hook once per process (see the module text)."""
    global _installed
    with _lock:
        if _installed:
            return
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "connect", _on_connect)
        os.register_at_fork(after_in_child=_forget_keepers_in_child)
        atexit.register(close_connections)
        _installed = True


def close_connections() -> None:
    """Close this process's connections to the files of the Dagster home (at
    its exit). The close of the last connection to a WAL file checkpoints
    the WAL into the file and deletes it. Without it, every run's file kept
    its WAL (2 to 3 MB) after the run: the month of issue 55 (tests/month.py)
    saw KB_HOME grow by 2.3 MB for each run."""
    with _lock:
        for engine in list(_engines.values()):
            engine.dispose()
        _engines.clear()
        for keeper in list(_keepers.values()):
            try:
                keeper.close()
            except sqlite3.Error:
                pass
        _keepers.clear()


def _on_connect(dbapi_connection, _connection_record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    path = _main_file(dbapi_connection)
    if not path or not _in_dagster_home(path):
        return
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")
    if path in _keepers:
        return
    mode = dbapi_connection.execute("PRAGMA journal_mode").fetchone()
    if not mode or mode[0].lower() != "wal":
        # Dagster puts each of its files in WAL mode, but only after it made
        # the tables: about 20 statements, each a commit in rollback-journal
        # mode with three fsyncs (the journal, the file, the folder). That
        # was 66 of the 76 fsyncs of a sync with nothing new. WAL first makes
        # them cheap; Dagster's own switch to WAL is then a no-op.
        try:
            mode = dbapi_connection.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError:  # another process holds the file: its next connection does it
            return
    if mode and mode[0].lower() == "wal":
        _keep_open(path)


def _main_file(connection: sqlite3.Connection) -> str:
    for _seq, name, file in connection.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return file or ""
    return ""


def _in_dagster_home(path: str) -> bool:
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return False
    return _real(path).startswith(_real(home) + os.sep)


@functools.lru_cache(maxsize=256)
def _real(path: str) -> str:
    # realpath costs a system call per part of the path, and a run connects
    # about 500 times to a handful of files.
    return os.path.realpath(path)


def _keep_open(path: str) -> None:
    with _lock:
        if _keepers.get(path) is not None:  # get() marks it as used
            return
        keeper = sqlite3.connect(path, check_same_thread=False)
        # A read of the schema opens the WAL and its index: a connection that
        # has read nothing does not count as open to the WAL.
        keeper.execute("SELECT count(*) FROM sqlite_master").fetchall()
        _keepers[path] = keeper


def _forget_keepers_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_keepers.values())
    _keepers.clear()
    # The pools hold the parent's connections: drop them without a close
    # (SQLAlchemy's rule for a forked process); the child opens its own.
    for engine in _engines.values():
        engine.dispose(close=False)
    _engines.clear()


class SqliteEventLogStorage(DagsterEventLog):
    """Dagster's SQLite event log (one file per run, and index.db), with one
    engine per file. The files and their tables are Dagster's own: a Dagster
    home made without kb reads the same."""

    def __init__(self, base_dir: str | None = None, inst_data: dg.ConfigurableClassData | None = None):
        speed_up_sqlite_storage()
        super().__init__(base_dir or default_event_log_dir(), inst_data=inst_data)

    @classmethod
    def config_type(cls):
        return {"base_dir": dg.Field(dg.StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def _connect(self, shard: str) -> Iterator:
        # As Dagster's _connect, but with the engine of the file kept.
        with self._db_lock:
            engine = kept_engine(self.conn_string_for_shard(shard))
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn:
                with conn.begin():
                    yield conn

    def _initdb(self, engine, for_index_shard: bool = False) -> None:
        if _at_head(engine):
            return
        if _made_at_head(engine, SqlEventLogStorageMetadata):
            return  # a new file: a run's file or index.db (whose __init__ then marks its indexes)
        super()._initdb(engine, for_index_shard=for_index_shard)

    def has_table(self, table_name: str) -> bool:
        # Dagster asks this before each look-up of a dynamic partition (56
        # times in a run of x_sync), with a new engine each time. A table
        # that exists stays.
        conn_string = self.conn_string_for_shard(INDEX_SHARD_NAME)
        if (conn_string, table_name) in _tables_seen:
            return True
        engine = kept_engine(conn_string)
        with engine.connect() as conn:
            found = bool(engine.dialect.has_table(conn, table_name))
        if found:
            _tables_seen.add((conn_string, table_name))
        return found

    def dispose(self) -> None:
        with self._db_lock:
            for shard in self._initialized_dbs:
                forget_engine(self.conn_string_for_shard(shard))
        super().dispose()


class _OneFileStorage:
    """What kb's run and schedule storage share: one SQLite file in the
    Dagster home, its engine kept. FILE: the file's name without ".db";
    FOLDER: its folder under DAGSTER_HOME (Dagster's default); TABLES: the
    tables that Dagster's from_local() makes."""

    FILE: str
    FOLDER: tuple[str, ...]
    TABLES: tuple[str, ...]
    METADATA: str  # the name of the tables' SQLAlchemy metadata in kb_assets.dagster_internals

    def __init__(self, conn_string: str, inst_data: dg.ConfigurableClassData | None = None):
        speed_up_sqlite_storage()
        super().__init__(conn_string, inst_data)

    @classmethod
    def config_type(cls):
        return {"base_dir": dg.Field(dg.StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        # Dagster's from_config_value names its own class: call ours.
        base_dir = config_value.get("base_dir") or os.path.join(_dagster_home(), *cls.FOLDER)
        return cls.from_local(base_dir, inst_data=inst_data)

    @classmethod
    def from_local(cls, base_dir: str, inst_data: dg.ConfigurableClassData | None = None):
        speed_up_sqlite_storage()
        conn_string = create_db_conn_string(base_dir, cls.FILE)
        if _file_ready(conn_string, *cls.TABLES):
            return cls(conn_string, inst_data)
        os.makedirs(base_dir, exist_ok=True)
        if _made_at_head(kept_engine(conn_string), getattr(dagster_internals, cls.METADATA)):
            # What Dagster's from_local() does after it made a new file: the
            # data migrations mark the new, empty tables as migrated.
            storage = cls(conn_string, inst_data)
            storage.migrate()
            storage.optimize()
            return storage
        return super().from_local(base_dir, inst_data=inst_data)  # an older file: Dagster's own checks

    @contextmanager
    def connect(self) -> Iterator:
        with kept_engine(self._conn_string).connect() as conn:
            with conn.begin():
                yield conn

    def dispose(self) -> None:
        forget_engine(self._conn_string)
        super().dispose()


class SqliteRunStorage(_OneFileStorage, DagsterRunStorage):
    """Dagster's SQLite run storage (history/runs.db), with the engine kept."""

    FILE, FOLDER, TABLES = "runs", ("history", ""), ("runs", "instance_info")
    METADATA = "RunStorageSqlMetadata"


class SqliteScheduleStorage(_OneFileStorage, DagsterScheduleStorage):
    """Dagster's SQLite schedule storage (schedules/schedules.db), with the
    engine kept."""

    FILE, FOLDER, TABLES = "schedules", ("schedules",), ("job_ticks",)
    METADATA = "ScheduleStorageSqlMetadata"


# --- engines, and Dagster's schema version ------------------------------------

class _Engines(LRUCache):
    """At most MAX_ENGINES engines; the one used least recently lets its
    idle connections go when a new one comes."""

    def popitem(self):
        conn_string, engine = super().popitem()
        engine.dispose()
        return conn_string, engine


_engines: _Engines = _Engines(maxsize=MAX_ENGINES)
# (file, table) pairs seen to exist: has_table() asks again and again.
_tables_seen: set[tuple[str, str]] = set()


def kept_engine(conn_string: str):
    """The engine of one SQLite file of the Dagster home, made once per
    process. Its pool keeps up to two idle connections (see the module text);
    the engines of the files used least recently close."""
    with _lock:
        engine = _engines.get(conn_string)  # get() marks it as used
        if engine is not None:
            return engine
        from sqlalchemy import create_engine
        from sqlalchemy.pool import QueuePool

        # check_same_thread off: a pooled connection goes to the thread that
        # asks next. The pool gives each connection to one thread at a time.
        engine = create_engine(conn_string, poolclass=QueuePool, pool_size=2, max_overflow=8,
                               connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False})
        _engines[conn_string] = engine
        return engine


def forget_engine(conn_string: str) -> None:
    """Close the idle connections of one file (the storage is disposed)."""
    with _lock:
        engine = _engines.pop(conn_string, None)
    if engine is not None:
        engine.dispose()


@functools.cache
def _migration_scripts():
    """Dagster's migration scripts, parsed once per process. Dagster parses
    them again for each check (85 ms of CPU)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", ALEMBIC_SCRIPTS_LOCATION)
    return ScriptDirectory.from_config(config)


def _stored_revision(connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _at_head(engine) -> bool:
    """The file has Dagster's newest schema version: nothing to make or migrate."""
    with engine.connect() as conn:
        return _stored_revision(conn) == _migration_scripts().get_current_head()


def _made_at_head(engine, metadata) -> bool:
    """Make the tables of a new, empty file and stamp Dagster's newest
    version, as Dagster does for a new file. False when the file is not
    empty or another process made it first: Dagster's own code then checks
    the file.

    The check and the making are one write transaction (BEGIN IMMEDIATE):
    SQLite's Python driver runs CREATE TABLE outside a transaction, so two
    processes on a new home could each make some tables and each stamp a
    version ("more than one head present", CI, December 2026). A second
    process waits for the lock (the busy timeout), then finds the tables."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import exc

    try:
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            implicit = driver.isolation_level
            driver.isolation_level = None  # kb opens and ends the transaction itself
            try:
                driver.execute("BEGIN IMMEDIATE")
                if driver.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1").fetchone():
                    driver.execute("ROLLBACK")
                    return False
                metadata.create_all(conn)
                MigrationContext.configure(conn).stamp(_migration_scripts(), "head")
                driver.execute("COMMIT")
            finally:
                if driver.in_transaction:
                    driver.execute("ROLLBACK")
                driver.isolation_level = implicit
    except (exc.DatabaseError, sqlite3.DatabaseError):
        return False
    return True


def _file_ready(conn_string: str, *tables: str) -> bool:
    """The file exists, has Dagster's newest version and these tables. Then
    Dagster's from_local() would only check, so kb skips it."""
    path = conn_string.removeprefix("sqlite:///")
    if not os.path.exists(path):
        return False
    engine = kept_engine(conn_string)
    if not _at_head(engine):
        return False
    with engine.connect() as conn:
        names = {row[0] for row in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return set(tables) <= names


def _dagster_home() -> str:
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        raise dg.DagsterInvariantViolationError(
            "DAGSTER_HOME is not set: kb's SQLite storage keeps its files in $DAGSTER_HOME")
    return home


def default_event_log_dir() -> str:
    """Where Dagster keeps the SQLite event log of the instance in
    DAGSTER_HOME (as its default storage does): history/runs."""
    return os.path.join(_dagster_home(), "history", "runs", "")
