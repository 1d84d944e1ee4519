"""The catch-up of the daemon: after an x_sync run, one run of `x_catch_up`
for each earlier sync batch with work that waits.

A run of a partition takes only its own batch's items
(kb_assets/enrich/enrichment.py, batches_of_run), so an item that an
earlier run could not do (a service was down, a key was missing) waits for
a run of its own batch. kb/index/waiting_work.py says which batches hold
such work.

- `x_catch_up_sensor`: after an x_sync run whose capture failed (an expired
  X login, X down). The failed step stopped every later step of its run.
- `x_sync_catch_up_sensor`: after an x_sync run that succeeded.

`kb sync` runs the catch-up itself (kb/apps/sync.py) and tags its runs so:
these sensors leave them alone. They follow the runs that the daemon's
sensors, the schedule and the UI start.
"""

import dagster as dg
import duckdb as duckdb_lib

from kb.index.waiting_work import STAGES, waiting_work
from kb.settings import excluded_sources, get_settings
from kb_assets.jobs import x_catch_up_job, x_sync_job
from kb_assets.keys import CATCH_UP_TAG, PARTITION_TAG, X_RAW_PAGES
from kb_assets.partitions import sync_batches
from kb_assets.run_choices import EXCLUDE_TAG

CAPTURE_STEP = X_RAW_PAGES.to_user_string()  # the step of an asset has the asset's name


def _refused(instance: dg.DagsterInstance, run_id: str, *, stopped: bool = True) -> set[str]:
    """The stages of a run that did nothing because they are off or have too
    few items (`skipped` in the metadata), and with `stopped`, those that
    failed or stopped (a failed stage check of severity ERROR)."""
    out = set()
    for record in instance.get_records_for_run(run_id, of_type={
            dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.ASSET_MATERIALIZATION,
            dg.DagsterEventType.ASSET_CHECK_EVALUATION}, limit=1000).records:
        event = record.event_log_entry.dagster_event
        if event.event_type == dg.DagsterEventType.STEP_FAILURE:
            if stopped:
                out.add(event.step_key)
        elif event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            if "skipped" in materialization.metadata:
                out.add(materialization.asset_key.to_user_string())
        else:
            check = event.asset_check_evaluation_data
            if stopped and not check.passed and check.severity == dg.AssetCheckSeverity.ERROR:
                out.add(check.asset_key.to_user_string())
    return out


def stages_that_cannot_run(instance: dg.DagsterInstance, run_id: str = "") -> set[str]:
    """The stages whose service would refuse the older items too: those that
    failed, stopped or were off in the run `run_id` (the new batch's), and
    those that were off in their latest materialization (after a failed
    capture the new run says nothing of them; a service that stopped then
    may be back). They are left out of a catch-up: a run for them would do
    nothing, and the next sync tries."""
    out = _refused(instance, run_id) if run_id else set()
    for stage in STAGES:
        latest = instance.fetch_materializations(dg.AssetKey(stage), limit=1).records
        if latest and stage in _refused(instance, latest[0].run_id, stopped=False):
            out.add(stage)
    return out


def catch_up_requests(context, run: dg.DagsterRun, stages: set[str]) -> list[dg.RunRequest] | dg.SkipReason:
    """One request of `x_catch_up` per earlier batch with work that waits in `stages`."""
    from kb.index.batch_index import indexed_passages
    from kb.index.client import ChunkIndex

    settings = get_settings()
    exclude = run.tags.get(EXCLUDE_TAG, "")
    skip = excluded_sources(for_this_run=exclude)
    batches = [b for b in context.instance.get_dynamic_partitions(sync_batches.name)
               if b != run.tags.get(PARTITION_TAG)]
    if not stages or not batches or not settings.duckdb_path.exists():
        return dg.SkipReason("no earlier batch, or no stage that can run")
    stored = indexed_passages(ChunkIndex.from_settings(), skip)  # before DuckDB opens
    try:
        conn = duckdb_lib.connect(str(settings.duckdb_path), read_only=True)
    except duckdb_lib.IOException as exc:
        if "lock" in str(exc).lower():
            return dg.SkipReason("a run holds the DuckDB file: the next sync catches up")
        raise
    try:
        waiting = waiting_work(conn, stored, skip, stages=stages, x_login=settings.x_state_path.exists(),
                               batches=batches)
    finally:
        conn.close()
    if not waiting:
        return dg.SkipReason("no work waits in an earlier batch")
    tags = {EXCLUDE_TAG: exclude} if exclude else {}
    return [dg.RunRequest(run_key=f"{run.run_id}:catch-up:{batch}", partition_key=batch, tags=tags)
            for batch in waiting]


@dg.run_failure_sensor(
    monitored_jobs=[x_sync_job],
    request_job=x_catch_up_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a sync whose capture failed: one run of the stages after the capture for each earlier "
                "batch with work that waits.",
)
def x_catch_up_sensor(context: dg.RunFailureSensorContext):
    run = context.dagster_run
    batch = run.tags.get(PARTITION_TAG)
    if not batch or run.tags.get(CATCH_UP_TAG):
        return dg.SkipReason("no sync batch, or the command that ran it catches up itself")
    failed = {event.step_key for event in context.get_step_failure_events()}
    if CAPTURE_STEP not in failed:
        return dg.SkipReason(f"the capture of batch {batch} did not fail: the run's own stages ran")
    return catch_up_requests(context, run, set(STAGES) - stages_that_cannot_run(context.instance))


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[x_sync_job],
    request_job=x_catch_up_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a sync: one run of the stages after the capture for each earlier batch with work that "
                "waits.",
)
def x_sync_catch_up_sensor(context: dg.RunStatusSensorContext):
    run = context.dagster_run
    if not run.tags.get(PARTITION_TAG) or run.tags.get(CATCH_UP_TAG):
        return dg.SkipReason("no sync batch, or the command that ran it catches up itself")
    return catch_up_requests(context, run, set(STAGES) - stages_that_cannot_run(context.instance, run.run_id))
