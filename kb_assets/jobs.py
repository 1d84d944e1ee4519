"""Jobs: named selections of the graph that sensors, schedules and `kb sync` run."""

import dagster as dg


# Every stage of the X bookmarks path, for one sync batch.
x_sync_job = dg.define_asset_job(
    "x_sync",
    # Partitioned by sync batch: Dagster infers it from the selected assets.
    selection=dg.AssetSelection.groups("x", "enrich", "index") - dg.AssetSelection.assets("wiki_index"),
    description="Capture new bookmarks and carry them through every stage to the index.",
)
