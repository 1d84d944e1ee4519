"""The run launcher of kb: Dagster's default launcher, plus a health check
of local run workers by their process ids.

Hard-won fact (tests/test_crash_safety.py): a run whose worker is killed
(SIGKILL, power loss, the out-of-memory killer) stays STARTED for ever, and
it keeps its slot in the pool `wiki`. Every later run that needs that pool
then waits for ever.

Dagster's run monitoring finds such runs when the run launcher can check a
worker's health; the default launcher cannot. This one can: every run
worker on this machine writes its process id into the run's event log
("Started process for run (pid: N)" for a launched run, "Executing steps in
process (pid: N)" for the in-process executor), and a run that `kb sync`
executes in its own process carries the tag kb/pid. A run is dead when
none of its processes lives. Then the daemon's run monitoring marks it
failed, its run retries apply, and its pool slots are freed.

A process id means something only on the machine (and the container) that
ran the process, and only until that machine starts again. So each run
carries the tags kb/host and kb/boot_id of its worker: the worker writes
them when its first kb resource starts (kb_resources/run_worker.py),
and `kb sync` when it creates the run. The launcher checks a process id
only for a run of this host and this boot. A run of another host (in the
compose deployment the daemon and the run workers are in two containers)
counts as running (never UNKNOWN: Dagster's run monitoring fails such a
run) and is left to Dagster's start timeout and longest run time. A run of this host from an earlier boot is dead: the start of the
machine stopped its worker.

Without a daemon (a plain `kb sync`), `fail_runs_of_dead_workers` asks the
same launcher, so one health rule serves both cases.

Every run that a run worker executes passes launch_run() here: the runs of
the UI and of GraphQL, of sensors, schedules and backfills, re-executions,
run retries and the runs of `kb` commands under kb up. So the launcher also
refuses a run whose run config kb does not accept (run_config_refusal() of
kb_assets/run_config_rules.py: no `resources`, no `{env: ...}`), before a
worker starts. The run fails with the reason, which names the key, and gets
no automatic retry: the same config would be refused again.
"""

from __future__ import annotations

import os
import socket
import time

import dagster as dg
import psutil

from kb_assets.dagster_internals import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from kb_assets.keys import MAX_RETRIES_TAG
from kb_assets.run_config_rules import check_run_config

from kb_resources.run_worker import BOOT_TAG, HOST_TAG, boot_id, worker_tags

PID_TAG = "kb/pid"
# psutil gives the start time of a process to about 10 ms; the run record's
# create time comes from another clock read. Allow for both.
CLOCK_SLACK_S = 2.0
# The longest time for a run worker to tag its run with its host (it does so
# when its first kb resource starts, after all its imports).
UNTAGGED_GRACE_S = 600


def this_process_tags() -> dict[str, str]:
    """Tags for a run that executes in this process: they name the process,
    so that a later health check can see whether it still lives."""
    return {PID_TAG: str(os.getpid()), **worker_tags()}


def worker_place(run: dg.DagsterRun) -> str:
    """Where the run's worker lives, seen from this process: "here", "gone"
    (this host, an earlier boot), "elsewhere" (another host) or "unknown"
    (the worker has not tagged the run yet)."""
    host = run.tags.get(HOST_TAG)
    if host is None:
        return "unknown"
    if host != socket.gethostname():
        return "elsewhere"
    recorded_boot, this_boot = run.tags.get(BOOT_TAG, ""), boot_id()
    if recorded_boot and this_boot and recorded_boot != this_boot:
        return "gone"
    return "here"


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


def run_pids(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dict[int, float]:
    """Every process id recorded for the run, with the time it was recorded:
    the kb/pid tag (at run creation) and the `pid` of each engine event."""
    pids: dict[int, float] = {}
    if run.tags.get(PID_TAG, "").isdigit():
        record = instance.get_run_record_by_id(run.run_id)
        created = record.create_timestamp.timestamp() if record else time.time()
        pids[int(run.tags[PID_TAG])] = created
    for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        metadata = getattr(data, "metadata", None) or {}
        value = getattr(metadata.get("pid"), "value", None)  # TextMetadataValue("27955")
        if isinstance(value, (int, str)) and str(value).isdigit():
            pids.setdefault(int(value), entry.timestamp)
    return pids


class LocalRunLauncher(dg.DefaultRunLauncher):
    """The default launcher (a run worker process per run, started by the
    code server), with a health check of local run workers."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        try:
            check_run_config(run.run_config, f"run {run.run_id} of {run.job_name}")
        except Exception:
            # Dagster marks the run failed; its retry would be refused too.
            self._instance.add_run_tags(run.run_id, {MAX_RETRIES_TAG: "0"})
            raise
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        # A worker that this launcher cannot check counts as RUNNING, not
        # UNKNOWN. Why: the daemon's run monitoring marks a run failed for
        # every status but RUNNING and SUCCESS, UNKNOWN too
        # (dagster/_daemon/monitoring/run_monitoring.py). In the compose
        # deployment every run was failed so, seconds after its start.
        # Dagster's start timeout and longest run time still end such a run.
        place = worker_place(run)
        # Dagster's run monitoring fails a started run for every answer but
        # RUNNING and SUCCESS, UNKNOWN too. So a worker that kb cannot check
        # here is RUNNING, and Dagster's longest run time covers it.
        if place == "elsewhere":
            # A pid means something only on the machine that ran the process.
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"the run worker is on {run.tags[HOST_TAG]}: "
                                        "not checked from here")
        if place == "gone":
            return CheckRunHealthResult(
                WorkerStatus.FAILED, "the run worker is gone: this host started again after the run began")
        pids = run_pids(self._instance, run)
        if place == "unknown":
            # Not tagged yet: a run worker names its host when its first kb
            # resource starts, after its imports (a minute and more on a busy
            # machine). The month of issue 55 saw the daemon fail a lint run
            # whose step was still importing. A live process of the run here,
            # or a young run, is RUNNING; an untagged run older than
            # UNTAGGED_GRACE_S with no live process here has failed.
            if any(process_alive(pid, recorded_at) for pid, recorded_at in pids.items()):
                return CheckRunHealthResult(WorkerStatus.RUNNING, "the run worker has not named its host yet")
            record = self._instance.get_run_record_by_id(run.run_id)
            started = (record.start_time or record.create_timestamp.timestamp()) if record else time.time()
            if time.time() - started < UNTAGGED_GRACE_S:
                return CheckRunHealthResult(WorkerStatus.RUNNING, "the run worker has not named its host yet")
            return CheckRunHealthResult(
                WorkerStatus.FAILED, f"the run worker has not named its host in {UNTAGGED_GRACE_S} s, and no "
                "process of the run lives here")
        if not pids:
            # Not started yet.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "the run names no worker process yet")
        if any(process_alive(pid, recorded_at) for pid, recorded_at in pids.items()):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        listed = ", ".join(map(str, sorted(pids)))
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"the run worker (pid {listed}) is gone: it was killed or it crashed")


def fail_runs_of_dead_workers(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """What the daemon's run monitoring does, for a `kb` command that runs
    with no daemon: ask the run launcher about every started run, mark the
    runs of dead workers failed (run retries then apply as usual), and free
    the pool slots that they and ended runs still hold. Returns the runs
    that it marked failed."""
    launcher = instance.run_launcher
    if not launcher.supports_check_run_worker_health:
        return []
    failed = []
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        health = launcher.check_run_worker_health(run)
        if health.status != WorkerStatus.FAILED:
            continue
        # The words of Dagster's run monitoring, so that both paths read alike.
        instance.report_run_failed(run, f"Detected run worker status {health}. Marking run {run.run_id} as failed.")
        failed.append(run)
    free_slots_of_ended_runs(instance)
    return failed


def free_slots_of_ended_runs(instance: dg.DagsterInstance) -> list[str]:
    """Free the pool slots of runs that ended, as the daemon does after
    free_slots_after_run_end_seconds. A `kb` command does it at once: no
    run of this instance can use a slot of a run that ended."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    holders = list(storage.get_concurrency_run_ids())
    if not holders:
        return []
    ended = [record.dagster_run.run_id for record in instance.get_run_records(filters=dg.RunsFilter(
        run_ids=holders, statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
                                   dg.DagsterRunStatus.CANCELED]))]
    for run_id in ended:
        storage.free_concurrency_slots_for_run(run_id)
    return ended
