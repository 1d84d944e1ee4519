"""Stage 1, X: the asset x_raw_pages. It captures the owner's bookmarks as
raw GraphQL pages into one sync batch, or imports saved answers (`files`).

The rules (when to stop, 429 waits, resume, folders, threads, import) are
in the core: kb/x/capture_run.py. This module reads the resources, calls
capture_batch(), and turns its outcome into Dagster metadata.
"""

# No `from __future__ import annotations` here: Dagster reads the type of
# the `config` parameter at definition time and cannot resolve a string.
from pathlib import Path

import dagster as dg
from pydantic import Field

from kb_assets.partitions import sync_batches
from kb_assets.run_config_rules import check_import_files
from kb.x.capture import CaptureProgress
from kb.x.capture_import import ImportInputError
from kb.x.capture_run import capture_batch
from kb_resources.services import BrowserResource
from kb_resources.stores import RawStoreResource

METADATA_LIST_LIMIT = 20  # keep the run metadata readable in the UI


class CaptureConfig(dg.Config):
    full: bool = Field(False, description="Ignore the watermark and capture to the end. Normalize marks bookmarks that are gone.")
    files: list[str] = Field(default_factory=list, description="Import these saved answers (Bookmarks pages, folder lists, folder pages, TweetDetail) byte for byte, with no browser.")
    max_pages: int = Field(0, description="Stop after this many pages (0: no limit). Such a capture is not complete.")


def capture_metadata(progress: CaptureProgress, batch_dir: Path, answers: int = 0) -> dict:
    return {
        "answers": answers,  # folder lists, folder pages and threads: the batch holds them besides the pages
        "folders": len(progress.folders),
        "folders_read": len(progress.folders_done),
        "folder_notes": dg.MetadataValue.json(progress.folder_notes[:METADATA_LIST_LIMIT]),
        "threads_read": len(progress.threads),
        "thread_notes": dg.MetadataValue.json(progress.thread_notes[:METADATA_LIST_LIMIT]),
        "pages": len(progress.pages),
        "tweets": len(progress.tweet_ids),
        "met_watermark": progress.met_watermark,
        "complete": progress.complete,
        "stop_reason": progress.stop_reason,
        "bad_pages": len(progress.bad_pages),
        # "<file>: <reason>" for each page that is not a Bookmarks page: the end report names them.
        "unreadable_pages": dg.MetadataValue.json(progress.bad_pages[:METADATA_LIST_LIMIT]),
        "rate_limit_waits": len(progress.rate_limit_waits),
        "batch_dir": dg.MetadataValue.path(str(batch_dir)),
    }


@dg.asset(
    partitions_def=sync_batches,
    group_name="x",
    kinds={"playwright", "json"},
    description="Raw X GraphQL answers of one sync batch, kept as they came: Bookmarks pages, the folder list "
                "and each folder's pages, and TweetDetail answers of bookmarked threads.",
)
def x_raw_pages(
    context: dg.AssetExecutionContext,
    config: CaptureConfig,
    browser: BrowserResource,
    raw_store: RawStoreResource,
) -> dg.MaterializeResult:
    if config.files:
        # Before any write: the launchpad of the UI can set these paths too.
        check_import_files(config.files)
    browser, raw_store = browser.get_client(), raw_store.get_client()
    batch = context.partition_key
    try:
        outcome = capture_batch(browser, raw_store, batch, full=config.full, files=config.files,
                                max_pages=config.max_pages, log=context.log)
    except ImportInputError as exc:
        raise dg.Failure(description=str(exc)) from exc
    metadata = capture_metadata(outcome.progress, raw_store.batch_dir(batch), answers=len(raw_store.answers(batch)))
    if outcome.error is not None:
        raise dg.Failure(description=outcome.cut_off_message(), metadata=metadata) from outcome.error
    return dg.MaterializeResult(metadata=metadata)
