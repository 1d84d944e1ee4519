"""`kb extract`, `kb transcribe`, `kb translate`, `kb normalize`: one stage
for every sync batch that has work waiting, then the index of that batch.

Each batch gets one run of a job of the code location (kb_assets/jobs.py),
in the instance under KB_HOME, where `kb sync` and `kb caption` run
theirs: at kb up's daemon, or in this process (kb/apps/sync.py, class Runs). The per-run choices go in the op config
(`limit`, `retry`), never in the environment: a run that the UI re-executes
carries them too.

A command fails (exit 1) when a stage fails, when an item fails (it names
the item and the reason), and when the stage is off (it says why).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kb.apps.run_report import failed_items, index_failures, skipped, unreadable_pages
from kb.apps.sync import SyncReport, known_batches, run_batches
from kb.store.duckdb_store import DuckDBStore
from kb.settings import excluded_sources

OnStage = Callable[[str, int, int], None] | None
# Each run takes its own batch's items (as every run of a partition does):
# the plan below gives each run its share of --limit.


def limited(waiting: dict[str, int], limit: int) -> list[tuple[str, int]]:
    """(batch, most items for its run) for each batch with waiting items,
    oldest first, so that all runs together take at most `limit` items
    (0: no limit, and each run takes every item of its batch)."""
    plan: list[tuple[str, int]] = []
    left = limit
    for batch in sorted(waiting):
        if limit <= 0:
            plan.append((batch, 0))
            continue
        if left <= 0:
            break
        take = min(left, waiting[batch])
        plan.append((batch, take))
        left -= take
    return plan


def _nothing_waits(title: str, what: str) -> SyncReport:
    report = SyncReport(batch="", title=title)
    report.notes.append(f"No {what} waits.")
    return report


def _item_problems(report: SyncReport, asset: str) -> SyncReport:
    report.problems += skipped(report, asset) + failed_items(report, asset) + index_failures(report)
    return report


def run_extract(*, limit: int = 0, retry: bool = False, on_stage: OnStage = None) -> SyncReport:
    """`kb extract`: fetch the documents behind the links that wait (and the
    failed ones with `retry`), then index them."""
    from kb.documents.document_store import fetchable, targets_for_batch

    batches = set(known_batches())
    with DuckDBStore.from_settings().connect() as conn:
        targets = fetchable(targets_for_batch(conn, None, retry=retry), excluded_sources())
    waiting = Counter(target.batch for target in targets if target.batch in batches)
    if not waiting:
        return _nothing_waits("Extract", "link or X Article")
    plan = [(batch, {"documents": {"config": {"limit": most, "retry": retry}}})
            for batch, most in limited(dict(waiting), limit)]
    return _item_problems(run_batches("extract_job", plan, title="Extract", on_stage=on_stage), "documents")


def run_transcribe(*, limit: int = 0, retry: bool = False, on_stage: OnStage = None) -> SyncReport:
    """`kb transcribe`: transcribe the videos that wait (and the failed ones
    with `retry`), then index them. The job never retries by itself: a
    retry would start a GPU or a paid service again."""
    from kb.enrich.video_queue import waiting_videos

    batches = set(known_batches())
    with DuckDBStore.from_settings().connect() as conn:
        waiting = Counter(video.batch for video in waiting_videos(conn, None, retry=retry) if video.batch in batches)
    if not waiting:
        return _nothing_waits("Transcribe", "video")
    plan = [(batch, {"transcripts": {"config": {"limit": most, "retry": retry}}})
            for batch, most in limited(dict(waiting), limit)]
    return _item_problems(run_batches("transcribe_job", plan, title="Transcribe", on_stage=on_stage), "transcripts")


def run_translate(*, limit: int = 0, on_stage: OnStage = None) -> SyncReport:
    """`kb translate`: translate the foreign passages that wait, then index them."""
    from kb.enrich.foreign_text import waiting_by_batch

    batches = set(known_batches())
    with DuckDBStore.from_settings().connect() as conn:
        waiting = {b: n for b, n in waiting_by_batch(conn, excluded_sources()).items() if b in batches}
    if not waiting:
        return _nothing_waits("Translate", "foreign passage")
    plan = [(batch, {"translations": {"config": {"limit": most}}}) for batch, most in limited(waiting, limit)]
    return _item_problems(run_batches("translate_job", plan, title="Translate", on_stage=on_stage), "translations")


def run_normalize(*, on_stage: OnStage = None) -> SyncReport:
    """`kb normalize`: the tables bookmarks, authors, media and links again
    from every raw page, oldest batch first (the later batch wins for a post
    that two batches hold, as in the syncs). A batch on disk that the
    instance does not know (a restore without the Dagster home) is added."""
    import dagster as dg

    from kb.x.raw_store import RawStore
    from kb_assets.partitions import sync_batches

    on_disk = sorted(RawStore.from_settings().batches())
    if not on_disk:
        report = SyncReport(batch="", title="Normalize")
        report.problems.append(f"No raw pages in {RawStore.from_settings().x_dir()}: "
                               "run `kb sync` or `kb import PAGE.json` first.")
        return report
    new = sorted(set(on_disk) - set(known_batches()))
    if new:
        dg.DagsterInstance.get().add_dynamic_partitions(sync_batches.name, new)
    report = run_batches("normalize_job", [(batch, {}) for batch in on_disk], title="Normalize", on_stage=on_stage)
    report.problems += unreadable_pages(report, "bookmarks")
    return report
