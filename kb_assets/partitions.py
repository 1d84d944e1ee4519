"""Partition sets of the graph.

Each X capture is one partition of `sync_batches`; every asset downstream of
the capture shares it, so a new sync processes only the new batch. Each
Telegram source is one partition of `sources`, added by the inbox sensor.
"""

from datetime import datetime, timezone

import dagster as dg

sync_batches = dg.DynamicPartitionsDefinition(name="sync_batches")
sources = dg.DynamicPartitionsDefinition(name="sources")


def new_batch_key(now: datetime | None = None) -> str:
    """A batch key that sorts by time, to the millisecond: 20261129T232154123Z."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
