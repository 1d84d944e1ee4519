"""Asset `transcripts`: the speech in each video of the bookmarks.

Each transcript is a document of kind video, keyed by the address that X
shows for the video: https://x.com/<handle>/status/<id>/video/<n> (n counts
the media of that post from 1). The text has one paragraph per minute, each
led by [m:ss]. The model reads the smallest MP4: less to download, and the
sound is the same in every variant.

- A download that is shorter than its Content-Length fails (`truncated`):
  a cut video decodes to silence without a word.
- No detected language is a failure (`no_language`).
- No speech is a result: word_count 0, status ok. It is done (never tried
  again) and never served (the chunker skips it).
- One transcript per media_key: a video that several posts show is
  transcribed once.
- A failure is tried again only on request (run config `retry`).

No DuckDB connection (and so no writer lock) is open while a video
downloads or the model works: each group of results is written in its own
short transaction, so an interrupted run keeps what it did.
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
from kb_assets.enrich.enrichment import (
    ResultWriter, backend_stopped, coverage_check, failure_line, failure_list, failure_reasons, waiting_rows,
    goes_on_after_failure, with_checks, WaitingConfig, batches_of_run, from_batches)
from kb_assets.partitions import sync_batches
from kb.enrich.transcriber import TranscribeBackendError, TranscriptResult
from kb_resources.services import TranscriberResource
from kb_resources.stores import DuckDBResource

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


def video_coverage(conn: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Videos of live bookmarks: total, transcribed (with or without speech), failed, waiting."""
    total, ok, speech, failed = conn.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE status = 'ok'),
                   count(*) FILTER (WHERE status = 'ok' AND word_count > 0),
                   count(*) FILTER (WHERE status = 'failed')
            FROM ({VIDEOS_SQL})""").fetchone()
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


class TranscriptsConfig(WaitingConfig):
    limit: int = 0  # most videos in this run; 0: every video that waits
    retry: bool = False  # transcribe the failed videos again


def transcribe_videos(
    context: dg.AssetExecutionContext, config: TranscriptsConfig, duckdb: DuckDBResource, transcriber: TranscriberResource
) -> dg.MaterializeResult:
    duckdb, transcriber = duckdb.get_client(), transcriber.get_client()
    if SOURCE in excluded_in_run(context):
        context.log.info(f"No transcripts: the owner excluded the source {SOURCE!r}")
        return dg.MaterializeResult(metadata={"transcribed": 0, "skipped": f"the source {SOURCE!r} is excluded"})
    with duckdb.connect() as conn:
        videos = waiting_videos(conn, batches_of_run(context, config), retry=config.retry)
    off = transcriber.off_reason()
    if off:
        context.log.info(f"No transcripts: {off}")
        return dg.MaterializeResult(metadata={"transcribed": 0, "waiting": len(videos), "skipped": off})
    all_waiting = len(videos)
    if config.limit > 0:
        videos = videos[:config.limit]

    model = transcriber.model_name()
    now = lambda: datetime.now(timezone.utc)  # noqa: E731
    # A video with no MP4 variant cannot be read: that is its result.
    no_mp4 = [v for v in videos if not v.video_url]
    by_mp4 = {v.video_url: v for v in videos if v.video_url}
    context.log.info(f"Transcribing {len(by_mp4)} video(s) with {model} ({transcriber.backend_name()})")
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
                    context.log.info(f"{video.url}: {result.reason} {result.detail or ''}".rstrip())
        except TranscribeBackendError as exc:
            error = exc

    written = writer.written
    metadata = {
        "transcribed": sum(row["status"] == "ok" for row in written),
        "no_speech": sum(row["status"] == "ok" and row["word_count"] == 0 for row in written),
        "failed": failure_reasons(written),
        "failures": failure_list([failure_line(r["url"], r["reason"], r["detail"])
                                  for r in written if r["status"] == "failed"]),
        "languages": dg.MetadataValue.json(dict(Counter(r["language"] for r in written if r["status"] == "ok"))),
        "waiting": all_waiting - len(written),
        "from_batches": from_batches(video.batch for video in videos),
        "model": model,
        "retry": config.retry,
    }
    if error:
        return backend_stopped(context, "transcription", error, len(written), "videos", metadata)
    return dg.MaterializeResult(metadata=metadata)


def transcripts_coverage(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    duckdb = duckdb.get_client()
    with duckdb.connect() as conn:
        numbers = video_coverage(conn)
    return coverage_check(numbers, done=numbers["transcribed"], total=numbers["videos"],
                          off=SOURCE in excluded_sources(), off_key="excluded")


TRANSCRIPTS_COVERAGE = dg.AssetCheckSpec(
    "transcripts_coverage", asset="transcripts",
    description="Share of the videos that have a transcript (a video with no speech counts as done). "
    "Passes when no video waits.")


# The coverage check runs in this step: see with_checks().
@dg.asset(
    partitions_def=sync_batches,
    deps=["media", "bookmarks"],
    group_name="enrich",
    kinds={"duckdb"},
    description="The speech in each video of the bookmarks: a document of kind video, keyed "
    "https://x.com/<handle>/status/<id>/video/<n>, one paragraph per minute led by [m:ss].",
    check_specs=[TRANSCRIPTS_COVERAGE],
)
def transcripts(
    context: dg.AssetExecutionContext, config: TranscriptsConfig, duckdb: DuckDBResource, transcriber: TranscriberResource
) -> dg.MaterializeResult:
    return with_checks(goes_on_after_failure(context, "kb transcribe", transcribe_videos, context, config, duckdb,
                                             transcriber), transcripts_coverage(duckdb))
