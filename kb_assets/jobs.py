"""Jobs: named selections of the graph that sensors, schedules and `kb sync` run."""

import dagster as dg


# Every stage of the X bookmarks path, for one sync batch.
x_sync_job = dg.define_asset_job(
    "x_sync",
    # Partitioned by sync batch: Dagster infers it from the selected assets.
    selection=dg.AssetSelection.groups("x", "enrich", "index") - dg.AssetSelection.assets("wiki_index"),
    description="Capture new bookmarks and carry them through every stage to the index.",
)

captions_job = dg.define_asset_job(
    "captions_job",
    selection=dg.AssetSelection.assets("captions"),
    description="Caption the photos that wait, over a range of sync batches, in one run.",
)

# The stages after captions, for one sync batch: what carries new captions into the index.
INDEX_STAGES = ["chunks", "translations", "chunk_index"]

captions_to_index_job = dg.define_asset_job(
    "captions_to_index_job",
    selection=dg.AssetSelection.assets(*INDEX_STAGES),
    description="Carry new captions of one sync batch into its chunks, translations and index.",
)
