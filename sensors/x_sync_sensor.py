"""Schedules of the X path.

A sync needs a new dynamic partition before its run, and only sensors can add
partitions, so the periodic sync is a sensor with a minimum interval.
It is off by default: it needs the X login (`kb login`) first.
"""

import dagster as dg

from kb_assets.jobs import x_sync_job
from kb_assets.partitions import new_batch_key, sync_batches

SYNC_INTERVAL_SECONDS = 6 * 60 * 60


@dg.sensor(
    job=x_sync_job,
    minimum_interval_seconds=SYNC_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Every 6 hours: add a sync batch and capture new bookmarks through the whole graph.",
)
def x_sync_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    batch = new_batch_key()
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=batch, partition_key=batch)],
        dynamic_partitions_requests=[sync_batches.build_add_request([batch])],
    )
