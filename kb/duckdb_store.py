"""The DuckDB store: the normalized relational data.

Hard-won rule: while one process holds a read-write connection, no other
process can open the file, not even read-only. So connections are short
(one `with` block), never held across a network or model call, every asset
that writes is in the Dagster pool `duckdb` (size one), and the serving side
(search, MCP, bot) never opens this file.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
from pydantic import BaseModel

from kb.duckdb_schema import ADDED_COLUMNS, SCHEMA_VERSION, TABLES
from kb.settings import Settings, get_settings

DUCKDB_POOL = "duckdb"


def open_duckdb(path: Path, *, attempts: int = 20) -> duckdb.DuckDBPyConnection:
    """Open the file; wait a short time when another process holds the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(attempts):
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or attempt == attempts - 1:
                raise
            time.sleep(0.25 * (attempt + 1))
    raise AssertionError("unreachable")


def ensure_schema(conn: duckdb.DuckDBPyConnection) -> bool:
    """Create the tables. Returns True when an old schema was dropped, so the
    caller knows that the normalized data must be rebuilt from raw files."""
    conn.execute(TABLES["schema_info"])
    row = conn.execute("SELECT max(version) FROM schema_info").fetchone()
    dropped = False
    if row and row[0] is not None and row[0] != SCHEMA_VERSION:
        for name in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(TABLES["schema_info"])
        dropped = True
    for name, ddl in TABLES.items():
        conn.execute(ddl)
    for table, column, kind in ADDED_COLUMNS:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")
    conn.execute("DELETE FROM schema_info")
    conn.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
    return dropped


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
        conn = open_duckdb(self.db_path())
        try:
            ensure_schema(conn)
            yield conn
        finally:
            conn.close()

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
