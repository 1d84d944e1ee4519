"""The Definitions that `dagster dev -w workspace.yaml` loads: every asset,
check, resource, job, sensor and schedule of kb."""

from __future__ import annotations

import dagster as dg

from kb_assets import capture, chunks, index, normalize
from kb_assets.jobs import x_sync_job
from kb_resources.browser import Browser
from kb_resources.duckdb_store import DuckDBStore
from kb_resources.embedder import Embedder
from kb_resources.lance_index import ChunkIndex
from kb_resources.raw_store import RawStore
from sensors.schedules import x_sync_sensor

STAGE_MODULES = [capture, normalize, chunks, index]


def build_resources() -> dict:
    """One instance of each resource. Paths come from the settings at run time."""
    return {
        "duckdb": DuckDBStore(),
        "raw_store": RawStore(),
        "browser": Browser(),
        "embedder": Embedder(),
        "lance": ChunkIndex(),
    }


all_assets = dg.load_assets_from_modules(STAGE_MODULES)
all_checks = dg.load_asset_checks_from_modules(STAGE_MODULES)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources=build_resources(),
    jobs=[x_sync_job],
    sensors=[x_sync_sensor],
)
