"""The Definitions that `dagster dev -w workspace.yaml` loads: every asset,
check, resource, job, sensor and schedule of kb."""

from __future__ import annotations

import dagster as dg

from kb_assets import enrich, index, telegram, wiki, x
from kb_assets.instance_config import ensure_on_load
from kb_assets.jobs import index_rebuild_job, wiki_index_job, x_sync_job
from kb_assets.telegram.sources import source_intake_job
from kb_assets.wiki.wiki_pages import wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job
from kb_resources.browser import Browser
from kb_resources.duckdb_store import DuckDBStore
from kb_resources.embedder import Embedder
from kb_resources.gate import QualityGate
from kb_resources.lance_index import ChunkIndex
from kb_resources.raw_store import RawStore
from kb_resources.transcriber import Transcriber
from kb_resources.translator import Translator
from kb_resources.vision import Captioner
from kb_resources.wiki_repo import Wiki
from kb_resources.wiki_agent import WikiAgent
from sensors.waiting_photos import captions_sensor, captions_to_index_sensor
from sensors.telegram_inbox import bot_requests_sensor, inbox_sensor, wiki_requests_sensor
from sensors.x_sync_sensor import x_sync_sensor
from sensors.source_outcomes import source_failures_sensor, source_outcomes_sensor
from kb_resources.telegram_notifier import TelegramNotifier
from sensors.wiki_schedules import wiki_lint_schedule, wiki_synthesis_schedule, wiki_waiting_sensor

# dagster dev, the daemon and every code server load this module: each of
# them then finds kb's dagster.yaml (pools, run monitoring, retries).
ensure_on_load()

# One package per asset group, as the Dagster UI shows them.
ASSET_GROUPS = [x, enrich, index, telegram, wiki]


def build_resources() -> dict:
    """One instance of each resource. Paths come from the settings at run time."""
    return {
        "duckdb": DuckDBStore(),
        "raw_store": RawStore(),
        "browser": Browser(),
        "embedder": Embedder(),
        "lance": ChunkIndex(),
        "captioner": Captioner(),
        "transcriber": Transcriber(),
        "translator": Translator(),
        "gate": QualityGate(),
        "telegram": TelegramNotifier(),
        "wiki": Wiki(),
        "wiki_agent": WikiAgent(),
    }


all_assets = [a for group in ASSET_GROUPS for a in dg.load_assets_from_package_module(group)]
all_checks = [c for group in ASSET_GROUPS for c in dg.load_asset_checks_from_package_module(group)]

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources=build_resources(),
    jobs=[x_sync_job, index_rebuild_job, wiki_index_job, source_intake_job, wiki_ingest_job, wiki_lint_job,
          wiki_synthesis_job, wiki_topic_job],
    schedules=[wiki_lint_schedule, wiki_synthesis_schedule],
    sensors=[
        x_sync_sensor, captions_sensor, captions_to_index_sensor,
        inbox_sensor, bot_requests_sensor, wiki_requests_sensor, source_outcomes_sensor, source_failures_sensor,
        wiki_waiting_sensor,
    ],
)
