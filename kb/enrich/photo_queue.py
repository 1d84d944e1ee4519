"""The photos that wait for a caption, the rule that says when enough of
them wait for a run, and the run that captions them and stores each result
(the `captions` table).

Photos wait until enough of them make a run worth its start: with the Modal
backend a GPU start costs the same for 1 photo as for 600. One rule
(too_few_photos) serves the sync and the sensor.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb

from kb.store.duckdb_store import DuckDBStore
from kb.enrich.vision import CaptionBackendError, Captioner, CaptionResult
from kb.enrich.waiting_items import ResultWriter, waiting_rows
from kb.settings import get_settings

SOURCE = "image"  # the chunk source that captions feed; `exclude = ["image"]` turns this stage off
WRITE_EVERY = 25  # results per write: an interrupted run loses at most this many

# Photos of live bookmarks, one row per photo URL, with the batch of the
# bookmark that shows it (a bookmark belongs to the batch that captured it
# last).
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


def photo_coverage(conn: duckdb.DuckDBPyConnection, batches: list[str] | None = None) -> dict[str, int]:
    """Photos of live bookmarks: total, captioned, failed, waiting; of the
    given batches (None: of every batch)."""
    total, ok, failed = conn.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE status = 'ok'), count(*) FILTER (WHERE status = 'failed')
            FROM ({PHOTOS_SQL}) WHERE ? OR list_contains(?, batch)""", [batches is None, batches or []]).fetchone()
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


def caption_waiting(duckdb: DuckDBStore, captioner: Captioner,
                    photos: list[Photo]) -> tuple[list[dict], CaptionBackendError | None]:
    """Caption the photos and store each result as it comes. Returns the
    rows written, and the error that stopped the backend (None when it did
    not stop): the rows before the stop are stored, the other photos wait."""
    model = captioner.model_name()
    by_url = {photo.url: photo for photo in photos}
    error: CaptionBackendError | None = None
    # The writer keeps what was captioned, also when the backend stopped.
    with ResultWriter(duckdb, "captions", WRITE_EVERY) as writer:
        try:
            for result in captioner.caption(list(by_url)):
                writer.add(caption_row(result, by_url[result.url], model, datetime.now(timezone.utc)))
        except CaptionBackendError as exc:
            error = exc
    return writer.written, error
