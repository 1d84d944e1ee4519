"""Jobs: named selections of the graph that sensors, schedules and `kb sync` run."""

import dagster as dg

# Jobs with a GPU stage (captions, transcripts) never retry by themselves: a
# retry would start a GPU again. Only `kb caption --retry` tries failed items
# again, and `kb sync` finishes an unfinished batch at its next start.
NO_RETRY = {"dagster/max_retries": "0"}

# Every stage of the X bookmarks path, for one sync batch.
x_sync_job = dg.define_asset_job(
    "x_sync",
    # Partitioned by sync batch: Dagster infers it from the selected assets.
    selection=dg.AssetSelection.groups("x", "documents", "enrich", "index") - dg.AssetSelection.assets("wiki_index"),
    description="Capture new bookmarks and carry them through every stage to the index.",
    # One process for the whole batch: the steps run in order, and one
    # process loads the embedding model once.
    executor_def=dg.in_process_executor,
    tags=NO_RETRY,
)

# `kb capture`: the capture of new bookmarks and their tables, no other
# stage. The next sync takes their enrichment and index: its catch-up runs
# the batch's partition (kb/apps/sync.py, catch_up).
capture_job = dg.define_asset_job(
    "capture_job",
    selection=dg.AssetSelection.groups("x"),
    description="Capture new bookmarks and store their tables, with no enrichment and no index: `kb capture`.",
    executor_def=dg.in_process_executor,
)

# The stages after the capture, for one sync batch: the work that waits in
# that batch. A sync runs it for each earlier batch with waiting work (the
# catch-up: kb/apps/sync.py, sensors/capture_failed.py); one run per batch,
# so each partition's materialization holds only its own batch's items.
x_catch_up_job = dg.define_asset_job(
    "x_catch_up",
    selection=dg.AssetSelection.groups("documents", "enrich", "index") - dg.AssetSelection.assets("wiki_index"),
    description="Carry the work that waits in one sync batch to the index, with no capture.",
    executor_def=dg.in_process_executor,
    tags=NO_RETRY,
)

captions_job = dg.define_asset_job(
    "captions_job",
    selection=dg.AssetSelection.assets("captions"),
    description="Caption the photos that wait, over a range of sync batches, in one run.",
    executor_def=dg.in_process_executor,
    tags=NO_RETRY,
)

# The stages after captions, for one sync batch: what carries new captions into the index.
INDEX_STAGES = ["chunks", "translations", "chunk_index"]

captions_to_index_job = dg.define_asset_job(
    "captions_to_index_job",
    selection=dg.AssetSelection.assets(*INDEX_STAGES),
    description="Carry new captions of one sync batch into its chunks, translations and index.",
    # Steps in order: one process, one model load.
    executor_def=dg.in_process_executor,
)

# `kb index --rebuild`: the index of one sync batch again, after a change of
# embedding model; then the wiki's index.
index_rebuild_job = dg.define_asset_job(
    "index_rebuild",
    selection=dg.AssetSelection.assets("chunk_index"),
    description="Index one sync batch again (after a change of embedding model): `kb index --rebuild`.",
    executor_def=dg.in_process_executor,
)

# `kb index --rebuild`: the passages of one approved Telegram source again.
source_index_job = dg.define_asset_job(
    "source_index_job",
    selection=dg.AssetSelection.assets("source_passages"),
    description="Index one Telegram source again (after a change of embedding model): `kb index --rebuild`.",
    executor_def=dg.in_process_executor,
)

wiki_index_job = dg.define_asset_job(
    "wiki_index_job",
    selection=dg.AssetSelection.assets("wiki_index"),
    description="Index the wiki pages again.",
    executor_def=dg.in_process_executor,
)

# The stage commands: one run per sync batch that has work waiting, which
# carries the new results into the index of that batch.

# `kb extract`: fetch the documents behind the links, then index them.
extract_job = dg.define_asset_job(
    "extract_job",
    selection=dg.AssetSelection.assets("documents", *INDEX_STAGES),
    description="Fetch the documents that wait in one sync batch, then index them: `kb extract`.",
    executor_def=dg.in_process_executor,
)

# `kb transcribe`: a GPU or remote stage, so the run never retries by itself.
transcribe_job = dg.define_asset_job(
    "transcribe_job",
    selection=dg.AssetSelection.assets("transcripts", *INDEX_STAGES),
    description="Transcribe the videos that wait in one sync batch, then index them: `kb transcribe`.",
    executor_def=dg.in_process_executor,
    tags=NO_RETRY,
)

# `kb translate`: translations are cached by text, and the index shows them.
translate_job = dg.define_asset_job(
    "translate_job",
    selection=dg.AssetSelection.assets("translations", "chunk_index"),
    description="Translate the foreign passages that wait in one sync batch, then index them: `kb translate`.",
    executor_def=dg.in_process_executor,
)

# `kb normalize`: the tables bookmarks, authors, media, links, folders and
# threads of one sync batch again, from its raw answers.
normalize_job = dg.define_asset_job(
    "normalize_job",
    selection=dg.AssetSelection.assets("bookmarks", "authors", "media", "links", "bookmark_folders",
                                       "author_threads"),
    description="Rebuild the normalized tables of one sync batch from its raw pages: `kb normalize`.",
    executor_def=dg.in_process_executor,
)
