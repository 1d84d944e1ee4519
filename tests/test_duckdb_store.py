"""The DuckDB store's connections (kb/duckdb_store.py): each connect()
attaches the file to one in-memory DuckDB of the process and detaches it at
the end, so the file lock lasts only as long as the `with` block."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from kb.duckdb_store import DuckDBStore

OTHER_PROCESS = textwrap.dedent("""
    import sys, duckdb
    try:
        conn = duckdb.connect(sys.argv[1])
    except duckdb.IOException as exc:
        print("locked" if "lock" in str(exc).lower() else f"error: {exc}")
    else:
        conn.execute("INSERT INTO notes VALUES ('from the other process')")
        conn.close()
        print("written")
""")


def _other_process_writes(path) -> str:
    done = subprocess.run([sys.executable, "-c", OTHER_PROCESS, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_file_lock_lasts_only_as_long_as_the_with_block(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    with store.connect() as conn:
        conn.execute("CREATE TABLE notes (text VARCHAR)")
        assert _other_process_writes(store.db_path()) == "locked"
    assert _other_process_writes(store.db_path()) == "written"
    with store.connect() as conn:
        assert conn.execute("SELECT text FROM notes").fetchall() == [("from the other process",)]


def test_nested_connections_to_one_file_share_it_and_release_it_at_the_end(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    with store.transaction() as outer:
        outer.execute("CREATE TABLE notes (text VARCHAR)")
        outer.execute("INSERT INTO notes VALUES ('outer')")
    with store.connect() as outer:
        with store.connect() as inner:
            inner.execute("INSERT INTO notes VALUES ('inner')")
        # The inner block ended, the outer one still holds the file.
        assert sorted(outer.execute("SELECT text FROM notes").fetchall()) == [("inner",), ("outer",)]
        assert _other_process_writes(store.db_path()) == "locked"
    assert _other_process_writes(store.db_path()) == "written"


def test_two_files_in_one_process_keep_their_own_rows(tmp_path):
    first = DuckDBStore(path=str(tmp_path / "a" / "kb.duckdb"))
    second = DuckDBStore(path=str(tmp_path / "b" / "kb.duckdb"))
    with first.connect() as a, second.connect() as b:
        a.execute("CREATE TABLE notes (text VARCHAR)")
        b.execute("CREATE TABLE notes (text VARCHAR)")
        a.execute("INSERT INTO notes VALUES ('a')")
        b.execute("INSERT INTO notes VALUES ('b')")
    with first.connect() as a:
        assert a.execute("SELECT text FROM notes").fetchall() == [("a",)]
    with second.connect() as b:
        assert b.execute("SELECT text FROM notes").fetchall() == [("b",)]


def test_a_failed_transaction_leaves_no_row_and_no_lock(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    with store.connect() as conn:
        conn.execute("CREATE TABLE notes (text VARCHAR)")
    try:
        with store.transaction() as conn:
            conn.execute("INSERT INTO notes VALUES ('lost')")
            raise RuntimeError("the stage failed")
    except RuntimeError:
        pass
    assert _other_process_writes(store.db_path()) == "written"
    with store.connect() as conn:
        assert conn.execute("SELECT text FROM notes").fetchall() == [("from the other process",)]
