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

So the dagster.yaml that kb writes names SqliteEventLogStorage below, and
each process that opens the instance does four things for the SQLite files
of its Dagster home:
1. The event log keeps one SQLAlchemy engine per file. Dagster makes a new
   engine for each event, and a new engine compiles each SQL statement
   again: 2.6 ms of CPU for each connection, against 0.8 ms with one engine.
   A run of x_sync opens about 800 connections.
2. Each new connection sets `PRAGMA synchronous=NORMAL`. In WAL mode this
   keeps the file consistent after a crash of the process (SIGKILL) and of the
   machine; a power loss can lose the last transactions, not the file.
   Dagster's run monitoring finds such a run (its worker is gone) and fails it.
3. A new file goes to WAL mode at its first connection (Dagster switches
   only after it made the tables, with fsyncs for each table).
4. The first connection to a WAL file also opens a "keeper" connection that
   is never used again. While it is open, no close is the last one, so the
   WAL stays. It holds no transaction, so checkpoints still run.

PostgreSQL storage (KB_DAGSTER_POSTGRES_URL) is not touched.

The class overrides `_connect` of Dagster's SqliteEventLogStorage, a private
method. pyproject.toml pins Dagster to one version;
tests/test_sqlite_instance.py checks the class against it.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage as DagsterEventLog

# The engines of the files used last, and the keepers of the files opened
# last (a connection to a file that has its keeper does not touch the list:
# one PRAGMA less per connection). A run writes its own file, so the oldest
# keepers close: a long-lived process keeps no file of old runs open. A hot
# file (index.db) whose keeper closes gets a new one at its next connection.
MAX_KEEPERS = 16
MAX_ENGINES = 16

_lock = threading.Lock()
_keepers: OrderedDict[str, sqlite3.Connection] = OrderedDict()
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
        _installed = True


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
        if path in _keepers:
            _keepers.move_to_end(path)
            return
        keeper = sqlite3.connect(path, check_same_thread=False)
        # A read of the schema opens the WAL and its index: a connection that
        # has read nothing does not count as open to the WAL.
        keeper.execute("SELECT count(*) FROM sqlite_master").fetchall()
        _keepers[path] = keeper
        while len(_keepers) > MAX_KEEPERS:
            _keepers.popitem(last=False)[1].close()


def _forget_keepers_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_keepers.values())
    _keepers.clear()


class SqliteEventLogStorage(DagsterEventLog):
    """Dagster's SQLite event log (one file per run, and index.db), with one
    engine per file. The files and their tables are Dagster's own: a Dagster
    home made without kb reads the same."""

    def __init__(self, base_dir: str | None = None, inst_data: dg.ConfigurableClassData | None = None):
        speed_up_sqlite_storage()
        self._engines: OrderedDict[str, object] = OrderedDict()
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
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn:
                with conn.begin():
                    yield conn

    def _engine(self, shard: str):
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        # NullPool as in Dagster: no connection stays open between uses, so
        # other processes can write the file. The keeper holds the WAL open.
        engine = create_engine(self.conn_string_for_shard(shard), poolclass=NullPool,
                               connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        self._engines[shard] = engine
        while len(self._engines) > MAX_ENGINES:
            self._engines.popitem(last=False)[1].dispose()
        return engine

    def dispose(self) -> None:
        with self._db_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()
        super().dispose()


def default_event_log_dir() -> str:
    """Where Dagster keeps the SQLite event log of the instance in
    DAGSTER_HOME (as its default storage does): history/runs."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        raise dg.DagsterInvariantViolationError(
            "DAGSTER_HOME is not set: kb's event log storage keeps its files in $DAGSTER_HOME/history/runs")
    return os.path.join(home, "history", "runs", "")
