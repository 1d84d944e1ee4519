"""Asset `captions`: a caption and the OCR text of each photo of the bookmarks.

Photos wait until enough of them make a run worth its start: with the Modal
backend a GPU start costs the same for 1 photo as for 600. So:
- in a sync, the asset captions the photos of every batch only when at
  least settings.kb_caption_min_photos wait, over all batches; else it
  records that they wait (too_few_photos(): the sensor counts the same way);
- the sensor `captions_sensor` (sensors/waiting_photos.py) starts one run over
  every batch with waiting photos once there are enough of them;
- `kb caption` (kb/apps/caption_run.py) starts that run at once, whatever the count.

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
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

import dagster as dg
import duckdb

from kb_assets.run_choices import excluded_in_run
from kb.settings import excluded_sources
from kb_assets.enrich.enrichment import (ResultWriter, WaitingConfig, backend_stopped, batches_of_run, coverage_check,
                                         failure_reasons, from_batches, goes_on_after_failure, waiting_rows, with_checks)
from kb_assets.partitions import sync_batches
from kb.settings import get_settings
from kb.enrich.vision import CaptionBackendError, CaptionResult
from kb_resources.services import CaptionerResource
from kb_resources.stores import DuckDBResource

SOURCE = "image"  # the chunk source that captions feed; `exclude = ["image"]` turns this stage off
WRITE_EVERY = 25  # results per write: an interrupted run loses at most this many

# Photos of live bookmarks, one row per photo URL, with the batch of the
# bookmark that shows it (a bookmark belongs to the batch that captured it
# last). `{where}` narrows the photos.
PHOTOS_SQL = """
    SELECT m.url, min(b.batch) AS batch, any_value(c.status) AS status, coalesce(any_value(c.attempts), 0) AS attempts
    FROM media m
    JOIN bookmarks b ON b.tweet_id = m.tweet_id AND b.removed_at IS NULL
    LEFT JOIN captions c ON c.url = m.url
    WHERE m.kind = 'photo'
    GROUP BY m.url
"""


@dataclass(frozen=True)
class Photo:
    url: str
    batch: str
    attempts: int


def waiting_photos(conn: duckdb.DuckDBPyConnection, batches: list[str] | None, *, retry: bool) -> list[Photo]:
    """Photos with no caption yet (and the failed ones when `retry`), of the
    given batches (None: of every batch), in batch order."""
    return [Photo(*row) for row in waiting_rows(conn, PHOTOS_SQL, "url, batch, attempts", batches, retry=retry)]


def waiting_by_batch(conn: duckdb.DuckDBPyConnection, *, retry: bool = False) -> dict[str, int]:
    """How many photos wait, per sync batch."""
    return dict(Counter(photo.batch for photo in waiting_photos(conn, None, retry=retry)))


def photo_coverage(conn: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Photos of live bookmarks: total, captioned, failed, waiting."""
    total, ok, failed = conn.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE status = 'ok'), count(*) FILTER (WHERE status = 'failed')
            FROM ({PHOTOS_SQL})""").fetchone()
    return {"photos": total, "captioned": ok, "failed": failed, "waiting": total - ok - failed}


def caption_row(result: CaptionResult, photo: Photo, model: str, now: datetime) -> dict:
    return {
        "url": result.url,
        "caption": result.caption,
        "ocr_text": result.ocr_text if result.ok else None,
        "status": "ok" if result.ok else "failed",
        "reason": result.reason,
        "detail": result.detail,
        "model": model,
        "batch": photo.batch,
        "captioned_at": now,
        "attempts": photo.attempts + 1,
    }


def too_few_photos(waiting: int, min_photos: int = -1) -> str:
    """Why no caption run starts for `waiting` photos (all the photos that
    wait, over every batch), or "" when one starts. One rule for the sync
    and the sensor: a daily sync of a few photos must add up to a run.
    min_photos -1: settings.kb_caption_min_photos; 0: always a run."""
    threshold = min_photos if min_photos >= 0 else get_settings().kb_caption_min_photos
    if waiting >= threshold:
        return ""
    return (f"{waiting} photo(s) wait; a caption run starts at {threshold} "
            "(KB_CAPTION_MIN_PHOTOS; `kb caption` starts one now)")


class CaptionsConfig(WaitingConfig):
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
        photos = waiting_photos(conn, batches_of_run(context, config), retry=config.retry)
    batches = sorted({photo.batch for photo in photos})
    off = captioner.off_reason()
    if off:
        return _skipped(f"captions are off: {off}", len(photos), context)
    too_few = too_few_photos(len(photos), config.min_photos)
    if too_few:
        return _skipped(too_few, len(photos), context, below_threshold=True)
    all_waiting = len(photos)
    if config.limit > 0:
        photos = photos[:config.limit]

    model = captioner.model_name()
    by_url = {photo.url: photo for photo in photos}
    context.log.info(f"Captioning {len(photos)} photo(s) of {len(batches)} batch(es) with {model}")
    error: CaptionBackendError | None = None
    # The writer keeps what was captioned, also when the backend stopped.
    with ResultWriter(duckdb, "captions", WRITE_EVERY) as writer:
        try:
            for result in captioner.caption(list(by_url)):
                writer.add(caption_row(result, by_url[result.url], model, datetime.now(timezone.utc)))
        except CaptionBackendError as exc:
            error = exc

    written = writer.written
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


def captions_coverage(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    duckdb = duckdb.get_client()
    with duckdb.connect() as conn:
        numbers = photo_coverage(conn)
    return coverage_check(numbers, done=numbers["captioned"], total=numbers["photos"],
                          off=SOURCE in excluded_sources(), off_key="excluded")


CAPTIONS_COVERAGE = dg.AssetCheckSpec(
    "captions_coverage", asset="captions",
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
    check_specs=[CAPTIONS_COVERAGE],
)
def captions(
    context: dg.AssetExecutionContext, config: CaptionsConfig, duckdb: DuckDBResource, captioner: CaptionerResource
) -> dg.MaterializeResult:
    return with_checks(goes_on_after_failure(context, "kb caption", caption_photos, context, config, duckdb, captioner),
                       captions_coverage(duckdb))
