"""The watch of stuck tries: a try of a step that runs longer than
KB_STUCK_MINUTES (SWEEPER_STUCK_MINUTES, 30) is stopped. It watches the
run of a Telegram item (parse, gate, index, wiki ingest) and the wiki's
own jobs (ingest of a source that waited, lint, synthesis, topic). The
stopped try uses one retry of the persisted count
(kb_assets/retry_budget.py), and Dagster runs the item again one time (the
run retries of dagster.yaml); that run goes on with the count.

The owner's specification has a sweeper for this: a row that one stage
holds for more than 30 minutes goes back to the stage before, with
retry_count + 1, and a worker takes it again. kb matches the behaviour,
not the mechanism.

Why not Dagster's longest run time (the run tag dagster/max_runtime):
Dagster counts the time of a run from its start. A run waits for the pool
slot `wiki` (one wiki change at a time) and for its retries (60, 120,
240 s) inside that time: a whole run with its retries can take about 47
minutes, so a run was stopped in a retry. The specification gives 30
minutes to each try. This sensor counts what the sweeper counts: the time
since the running step started, or started its last retry.

A step that waits for its retry or for a pool slot does not run, and the
sensor leaves it. The sensor stops a run as Dagster's run monitoring stops
a run that runs too long: it marks the run canceling, asks the run launcher
to stop the worker, and marks the run failed. The failure names no failed
step, so the run retry applies (kb's jobs retry only runs that did not
fail in a step of their own). An interrupted wiki change rolls the wiki
back (kb/wiki/change.py).
"""

from __future__ import annotations

import time

import dagster as dg

from kb.settings import get_settings
from kb.store.beats import STUCK_CHECK, note_beat
from kb_assets.keys import SOURCE_INTAKE_JOB, WIKI_JOB_NAMES
from kb_assets.retry_budget import record_stuck_try

# The jobs whose tries this sensor watches: the run of one Telegram item, and the wiki's jobs.
WATCHED_JOBS = (SOURCE_INTAKE_JOB, *WIKI_JOB_NAMES)
STEP_EVENTS = {
    dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_RESTARTED, dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.STEP_UP_FOR_RETRY, dg.DagsterEventType.STEP_SKIPPED,
}
RUNNING = (dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_RESTARTED)


def running_step(instance: dg.DagsterInstance, run_id: str) -> tuple[str, float] | None:
    """(step key, start time) of the step of the run that runs now, or None
    when no step runs (the run waits for a retry or for a pool slot)."""
    last: dict[str, dg.EventLogEntry] = {}
    for record in instance.get_records_for_run(run_id, of_type=STEP_EVENTS, limit=1000).records:
        entry = record.event_log_entry
        if entry.step_key:
            last[entry.step_key] = entry
    running = [(entry.step_key, entry.timestamp) for entry in last.values()
               if entry.dagster_event and entry.dagster_event.event_type in RUNNING]
    return min(running, key=lambda found: found[1]) if running else None


def stop_stuck_runs(instance: dg.DagsterInstance, limit_s: float, now: float | None = None) -> list[str]:
    """Stop each watched run whose running step started more than limit_s
    seconds ago. Returns the ids of the runs that it stopped."""
    now = time.time() if now is None else now
    stopped = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        if run.job_name not in WATCHED_JOBS:
            continue
        step = running_step(instance, run.run_id)
        if step is None or now - step[1] <= limit_s:
            continue
        minutes = (now - step[1]) / 60
        message = (f"The step {step[0]} ran {minutes:.0f} minutes in this try, longer than KB_STUCK_MINUTES "
                   f"({limit_s / 60:.0f}): kb stopped the run. The try uses one retry; Dagster runs it again.")
        record_stuck_try(instance, run, step[0], message)
        instance.report_run_canceling(run, message=message)
        try:
            instance.run_launcher.terminate(run_id=run.run_id)
        except Exception as exc:  # the worker may be gone already: the run is failed all the same
            instance.report_engine_event(f"kb could not stop the run worker: {type(exc).__name__}: {exc}", run)
        instance.report_run_failed(run, message)
        stopped.append(run.run_id)
    return stopped


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Stops a run of a Telegram item or of the wiki whose try of a step runs longer than KB_STUCK_MINUTES; "
                "the try uses a retry, and Dagster runs it again.",
)
def stuck_steps_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    settings = get_settings()
    limit_s = settings.kb_stuck_minutes * 60
    stopped = stop_stuck_runs(context.instance, limit_s)
    note_beat(settings.home, STUCK_CHECK)  # kb up's watchdog (kb/apps/watchdog.py) tells the owner when these ticks stop
    for run_id in stopped:
        context.log.warning(f"run {run_id}: a step ran longer than {limit_s / 60:.0f} minutes; stopped")
    return dg.SkipReason(f"{len(stopped)} stuck runs stopped")
