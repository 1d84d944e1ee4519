"""kb's SQLite event log for the Dagster instance (kb_assets/sqlite_instance.py):
Dagster's own files, with the WAL kept open and fewer fsyncs, readable by
plain Dagster and by other processes at the same time."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import dagster as dg
import yaml
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage as DagsterEventLog

from kb.settings import Settings
from kb_assets.instance_config import DAGSTER_YAML, ensure_dagster_home
from kb_assets.sqlite_instance import SqliteEventLogStorage


@dg.asset
def numbers() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"rows": 3})


def _materialize(instance: dg.DagsterInstance) -> str:
    result = dg.materialize([numbers], instance=instance)
    assert result.success
    return result.run_id


def test_the_event_log_is_dagsters_files_with_the_wal_kept_open():
    home = ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    assert type(instance.event_log_storage) is SqliteEventLogStorage
    run_id = _materialize(instance)

    run_file = home / "history" / "runs" / f"{run_id}.db"
    assert run_file.exists()  # Dagster's own place for the run's events
    # The keeper holds the WAL open: without it, the close of the last
    # connection deletes the WAL, and each event makes it again (fsyncs).
    assert (home / "history" / "runs" / f"{run_id}.db-wal").exists()
    with instance.event_log_storage.run_connection(run_id) as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"

    # Plain Dagster reads the same files, and sees every event.
    plain = DagsterEventLog(str(home / "history" / "runs"))
    kinds = {record.event_log_entry.dagster_event_type for record in plain.get_records_for_run(run_id).records}
    assert dg.DagsterEventType.ASSET_MATERIALIZATION in kinds and dg.DagsterEventType.RUN_SUCCESS in kinds
    latest = plain.get_latest_materialization_events([dg.AssetKey("numbers")])[dg.AssetKey("numbers")]
    assert latest.asset_materialization.metadata["rows"].value == 3
    plain.dispose()


def test_another_process_writes_the_same_run_while_the_keepers_are_open():
    ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    run_id = _materialize(instance)
    writer = textwrap.dedent(f"""
        import dagster as dg
        instance = dg.DagsterInstance.get()
        run = instance.get_run_by_id({run_id!r})
        instance.report_engine_event("written by another process", run)
        print(type(instance.event_log_storage).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", writer], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "SqliteEventLogStorage"
    messages = [r.event_log_entry.message for r in instance.get_records_for_run(run_id).records]
    assert "written by another process" in messages
    # This process writes after the other one: no "database is locked".
    instance.report_engine_event("written here again", instance.get_run_by_id(run_id))
    assert instance.get_records_for_run(run_id).records[-1].event_log_entry.message == "written here again"


def test_a_dagster_yaml_of_an_earlier_kb_gets_the_event_log_and_keeps_its_runs(kb_home):
    """A home made before kb had its own event log class: the runs that
    plain Dagster stored there stay, and kb's class reads them."""
    home = kb_home / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    old = dg.DagsterInstance.from_config(str(home))
    assert type(old.event_log_storage) is DagsterEventLog
    run_id = _materialize(old)
    old.dispose()

    ensure_dagster_home(Settings())
    assert yaml.safe_load((home / "dagster.yaml").read_text())["event_log_storage"]["class"] == "SqliteEventLogStorage"
    instance = dg.DagsterInstance.get()
    assert type(instance.event_log_storage) is SqliteEventLogStorage
    assert instance.get_run_by_id(run_id).is_success
    assert instance.get_latest_materialization_event(dg.AssetKey("numbers")).run_id == run_id


def test_files_outside_the_dagster_home_are_not_touched(tmp_path):
    """The connect hook acts only on files in DAGSTER_HOME: another SQLite
    database of the same process keeps SQLite's defaults."""
    ensure_dagster_home(Settings())
    dg.DagsterInstance.get()  # installs the hook
    from sqlalchemy import create_engine

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("PRAGMA journal_mode=WAL").fetchall()
    engine = create_engine(f"sqlite:///{other}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL, SQLite's default
        conn.exec_driver_sql("CREATE TABLE t (x)")
        conn.commit()
    engine.dispose()
    assert not (tmp_path / "other.db-wal").exists()  # no keeper: the last close removed the WAL
