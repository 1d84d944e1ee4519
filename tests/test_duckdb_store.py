"""The DuckDB store's connections (kb/store/duckdb_store.py): each connect()
attaches the file to one in-memory DuckDB of the process and detaches it at
the end, so the file lock lasts only as long as the `with` block."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from unittest import mock

import duckdb
import pytest

from kb.backup.archive import BackupError, backup_duckdb
from kb.store.duckdb_store import DuckDBStore, file_is_locked, retry_while_locked

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



# --- a signal in the middle of a query -------------------------------------------------
# Dagster's run worker raises its interrupt error on SIGTERM (the lifeline of
# a killed kb up sends it); DuckDB turns any error of a signal handler into a
# plain RuntimeError "Query interrupted". The store gives the interruption back.

LONG_QUERY = "SELECT count(*) FROM range(3000000000)"  # reads only (an insert fills the disk), and DuckDB checks for a signal in it


@contextlib.contextmanager
def interrupt_in(seconds: float):
    """SIGUSR1 to this process after `seconds`; its handler raises as Dagster's
    does. Not SIGALRM: pytest-timeout uses it."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt("the signal of the test")
    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def test_a_signal_during_a_query_reaches_the_caller_as_an_interruption(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    with store.connect() as conn:
        conn.execute("CREATE TABLE notes (text VARCHAR)")
    with pytest.raises(KeyboardInterrupt) as raised, store.transaction() as conn, interrupt_in(0.3):
        conn.execute(LONG_QUERY)
    # The signal came while DuckDB ran the query, not in Python between two calls.
    assert str(raised.value.__cause__) == "Query interrupted"
    assert _other_process_writes(store.db_path()) == "written"  # rolled back, no lock held


def test_a_signal_during_the_backups_copy_reaches_the_caller_as_an_interruption(tmp_path):
    """The backup copies the DuckDB file with its own connection (not
    attached_duckdb): kb up stopped during the nightly backup must end the
    backup's run as interrupted too."""
    source = tmp_path / "kb.duckdb"
    conn = duckdb.connect(str(source))
    conn.execute("CREATE TABLE numbers AS SELECT range AS n FROM range(30000000)")  # its copy takes about 0.4 s
    conn.close()
    with pytest.raises(KeyboardInterrupt) as raised, interrupt_in(0.1):
        backup_duckdb(source, tmp_path / "copy.duckdb")
    assert str(raised.value.__cause__) == "Query interrupted"  # the signal came in the copy


def test_a_run_that_a_signal_stops_in_a_query_ends_as_an_interruption_that_run_retries_take(tmp_path):
    """A step error (STEP_FAILURE) is final for kb's runs (no run retry on a
    step's failure); an interrupted run is not (UNEXPECTED_TERMINATION)."""
    import dagster as dg

    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    with store.connect() as conn:
        conn.execute("CREATE TABLE notes (text VARCHAR)")

    @dg.asset
    def notes() -> None:
        with store.transaction() as conn, interrupt_in(0.3):
            conn.execute(LONG_QUERY)

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([notes], instance=instance, raise_on_error=False)
        run = instance.get_run_by_id(result.run_id)
    assert not result.success
    assert run.tags.get("dagster/failure_reason") == "UNEXPECTED_TERMINATION", run.tags


# --- DuckDB's own lock: a process outside kb holds the file ------------------------

HOLDER = textwrap.dedent("""
    import sys, duckdb
    conn = duckdb.connect(sys.argv[1])
    conn.execute("CREATE TABLE IF NOT EXISTS notes (text VARCHAR)")
    conn.execute("INSERT INTO notes VALUES ('from the holder')")
    print("held", flush=True)
    sys.stdin.readline()  # hold the file until the test writes a line
    conn.close()
""")


def _hold(path):
    """A process outside kb (as the duckdb shell) that holds the file:
    it takes no writer lock of kb."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _release(holder) -> None:
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(timeout=60) == 0


def test_connect_waits_while_a_process_outside_kb_holds_the_file(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    holder = _hold(store.db_path())
    tries = []
    release = threading.Timer(0.3, _release, [holder])

    def counted(exc):
        tries.append(exc)
        return file_is_locked(exc)

    release.start()
    try:
        with mock.patch("kb.store.duckdb_store.file_is_locked", counted), store.connect() as conn:
            assert conn.execute("SELECT text FROM notes").fetchall() == [("from the holder",)]
    finally:
        release.join()
    assert tries and all(file_is_locked(exc) for exc in tries)  # it failed on the lock, waited, and got in


def test_only_the_lock_error_is_tried_again_and_the_last_one_reaches_the_caller():
    calls = []

    @retry_while_locked(attempts=3)
    def locked():
        calls.append("locked")
        raise duckdb.IOException('IO Error: Could not set lock on file "kb.duckdb": Conflicting lock is held')

    @retry_while_locked(attempts=3)
    def broken():
        calls.append("broken")
        raise duckdb.IOException("IO Error: The file is not a valid DuckDB database file")

    with pytest.raises(duckdb.IOException, match="Could not set lock"):
        locked()
    with pytest.raises(duckdb.IOException, match="not a valid DuckDB"):
        broken()
    assert calls == ["locked"] * 3 + ["broken"]


def test_a_backup_waits_for_the_holder_and_names_the_file_when_it_gives_up(tmp_path):
    source, target = tmp_path / "kb.duckdb", tmp_path / "copy.duckdb"
    holder = _hold(source)
    try:
        with pytest.raises(BackupError, match=r"Cannot read .*kb.duckdb: .*lock.* Another process writes it"):
            backup_duckdb(source, target, attempts=2)
    finally:
        release = threading.Timer(0.3, _release, [holder])
        release.start()
    # The holder ends during the waits: the backup then copies the file.
    assert backup_duckdb(source, target) == {"notes": 1}
    release.join()
