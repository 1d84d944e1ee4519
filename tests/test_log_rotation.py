"""The logs of kb up stay within their bounds (kb/apps/log_rotation.py)."""

from __future__ import annotations

import os
import time

from kb.apps.log_rotation import keep_logs_small, prune_compute_logs, rotate_log


def test_a_part_log_over_its_bound_moves_to_dot_one_and_the_part_writes_on(tmp_path):
    log = tmp_path / "dagster-daemon.log"
    writer = open(log, "ab", buffering=0)  # as kb up opens it for the part
    try:
        writer.write(b"first " * 4)
        assert rotate_log(log, max_bytes=100) is False  # under the bound: nothing moves
        assert rotate_log(log, max_bytes=10) is True
        assert (tmp_path / "dagster-daemon.log.1").read_bytes() == b"first " * 4
        assert log.stat().st_size == 0
        writer.write(b"second " * 4)  # the part appends at the start of the empty file
        assert log.read_bytes() == b"second " * 4
        assert rotate_log(log, max_bytes=10, keep=2)
        writer.write(b"third " * 4)
        assert rotate_log(log, max_bytes=10, keep=2)
        # Two old copies stay; the oldest went.
        assert (tmp_path / "dagster-daemon.log.1").read_bytes() == b"third " * 4
        assert (tmp_path / "dagster-daemon.log.2").read_bytes() == b"second " * 4
        assert not (tmp_path / "dagster-daemon.log.3").exists()
    finally:
        writer.close()


def _run_logs(storage, run_id: str, size: int, *, finished: bool, age_s: float):
    logs = storage / run_id / "compute_logs"
    logs.mkdir(parents=True)
    (logs / "step.out").write_bytes(b"x" * size)
    (logs / "step.err").write_bytes(b"")
    if finished:
        (logs / "step.complete").write_bytes(b"")
    moment = time.time() - age_s
    os.utime(logs, (moment, moment))
    return logs


def test_compute_logs_of_the_oldest_finished_runs_go_first(tmp_path):
    storage = tmp_path / "dagster" / "storage"
    oldest = _run_logs(storage, "run-old", 400, finished=True, age_s=300)
    running = _run_logs(storage, "run-running", 400, finished=False, age_s=200)
    newer = _run_logs(storage, "run-newer", 400, finished=True, age_s=100)
    newest = _run_logs(storage, "run-newest", 400, finished=True, age_s=0)
    assert prune_compute_logs(storage, max_bytes=1000) == ["run-old", "run-newer"]
    assert not oldest.exists() and not newer.exists()
    assert running.exists() and newest.exists()  # a running step keeps its logs
    assert (storage / "run-old").is_dir()  # only the compute logs go
    assert prune_compute_logs(storage, max_bytes=1000) == []


def test_one_pass_rotates_every_part_log_and_prunes(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "kb-bot.log").write_bytes(b"b" * (11 * 1024 * 1024))
    (logs / "kb-web.log").write_bytes(b"small")
    keep_logs_small(logs, tmp_path / "dagster")  # no storage folder yet: nothing to prune
    assert (logs / "kb-bot.log").stat().st_size == 0 and (logs / "kb-bot.log.1").exists()
    assert (logs / "kb-web.log").read_bytes() == b"small" and not (logs / "kb-web.log.1").exists()


def test_an_idle_wal_of_a_run_file_goes_into_its_file(tmp_path):
    """A killed process leaves its run file's WAL; the next pass folds it
    into the file, and leaves a WAL that was written just now."""
    import sqlite3

    from kb.apps.log_rotation import fold_idle_wals

    runs = tmp_path / "history" / "runs"
    runs.mkdir(parents=True)
    keepers = []
    for name in ("old-run", "new-run"):
        conn = sqlite3.connect(runs / f"{name}.db")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE event_logs (id INTEGER PRIMARY KEY, event TEXT)")
        conn.executemany("INSERT INTO event_logs (event) VALUES (?)", [("x" * 500,)] * 200)
        conn.commit()
        keepers.append(conn)  # as a killed process: the connection never closes cleanly
    old_wal, new_wal = runs / "old-run.db-wal", runs / "new-run.db-wal"
    assert old_wal.stat().st_size > 50_000 and new_wal.stat().st_size > 50_000
    os.utime(old_wal, (time.time() - 3600, time.time() - 3600))
    for conn in keepers:
        conn.execute("PRAGMA wal_autocheckpoint=0")
    assert fold_idle_wals(runs, idle_s=600) == ["old-run.db"]
    assert old_wal.stat().st_size == 0 and new_wal.stat().st_size > 50_000
    with sqlite3.connect(f"file:{runs / 'old-run.db'}?mode=ro", uri=True) as reader:
        assert reader.execute("SELECT count(*) FROM event_logs").fetchone()[0] == 200
    for conn in keepers:
        conn.close()
