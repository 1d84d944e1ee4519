"""Asset `captions`: a caption and the OCR text of each photo of the bookmarks.

Photos wait until enough of them make a run worth its start: with the Modal
backend a GPU start costs the same for 1 photo as for 600. So:
- in a sync, the run of a batch captions the photos of that batch only
  when at least settings.kb_caption_min_photos wait, over all batches; else
  it records that they wait (too_few_photos(): the sensor counts the same
  way). The photos of older batches get the runs of their own partitions;
- the sensor `captions_sensor` (sensors/waiting_photos.py) starts one run over
  every batch with waiting photos once there are enough of them;
- `kb caption` (kb/apps/caption_run.py) starts that run at once, whatever the count.

The rules (which photos wait, when enough wait, the result rows) are in
kb/enrich/photo_queue.py.

One run can cover a range of sync batches (BackfillPolicy.single_run), so
the photos of many batches share one GPU start.

No DuckDB connection (and so no writer lock) is open while the model
works: the asset reads the waiting photos, closes, and writes each group of
results in its own short transaction. An interrupted run keeps what it
wrote, and the next run goes on from there.

A failed photo is stored with its reason and tried again only on request
(run config `retry`, `kb caption --retry`).
"""

# No `from __future__ import annotations`: Dagster reads the config class
# from the real annotation of the asset function.
import dagster as dg

from kb.enrich.photo_queue import SOURCE, caption_waiting, photo_coverage, too_few_photos, waiting_photos
from kb_assets.enrich.enrichment import (backend_stopped, batches_of_run, coverage_check, coverage_spec,
                                         failure_reasons, from_batches, goes_on_after_failure, stage_check_spec,
                                         with_checks)
from kb_assets.partitions import sync_batches
from kb_assets.run_choices import excluded_in_run
from kb.settings import excluded_sources
from kb_resources.services import CaptionerResource
from kb_resources.stores import DuckDBResource


class CaptionsConfig(dg.Config):
    limit: int = 0  # most photos in this run; 0: every photo that waits
    retry: bool = False  # caption the failed photos again
    min_photos: int = -1  # run only when this many photos wait; -1: settings.kb_caption_min_photos; 0: always


def _skipped(reason: str, waiting: int, context: dg.AssetExecutionContext,
             below_threshold: bool = False) -> dg.MaterializeResult:
    context.log.info(f"No captions in this run: {reason}")
    return dg.MaterializeResult(metadata={"captioned": 0, "failed": 0, "waiting": waiting, "skipped": reason,
                                          "below_threshold": below_threshold})


def caption_photos(
    context: dg.AssetExecutionContext, config: CaptionsConfig, duckdb: DuckDBResource, captioner: CaptionerResource
) -> dg.MaterializeResult:
    duckdb, captioner = duckdb.get_client(), captioner.get_client()
    if SOURCE in excluded_in_run(context):
        return _skipped(f"the owner excluded the source {SOURCE!r}", 0, context)
    with duckdb.connect() as conn:
        photos = waiting_photos(conn, batches_of_run(context), retry=config.retry)
        # The threshold counts the photos that wait in every batch, as the
        # sensor does; the run captions its own partitions' photos only.
        everywhere = len(waiting_photos(conn, None, retry=config.retry)) if config.min_photos else len(photos)
    batches = sorted({photo.batch for photo in photos})
    off = captioner.off_reason()
    if off:
        return _skipped(f"captions are off: {off}", len(photos), context)
    too_few = too_few_photos(everywhere, config.min_photos)
    if too_few:
        return _skipped(too_few, len(photos), context, below_threshold=True)
    all_waiting = len(photos)
    if config.limit > 0:
        photos = photos[:config.limit]

    model = captioner.model_name()
    context.log.info(f"Captioning {len(photos)} photo(s) of {len(batches)} batch(es) with {model}")
    written, error = caption_waiting(duckdb, captioner, photos)
    for row in written:
        if row["status"] == "failed":
            context.log.info(f"{row['url']}: {row['reason']} {row['detail'] or ''}".rstrip())
    metadata = {
        "captioned": sum(row["status"] == "ok" for row in written),
        "failed": failure_reasons(written),
        "waiting": all_waiting - len(written),
        "model": model,
        "backend": captioner.backend_name(),
        "batches": len(batches),
        "from_batches": from_batches(photo.batch for photo in photos),
        "retry": config.retry,
    }
    if error:
        return backend_stopped(context, "caption", error, len(written), "photos", metadata)
    return dg.MaterializeResult(metadata=metadata)


def captions_coverage(duckdb: DuckDBResource, batches: list[str]) -> dg.AssetCheckResult:
    with duckdb.get_client().connect() as conn:
        numbers = photo_coverage(conn, batches)
    return coverage_check(CAPTIONS_COVERAGE.name, numbers, done=numbers["captioned"], total=numbers["photos"],
                          off=SOURCE in excluded_sources(), off_key="excluded")


CAPTIONS_COVERAGE = coverage_spec(
    "captions_coverage", "captions",
    description="Share of the photos that have a caption. Passes when no photo waits; a photo that is gone is a "
    "failure of the web, not of the stage.")


# The coverage check runs in this step: see with_checks().
@dg.asset(
    partitions_def=sync_batches,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=["media", "bookmarks"],
    group_name="enrich",
    kinds={"duckdb"},
    description="A caption and the text in the image (OCR) for each photo of the bookmarks, "
    "or the reason why there is none. Keyed by the photo URL.",
    check_specs=[CAPTIONS_COVERAGE, stage_check_spec("captions")],
)
def captions(
    context: dg.AssetExecutionContext, config: CaptionsConfig, duckdb: DuckDBResource, captioner: CaptionerResource
) -> dg.MaterializeResult:
    result = goes_on_after_failure(context, "kb caption", caption_photos, context, config, duckdb, captioner)
    return with_checks(context, result, captions_coverage(duckdb, batches_of_run(context)))
