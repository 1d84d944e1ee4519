"""Runs whose process is gone: find them, mark them failed, free their pool slots.

Hard-won fact (tests/test_crash_safety.py): a run whose process is killed
(SIGKILL, power loss, the out-of-memory killer) stays STARTED for ever, and it
keeps its slot in the pool `duckdb` or `wiki`. Every later run that needs
that pool then waits for ever: the next `kb sync` hangs at normalize.

Dagster's run monitoring (dagster.yaml) cannot see this here. It asks the run
launcher whether the run's worker lives, and the default run launcher cannot
tell; a run that `kb sync` starts in its own process has no launcher at all.
Only `max_runtime_seconds` catches such a run, hours later, and only when the
daemon runs. `free_slots_after_run_end_seconds` frees the slots of runs that
ENDED, which a killed run never does.

So kb checks the processes itself. Dagster records the process id of each
run in its engine events ("Executing steps in process (pid: N)"), and
`kb sync` also tags its runs with kb/pid. A run is gone when none of its
processes lives. kb then marks it failed with Dagster's own
`report_run_failed` (the UI, the bot and Dagster's run retries see a normal
failure) and frees its pool slots with the event log storage's
`free_concurrency_slots_for_run`, as the Dagster daemon does for runs that
ended.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import dagster as dg
import psutil

PID_TAG = "kb/pid"
HOST_TAG = "kb/host"
# Set on a run that kb marked failed because its process was gone. `kb sync`
# redoes the stages of such runs; it does not redo a stage that failed on
# its own (that is an error to report, not a crash to recover from).
PROCESS_GONE_TAG = "kb/process_gone"

UNFINISHED_STATUSES = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
# psutil gives the start time of a process to about 10 ms; the run record's
# create time comes from another clock read. Allow for both.
CLOCK_SLACK_S = 2.0


@dataclass(frozen=True)
class GoneRun:
    """A run that kb marked failed because its process was gone."""

    run_id: str
    job_name: str
    pids: tuple[int, ...]
    tags: dict[str, str]


def this_process_tags() -> dict[str, str]:
    """Tags for a run that executes in this process: they name the process,
    so that a later check can see whether it still lives."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def process_alive(pid: int, recorded_at: float) -> bool:
    """True when process `pid` lives and is the process that was recorded
    at `recorded_at` (a Unix time).

    A process id is used again after its process ends. A process that
    started after its pid was recorded is another program, so the recorded
    process is gone. A zombie (ended, not yet collected) is gone too."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= recorded_at + CLOCK_SLACK_S
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # a process of another user: it lives, and it may be the run's


def run_pids(instance: dg.DagsterInstance, record: dg.RunRecord) -> dict[int, float]:
    """Every process id recorded for the run, with the time it was recorded:
    the kb/pid tag (at run creation) and the `pid` of each engine event (the
    run process, and step processes if any)."""
    run = record.dagster_run
    pids: dict[int, float] = {}
    if run.tags.get(PID_TAG, "").isdigit():
        pids[int(run.tags[PID_TAG])] = record.create_timestamp.timestamp()
    for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        metadata = getattr(data, "metadata", None) or {}
        value = getattr(metadata.get("pid"), "value", None)  # TextMetadataValue("27955")
        if isinstance(value, (int, str)) and str(value).isdigit():
            pids.setdefault(int(value), entry.timestamp)
    return pids


def run_process_alive(instance: dg.DagsterInstance, record: dg.RunRecord) -> bool | None:
    """True or False when the run's processes can be checked; None when the
    run names no process of this host (then nothing here can judge it)."""
    run = record.dagster_run
    if HOST_TAG in run.tags:
        if run.tags[HOST_TAG] != socket.gethostname():
            return None
    elif not isinstance(instance.run_launcher, dg.DefaultRunLauncher):
        # A pid means something only on the host that ran the process. The
        # default launcher starts runs on this host; another launcher (a
        # Kubernetes pod, a Docker container) does not.
        return None
    pids = run_pids(instance, record)
    if not pids:
        return None
    return any(process_alive(pid, recorded_at) for pid, recorded_at in pids.items())


def fail_runs_of_dead_processes(instance: dg.DagsterInstance) -> list[GoneRun]:
    """Mark failed every unfinished run whose processes are all gone, and
    free the pool slots that it holds. Returns those runs.

    A run that names no process (a queued run, a run on another host) is
    left to Dagster: its start timeout and max runtime apply."""
    gone: list[GoneRun] = []
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=UNFINISHED_STATUSES)):
        if run_process_alive(instance, record) is not False:
            continue
        run = record.dagster_run
        pids = tuple(sorted(run_pids(instance, record)))
        instance.add_run_tags(run.run_id, {PROCESS_GONE_TAG: "true"})
        instance.report_run_failed(
            run,
            f"The process of this run (pid {', '.join(map(str, pids))}) is gone: it was killed or it "
            f"crashed. kb marked the run failed and freed its pool slots.",
        )
        free_pool_slots(instance, run.run_id)
        gone.append(GoneRun(run.run_id, run.job_name, pids, dict(run.tags)))
    free_slots_of_ended_runs(instance)
    return gone


def free_pool_slots(instance: dg.DagsterInstance, run_id: str) -> None:
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        storage.free_concurrency_slots_for_run(run_id)


def free_slots_of_ended_runs(instance: dg.DagsterInstance) -> list[str]:
    """Free the pool slots that runs which ended still hold, after the delay
    of dagster.yaml (free_slots_after_run_end_seconds), as the Dagster daemon
    does. `kb sync` must not wait for a daemon that may not run."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    holders = list(storage.get_concurrency_run_ids())
    if not holders:
        return []
    delay = instance.run_monitoring_settings.get("free_slots_after_run_end_seconds") or 0
    ended = [record for record in instance.get_run_records(filters=dg.RunsFilter(
        run_ids=holders,
        statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]))
        if record.end_time is not None and record.end_time + delay < time.time()]
    for record in ended:
        storage.free_concurrency_slots_for_run(record.dagster_run.run_id)
    return [record.dagster_run.run_id for record in ended]
