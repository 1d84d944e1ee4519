"""The watch of stuck steps: a step of a Telegram item's run (parse, gate,
index, wiki ingest) that runs longer than KB_STUCK_MINUTES
(SWEEPER_STUCK_MINUTES, 30) is stopped, and Dagster runs the item again
one time (the run retries of dagster.yaml).

The owner's specification has a sweeper for this: a row that one stage
holds for more than 30 minutes goes back to the stage before, and a worker
takes it again. kb matches the behaviour, not the mechanism.

Why not Dagster's longest run time (the run tag dagster/max_runtime, which
the wiki jobs carry): Dagster counts the time of a run from its start. An
item's run waits for the pool slot `wiki` (one wiki change at a time) and
for its retries (60, 120, 240 s) inside that time, so a queue of ten sources
would be stopped for waiting. This sensor counts what the sweeper counts:
the time since the running step started, or started its last retry.

A step that waits for its retry or for a pool slot does not run, and the
sensor leaves it. The sensor stops a run as Dagster's run monitoring stops
a run that runs too long: it marks the run canceling, asks the run launcher
to stop the worker, and marks the run failed. The failure names no failed
step, so the run retry applies also to the source_intake job (it retries
only runs that did not fail in a step of their own). An interrupted wiki
change rolls the wiki back (kb/wiki/change.py).
"""

from __future__ import annotations

import time

import dagster as dg

from kb.settings import get_settings

# The jobs whose runs this sensor watches: the run of one Telegram item.
WATCHED_JOBS = ("source_intake",)
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
        message = (f"The step {step[0]} ran {minutes:.0f} minutes, longer than KB_STUCK_MINUTES "
                   f"({limit_s / 60:.0f}): kb stopped the run, and Dagster runs it again.")
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
    description="Stops the run of a Telegram item whose step runs longer than KB_STUCK_MINUTES; Dagster runs it again.",
)
def stuck_steps_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    limit_s = get_settings().kb_stuck_minutes * 60
    stopped = stop_stuck_runs(context.instance, limit_s)
    for run_id in stopped:
        context.log.warning(f"run {run_id}: a step ran longer than {limit_s / 60:.0f} minutes; stopped")
    return dg.SkipReason(f"{len(stopped)} stuck runs stopped")
