"""The videos that wait for a transcript, and the run that transcribes them
and stores each result (the `transcripts` table).

Each transcript is a document of kind video, keyed by the address that X
shows for the video: https://x.com/<handle>/status/<id>/video/<n> (n counts
the media of that post from 1). One transcript per media_key: a video that
several posts show is transcribed once. A video with no MP4 variant cannot
be read: that is its result (`no_mp4`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb

from kb.store.duckdb_store import DuckDBStore
from kb.enrich.transcriber import TranscribeBackendError, Transcriber, TranscriptResult
from kb.enrich.waiting_items import ResultWriter, waiting_rows

SOURCE = "video"  # the chunk source that transcripts feed; `exclude = ["video"]` turns this stage off
WRITE_EVERY = 5  # results per write: a video takes long, so write often

# Every video of a live bookmark, one row per media_key, with its address.
# A quoted post's media belongs to the quoted post: its handle and id.
# media.position counts the bookmark's own media first, then the quoted
# post's, so n restarts for the quoted post.
VIDEOS_SQL = """
    WITH numbered AS (
        SELECT m.media_key, m.kind, m.smallest_mp4, b.batch,
               CASE WHEN m.from_quote
                    THEN 'https://x.com/' || coalesce(b.quoted_author_handle, 'i') || '/status/' || b.quoted_tweet_id
                    ELSE b.url END
               || '/video/' || row_number() OVER (PARTITION BY m.tweet_id, m.from_quote ORDER BY m.position) AS url
        FROM media m JOIN bookmarks b ON b.tweet_id = m.tweet_id AND b.removed_at IS NULL
    )
    SELECT n.media_key, min(n.url) AS url, any_value(n.smallest_mp4) AS video_url, min(n.batch) AS batch,
           any_value(t.status) AS status, coalesce(any_value(t.attempts), 0) AS attempts,
           coalesce(any_value(t.word_count), 0) AS word_count
    FROM numbered n LEFT JOIN transcripts t ON t.media_key = n.media_key
    WHERE n.kind = 'video'
    GROUP BY n.media_key
"""


@dataclass(frozen=True)
class Video:
    media_key: str
    url: str  # the key: https://x.com/<handle>/status/<id>/video/<n>
    video_url: str | None  # the smallest MP4
    batch: str
    attempts: int


def waiting_videos(conn: duckdb.DuckDBPyConnection, batches: list[str] | None, *, retry: bool) -> list[Video]:
    """Videos of the batches (None: of every batch) with no transcript yet
    (and the failed ones when `retry`)."""
    rows = waiting_rows(conn, VIDEOS_SQL, "media_key, url, video_url, batch, attempts", batches, retry=retry)
    return [Video(*row) for row in rows]


def video_coverage(conn: duckdb.DuckDBPyConnection, batches: list[str] | None = None) -> dict[str, int]:
    """Videos of live bookmarks: total, transcribed (with or without speech),
    failed, waiting; of the given batches (None: of every batch)."""
    total, ok, speech, failed = conn.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE status = 'ok'),
                   count(*) FILTER (WHERE status = 'ok' AND word_count > 0),
                   count(*) FILTER (WHERE status = 'failed')
            FROM ({VIDEOS_SQL}) WHERE ? OR list_contains(?, batch)""", [batches is None, batches or []]).fetchone()
    return {"videos": total, "transcribed": ok, "with_speech": speech, "failed": failed,
            "waiting": total - ok - failed}


def transcript_row(video: Video, result: TranscriptResult, model: str, now: datetime) -> dict:
    return {
        "url": video.url,
        "media_key": video.media_key,
        "kind": "video",
        "video_url": video.video_url or "",
        "language": result.language,
        "language_probability": result.language_probability,
        "duration_s": result.duration_s,
        "text": result.text if result.ok else None,
        "word_count": result.word_count if result.ok else 0,
        "status": "ok" if result.ok else "failed",
        "reason": result.reason,
        "detail": result.detail,
        "model": model,
        "batch": video.batch,
        "transcribed_at": now,
        "attempts": video.attempts + 1,
    }


def transcribe_waiting(duckdb: DuckDBStore, transcriber: Transcriber, videos: list[Video],
                       on_failure: Callable[[Video, TranscriptResult], None] = lambda _v, _r: None
                       ) -> tuple[list[dict], TranscribeBackendError | None]:
    """Transcribe the videos and store each result as it comes; a failed
    video also goes to `on_failure`. Returns the rows written, and the
    error that stopped the backend (None when it did not stop): the rows
    before the stop are stored, the other videos wait."""
    model = transcriber.model_name()
    now = lambda: datetime.now(timezone.utc)  # noqa: E731
    no_mp4 = [v for v in videos if not v.video_url]
    by_mp4 = {v.video_url: v for v in videos if v.video_url}
    error: TranscribeBackendError | None = None
    # The writer keeps what was transcribed, also when the backend stopped.
    with ResultWriter(duckdb, "transcripts", WRITE_EVERY) as writer:
        for video in no_mp4:
            writer.add(transcript_row(
                video, TranscriptResult("", reason="no_mp4", detail=f"{video.url}: X offers no MP4 variant"),
                model, now()))
        try:
            for result in transcriber.transcribe(list(by_mp4)):
                video = by_mp4[result.video_url]
                writer.add(transcript_row(video, result, model, now()))
                if not result.ok:
                    on_failure(video, result)
        except TranscribeBackendError as exc:
            error = exc
    return writer.written, error
