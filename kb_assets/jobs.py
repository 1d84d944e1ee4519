"""Jobs: named selections of the graph that sensors, schedules and `kb sync` run."""

import dagster as dg

from kb_assets.partitions import sync_batches

# Every stage of the X bookmarks path, for one sync batch.
x_sync_job = dg.define_asset_job(
    "x_sync",
    selection=dg.AssetSelection.groups("x", "enrich", "index"),
    partitions_def=sync_batches,
    description="Capture new bookmarks and carry them through every stage to the index.",
)
