"""`x_catch_up_sensor`: after an x_sync run whose capture failed (an expired
X login, X down), one run of `x_catch_up` for the same batch.

A failed step stops every later step of its run, so the work that waits in
every batch (links, photos, videos, translations, the index) would wait for
the next successful capture. `kb sync` runs the catch-up itself
(kb/apps/sync.py) and tags its runs so: this sensor leaves them alone. It
follows the runs that the daemon's sensors, the schedule and the UI start.
"""

import dagster as dg

from kb_assets.jobs import x_catch_up_job, x_sync_job
from kb_assets.keys import CATCH_UP_TAG, PARTITION_TAG, X_RAW_PAGES
from kb_assets.run_choices import EXCLUDE_TAG

CAPTURE_STEP = X_RAW_PAGES.to_user_string()  # the step of an asset has the asset's name


@dg.run_failure_sensor(
    monitored_jobs=[x_sync_job],
    request_job=x_catch_up_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a sync whose capture failed: the stages after the capture, on the work that waits.",
)
def x_catch_up_sensor(context: dg.RunFailureSensorContext):
    run = context.dagster_run
    batch = run.tags.get(PARTITION_TAG)
    if not batch or run.tags.get(CATCH_UP_TAG):
        return dg.SkipReason("no sync batch, or the command that ran it catches up itself")
    failed = {event.step_key for event in context.get_step_failure_events()}
    if CAPTURE_STEP not in failed:
        return dg.SkipReason(f"the capture of batch {batch} did not fail: the run's own stages ran")
    tags = {EXCLUDE_TAG: run.tags[EXCLUDE_TAG]} if run.tags.get(EXCLUDE_TAG) else {}
    return dg.RunRequest(run_key=f"{run.run_id}:catch-up", partition_key=batch, tags=tags)
