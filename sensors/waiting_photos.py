"""The caption sensors.

`captions_sensor`: one caption run once enough photos wait.

A GPU start on Modal costs the same for 1 photo as for 600, so the sensor
waits until settings.kb_caption_min_photos photos wait, over all sync
batches, and then starts ONE run over the range of batches that hold them
(the `captions` asset runs a range in one run). While a caption run is
queued or running, it starts no other.

The sensor reads DuckDB read-only and for a moment. While a sync holds the
file, it cannot open it: it skips this tick and tries again at the next.

`captions_to_index_sensor`: after a caption run that the sensor started,
the new captions are not in the index yet. For each batch of that run it
starts a run of chunks, translations and chunk_index, so they are.
"""

import dagster as dg
import duckdb as duckdb_lib

# Dagster has no public name for these tags; they make one run cover a range of partitions.
from kb_assets.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from kb_assets.keys import PARTITION_TAG, STAGE_TAG
from kb.enrich.photo_queue import SOURCE, too_few_photos, waiting_by_batch
from kb.settings import excluded_sources
from kb_assets.jobs import captions_job, captions_to_index_job
from kb_assets.partitions import sync_batches
from kb.settings import get_settings
from kb_resources.services import CaptionerResource

CHECK_INTERVAL_SECONDS = 10 * 60


ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
          dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def _read_waiting() -> dict[str, int] | str:
    """Waiting photos per batch, or why they cannot be read now."""
    path = get_settings().duckdb_path
    if not path.exists():
        return "no DuckDB file yet"
    try:
        conn = duckdb_lib.connect(str(path), read_only=True)
    except duckdb_lib.IOException as exc:
        if "lock" in str(exc).lower():
            return "a run holds the DuckDB file"
        raise
    try:
        return waiting_by_batch(conn)
    except duckdb_lib.CatalogException:
        return "the captions table does not exist yet"
    finally:
        conn.close()


@dg.sensor(
    job=captions_job,
    minimum_interval_seconds=CHECK_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Starts one caption run when KB_CAPTION_MIN_PHOTOS or more photos wait.",
)
def captions_sensor(context: dg.SensorEvaluationContext, captioner: CaptionerResource):
    if SOURCE in excluded_sources():
        return dg.SkipReason(f"the owner excluded the source {SOURCE!r}")
    off = captioner.get_client().off_reason()
    if off:
        return dg.SkipReason(f"captions are off: {off}")
    active = context.instance.get_runs(dg.RunsFilter(job_name=captions_job.name, statuses=ACTIVE), limit=1)
    if active:
        return dg.SkipReason(f"caption run {active[0].run_id} has not finished")
    waiting = _read_waiting()
    if isinstance(waiting, str):
        return dg.SkipReason(waiting)
    known = context.instance.get_dynamic_partitions(sync_batches.name)
    batches = [key for key in known if waiting.get(key)]
    total = sum(waiting[key] for key in batches)
    too_few = too_few_photos(total)
    if too_few:
        return dg.SkipReason(too_few)
    return dg.RunRequest(
        tags={ASSET_PARTITION_RANGE_START_TAG: batches[0], ASSET_PARTITION_RANGE_END_TAG: batches[-1],
              STAGE_TAG: "captions"},
        # The run captions whatever waits in the range: the count was checked here.
        run_config={"ops": {"captions": {"config": {"min_photos": 0}}}},
    )


def batches_of_run(run: dg.DagsterRun, known: list[str]) -> list[str]:
    """The sync batches that a run covered: its partition, or its range."""
    if run.tags.get(PARTITION_TAG):
        return [run.tags[PARTITION_TAG]]
    start, end = run.tags.get(ASSET_PARTITION_RANGE_START_TAG), run.tags.get(ASSET_PARTITION_RANGE_END_TAG)
    if start not in known or end not in known:
        return []
    return known[known.index(start):known.index(end) + 1]


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[captions_job],
    request_job=captions_to_index_job,
    # It only follows a caption run, which the owner started or allowed.
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a caption run: chunks, translations and the index of each batch that it covered.",
)
def captions_to_index_sensor(context: dg.RunStatusSensorContext):
    run = context.dagster_run
    known = context.instance.get_dynamic_partitions(sync_batches.name)
    return [dg.RunRequest(run_key=f"{run.run_id}:{batch}", partition_key=batch)
            for batch in batches_of_run(run, known)]
