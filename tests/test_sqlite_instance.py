"""kb's SQLite storage for the Dagster instance (kb_assets/sqlite_instance.py):
Dagster's own files, with the engines and the WAL kept open and fewer
fsyncs, readable by plain Dagster and by other processes at the same time."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import dagster as dg
import pytest
import yaml
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage as DagsterEventLog
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage as DagsterRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import (
    SqliteScheduleStorage as DagsterScheduleStorage,
)

from kb.settings import Settings
from kb_assets.instance_config import DAGSTER_YAML, ensure_dagster_home
from kb_assets.sqlite_instance import SqliteEventLogStorage, SqliteRunStorage, SqliteScheduleStorage, kept_engine


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_process_that_ends_leaves_no_wal_of_its_runs(kb_home):
    """A run worker writes its run's file and ends. The WAL of that file goes
    into the file at the exit: it does not stay as 2 to 3 MB per run in
    KB_HOME (found by the month of issue 55)."""
    home = ensure_dagster_home(Settings())
    worker = textwrap.dedent("""
        import dagster as dg

        @dg.asset
        def numbers() -> None:
            pass

        with dg.DagsterInstance.get() as instance:
            print(dg.materialize([numbers], instance=instance).run_id)
    """)
    done = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    run_file = home / "history" / "runs" / f"{done.stdout.split()[-1]}.db"
    assert run_file.is_file()
    assert not run_file.with_name(run_file.name + "-wal").exists()
    with sqlite3.connect(run_file) as conn:  # the events are in the file itself
        assert conn.execute("SELECT count(*) FROM event_logs").fetchone()[0] > 3


@pytest.mark.slow
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


def test_the_run_queue_interval_setting_reaches_the_daemons_coordinator(kb_home, monkeypatch):
    """KB_RUN_QUEUE_INTERVAL_S sets how often the daemon looks at the run
    queue. The default is Dagster's own: the file then has no coordinator
    section. A change of the setting writes kb's own file again."""
    config = ensure_dagster_home(Settings()) / "dagster.yaml"
    assert "run_coordinator" not in yaml.safe_load(config.read_text())
    with dg.DagsterInstance.from_config(str(config.parent)) as instance:
        assert instance.run_coordinator.dequeue_interval_seconds == 5

    monkeypatch.setenv("KB_RUN_QUEUE_INTERVAL_S", "1")
    ensure_dagster_home(Settings())
    coordinator = yaml.safe_load(config.read_text())["run_coordinator"]
    assert coordinator["config"] == {"dequeue_interval_seconds": 1}
    with dg.DagsterInstance.from_config(str(config.parent)) as instance:
        assert type(instance.run_coordinator) is dg.QueuedRunCoordinator
        assert instance.run_coordinator.dequeue_interval_seconds == 1
        assert type(instance.event_log_storage) is SqliteEventLogStorage  # the storage stays kb's


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


def _schema(path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return sorted(rows, key=str) + [("alembic_version", str(version))]


def _contents(path) -> dict[str, object]:
    """The rows of a file that a new Dagster home holds: the count of each
    table, and the names of the data migrations marked as done."""
    with sqlite3.connect(path) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        contents: dict[str, object] = {table: conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
                                       for table in tables}
        if "secondary_indexes" in tables:
            contents["migrations done"] = sorted(row[0] for row in conn.execute(
                "SELECT name FROM secondary_indexes WHERE migration_completed IS NOT NULL"))
    return contents


def test_a_new_dagster_home_made_by_kb_holds_the_files_that_dagster_makes(tmp_path):
    """kb makes the new runs.db, schedules.db and index.db itself, as it
    makes a run's file (a new home cost 216 ms of CPU with Dagster's code,
    76 ms so). Each file must be the one that Dagster's own code makes: the
    same tables, version and data migrations marked as done."""
    home = ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    assert instance.get_runs() == [] and instance.all_instigator_state() == []
    plain = tmp_path / "plain"
    DagsterRunStorage.from_local(str(plain / "history")).dispose()
    DagsterScheduleStorage.from_local(str(plain / "schedules")).dispose()
    DagsterEventLog(str(plain / "history" / "runs")).dispose()
    for part in ("history/runs.db", "schedules/schedules.db", "history/runs/index.db"):
        made_by_kb, made_by_dagster = home / part, plain / part
        assert _schema(made_by_kb) == _schema(made_by_dagster), part
        assert _contents(made_by_kb) == _contents(made_by_dagster), part
    assert _contents(home / "history" / "runs.db")["migrations done"]  # the test compares marks


def test_two_makers_of_one_new_file_stamp_one_version(tmp_path):
    """Two processes open a new Dagster home at once. The first makes the
    file; the second waits for its write, finds the tables and leaves the
    file to Dagster's checks. The file holds one version, not two heads."""
    import threading
    import time

    from sqlalchemy import create_engine

    from kb_assets.dagster_internals import RunStorageSqlMetadata
    from kb_assets.sqlite_instance import _made_at_head

    inside = threading.Event()

    class SlowMaker:  # the first maker pauses between its check and its tables
        def create_all(self, conn):
            inside.set()
            time.sleep(0.5)
            RunStorageSqlMetadata.create_all(conn)

    path = tmp_path / "runs.db"
    engines = [create_engine(f"sqlite:///{path}", connect_args={"timeout": 30}) for _ in range(2)]
    made: list[bool] = []
    first = threading.Thread(target=lambda: made.append(_made_at_head(engines[0], SlowMaker())))
    first.start()
    assert inside.wait(10)
    second = _made_at_head(engines[1], RunStorageSqlMetadata)
    first.join(10)
    assert made == [True] and second is False
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
    for engine in engines:
        engine.dispose()


@pytest.mark.slow
def test_a_new_run_file_made_by_kb_equals_the_one_that_dagster_makes(tmp_path):
    """kb makes the tables of a new run's file and stamps the version itself
    (no parse of Dagster's migration scripts per run). The file must be the
    one that Dagster's own code makes."""
    home = ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    run_id = _materialize(instance)
    plain = DagsterEventLog(str(tmp_path / "plain"))
    with plain.run_connection(run_id):
        pass  # Dagster's own _initdb makes the file
    plain.dispose()
    assert _schema(home / "history" / "runs" / f"{run_id}.db") == _schema(tmp_path / "plain" / f"{run_id}.db")


def test_runs_and_schedules_are_dagsters_files_read_by_plain_dagster():
    home = ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    assert type(instance.run_storage) is SqliteRunStorage
    assert type(instance.schedule_storage) is SqliteScheduleStorage
    run_id = _materialize(instance)
    instance.add_run_tags(run_id, {"kb/checked": "yes"})

    plain = DagsterRunStorage.from_local(str(home / "history"))
    assert plain.get_run_records(dg.RunsFilter(run_ids=[run_id]))[0].dagster_run.tags["kb/checked"] == "yes"
    plain.dispose()
    assert (home / "schedules" / "schedules.db").exists()
    plain_schedules = DagsterScheduleStorage.from_local(str(home / "schedules"))
    assert plain_schedules.all_instigator_state() == []
    plain_schedules.dispose()


@pytest.mark.slow
def test_another_process_changes_a_run_while_this_one_keeps_its_connections():
    ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    run_id = _materialize(instance)
    writer = textwrap.dedent(f"""
        import dagster as dg
        instance = dg.DagsterInstance.get()
        instance.add_run_tags({run_id!r}, {{"kb/from": "other process"}})
    """)
    done = subprocess.run([sys.executable, "-c", writer], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert instance.get_run_by_id(run_id).tags["kb/from"] == "other process"
    instance.add_run_tags(run_id, {"kb/from": "this process"})  # no "database is locked"
    assert instance.get_run_by_id(run_id).tags["kb/from"] == "this process"


def test_a_forked_child_writes_with_its_own_connections():
    """A forked process (the crash tests' fork server, a multiprocessing
    worker) must not use the pooled connections of its parent: SQLite
    forbids a connection that crosses a fork."""
    ensure_dagster_home(Settings())
    instance = dg.DagsterInstance.get()
    run_id = _materialize(instance)
    file = instance.event_log_storage.conn_string_for_shard(run_id)
    parents_engine = kept_engine(file)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            instance.report_engine_event("from the child", instance.get_run_by_id(run_id))
            code = 0 if kept_engine(file) is not parents_engine else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # 3: the child used the parent's pool
    instance.report_engine_event("from the parent", instance.get_run_by_id(run_id))
    messages = [r.event_log_entry.message for r in instance.get_records_for_run(run_id).records]
    assert messages[-2:] == ["from the child", "from the parent"]
    assert kept_engine(file) is parents_engine
