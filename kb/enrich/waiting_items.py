"""What the enrichment stages (captions, transcripts, translations) share
in DuckDB: the items that wait for a result, and the writer of the results.

Each stage reads the items that wait, closes DuckDB, lets a model work,
and writes the results in groups. The rules behind that:
- A failed item is tried again only on request (`retry`): a failure that
  comes back on every run would hide the items that wait.
- No connection is open while the model works: a connection holds the
  writer lock of the file (kb/store/writer_lock.py), and other runs wait for it.
  Each group of results goes in its own short transaction, so an
  interrupted run keeps what it wrote and the next run goes on from there.
"""

from __future__ import annotations

import duckdb

from kb.store.duckdb_store import DuckDBStore, insert_rows


def waiting_rows(conn: duckdb.DuckDBPyConnection, items_sql: str, columns: str,
                 batches: list[str] | None, *, retry: bool) -> list[tuple]:
    """`columns` of the items in `items_sql` with no result yet (and the
    failed ones when `retry`), of the given batches (None: of every batch),
    in batch order. `items_sql` gives the columns batch, url, status and
    attempts."""
    return conn.execute(
        f"""SELECT {columns} FROM ({items_sql})
            WHERE (status IS NULL OR (status = 'failed' AND ?))
              AND (? OR list_contains(?, batch))
            ORDER BY batch, url""",
        [retry, batches is None, batches or []],
    ).fetchall()


class ResultWriter:
    """Collects result rows and inserts them into `table`, `every` rows per
    short transaction. Use it in a `with` block: on exit it writes the rest,
    also when the model stopped with an error."""

    def __init__(self, duckdb: DuckDBStore, table: str, every: int):
        self.duckdb = duckdb
        self.table = table
        self.every = every
        self.pending: list[dict] = []
        self.written: list[dict] = []

    def add(self, row: dict) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.every:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            with self.duckdb.transaction() as conn:
                insert_rows(conn, self.table, self.pending)
            self.written.extend(self.pending)
            self.pending.clear()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.flush()
