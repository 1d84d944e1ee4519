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

The rules (which videos wait, their addresses, the result rows) are in
kb/enrich/video_queue.py.
"""

# No `from __future__ import annotations`: Dagster reads the config class
# from the real annotation of the asset function.
from collections import Counter

import dagster as dg

from kb.enrich.video_queue import SOURCE, transcribe_waiting, video_coverage, waiting_videos
from kb_assets.enrich.enrichment import (
    backend_stopped, coverage_check, failure_line, failure_list, failure_reasons, goes_on_after_failure, with_checks,
    batches_of_run, coverage_spec, from_batches, stage_check_spec)
from kb_assets.partitions import sync_batches
from kb_assets.run_choices import excluded_in_run
from kb.settings import excluded_sources
from kb_resources.services import TranscriberResource
from kb_resources.stores import DuckDBResource


class TranscriptsConfig(dg.Config):
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
        videos = waiting_videos(conn, batches_of_run(context), retry=config.retry)
    off = transcriber.off_reason()
    if off:
        context.log.info(f"No transcripts: {off}")
        return dg.MaterializeResult(metadata={"transcribed": 0, "waiting": len(videos), "skipped": off})
    all_waiting = len(videos)
    if config.limit > 0:
        videos = videos[:config.limit]

    model = transcriber.model_name()
    with_mp4 = {video.video_url for video in videos if video.video_url}
    context.log.info(f"Transcribing {len(with_mp4)} video(s) with {model} ({transcriber.backend_name()})")
    written, error = transcribe_waiting(
        duckdb, transcriber, videos,
        on_failure=lambda video, result: context.log.info(f"{video.url}: {result.reason} {result.detail or ''}".rstrip()))
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


def transcripts_coverage(duckdb: DuckDBResource, batches: list[str]) -> dg.AssetCheckResult:
    with duckdb.get_client().connect() as conn:
        numbers = video_coverage(conn, batches)
    return coverage_check(TRANSCRIPTS_COVERAGE.name, numbers, done=numbers["transcribed"], total=numbers["videos"],
                          off=SOURCE in excluded_sources(), off_key="excluded")


TRANSCRIPTS_COVERAGE = coverage_spec(
    "transcripts_coverage", "transcripts",
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
    check_specs=[TRANSCRIPTS_COVERAGE, stage_check_spec("transcripts")],
)
def transcripts(
    context: dg.AssetExecutionContext, config: TranscriptsConfig, duckdb: DuckDBResource, transcriber: TranscriberResource
) -> dg.MaterializeResult:
    result = goes_on_after_failure(context, "kb transcribe", transcribe_videos, context, config, duckdb, transcriber)
    return with_checks(context, result, transcripts_coverage(duckdb, batches_of_run(context)))
