"""The sync batches that hold work that waits, per stage: the plan of a
catch-up. A run of a partition takes only its own batch's items
(kb_assets/enrich/enrichment.py, batches_of_run), so the items of an older
batch (a link that a down browser did not fetch, photos, a translation
that Groq refused, a bookmark that the index could not embed) wait for a
run of that batch's partition. `kb sync` (kb/apps/sync.py) and the
catch-up sensors (sensors/capture_failed.py) start one run per batch that
this module names.

It reads; it writes nothing. The caller opens the connection (the sensors
open DuckDB read-only) and reads the index first (indexed_passages): an
open DuckDB connection locks the file for every other process.
"""

from __future__ import annotations

import duckdb

from kb.documents.document_store import fetchable, targets_for_batch
from kb.enrich.foreign_text import waiting_by_batch as foreign_by_batch
from kb.enrich.photo_queue import SOURCE as PHOTO_SOURCE, too_few_photos, waiting_photos
from kb.enrich.video_queue import SOURCE as VIDEO_SOURCE, waiting_videos
from kb.index.batch_index import unindexed_bookmarks
from kb.queries import unchunked_bookmarks

# The stages whose items wait in a batch, in the order of the graph.
STAGES = ("documents", "captions", "transcripts", "translations", "chunks", "chunk_index")


def waiting_work(conn: duckdb.DuckDBPyConnection, stored: dict[str, list[str]], skip: set[str], *,
                 stages: set[str] | frozenset[str] = frozenset(STAGES), x_login: bool = True,
                 batches: list[str] | None = None) -> dict[str, dict[str, int]]:
    """{batch: {stage: items that wait}} for each batch with work that waits
    in one of `stages` (a stage whose service is off or stopped is left out
    by the caller: its items would make a run that does nothing).

    `stored`: the passages in the index (batch_index.indexed_passages).
    `skip`: the source kinds that the run leaves out. `x_login`: False when
    there is no X login: the X Articles that need it do not count. Only the
    `batches` given count (None: every batch)."""
    found: dict[str, dict[str, int]] = {}

    def add(stage: str, batch: str | None, count: int = 1) -> None:
        if batch is not None and count > 0 and (batches is None or batch in batches):
            counts = found.setdefault(batch, {})
            counts[stage] = counts.get(stage, 0) + count

    if "documents" in stages:
        for target in fetchable(targets_for_batch(conn, None, retry=False), skip):
            if x_login or not target.is_article or target.article_text:
                add("documents", target.batch)
    if "captions" in stages and PHOTO_SOURCE not in skip:
        photos = waiting_photos(conn, None, retry=False)
        # The rule of the caption run: too few photos over every batch make no run.
        if not too_few_photos(len(photos)):
            for photo in photos:
                add("captions", photo.batch)
    if "transcripts" in stages and VIDEO_SOURCE not in skip:
        for video in waiting_videos(conn, None, retry=False):
            add("transcripts", video.batch)
    if "translations" in stages:
        for batch, count in foreign_by_batch(conn, skip).items():
            add("translations", batch, count)
    if "chunks" in stages:
        for _, batch in unchunked_bookmarks(conn):
            add("chunks", batch)
    if "chunk_index" in stages:
        for _, batch in unindexed_bookmarks(conn, stored, skip):
            add("chunk_index", batch)
    return dict(sorted(found.items()))
