"""The sensor `dead_runs_sensor`: runs whose process is gone.

The daemon launches the runs of the Telegram inflow (parse, gate, wiki). When
such a run's process is killed, the run stays STARTED and keeps its pool slot
(`duckdb` for the gate, `wiki` for an ingest), and Dagster's run monitoring
cannot see it with the default run launcher (see kb_resources/run_monitor.py).
This sensor marks such runs failed and frees their slots. Dagster's run
retries (dagster.yaml, max_retries 1) then run the item again, and the bot's
/status shows it as `retrying`.

`kb sync` does the same check when it starts, so it works with no daemon too.
"""

import dagster as dg

from kb_resources.run_monitor import fail_runs_of_dead_processes

# A killed run blocks its pool until this check runs: keep it short. The
# check reads only the unfinished runs, so it is cheap.
CHECK_INTERVAL_SECONDS = 60


@dg.sensor(
    minimum_interval_seconds=CHECK_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Marks failed each run whose process is gone (killed, crashed) and frees its pool slots, "
                "so that Dagster's run retries run it again and later runs do not wait for ever.",
)
def dead_runs_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    gone = fail_runs_of_dead_processes(context.instance)
    for run in gone:
        context.log.warning(f"run {run.run_id} ({run.job_name}): its process (pid {', '.join(map(str, run.pids))}) "
                            "is gone; marked failed, pool slots freed")
    return dg.SkipReason(f"{len(gone)} run(s) of dead processes marked failed" if gone else "every run has a live process")
