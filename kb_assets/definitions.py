"""The Definitions that `dagster dev -w workspace.yaml` loads: every asset,
check, resource, job, sensor and schedule of kb."""

from __future__ import annotations

import dagster as dg

from kb_assets import (
    capture,
    captions,
    chunks,
    documents,
    index,
    normalize,
    sources,
    transcripts,
    translations,
    wiki,
    wiki_checks,
    wiki_index,
)
from kb_assets.jobs import x_sync_job
from kb_assets.sources import source_intake_job
from kb_assets.wiki import wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job
from kb_resources.browser import Browser
from kb_resources.duckdb_store import DuckDBStore
from kb_resources.embedder import Embedder
from kb_resources.gate import QualityGate
from kb_resources.lance_index import ChunkIndex
from kb_resources.raw_store import RawStore
from kb_resources.transcriber import Transcriber
from kb_resources.translator import Translator
from kb_resources.vision import Captioner
from kb_resources.wiki import Wiki
from kb_resources.wiki_agent import WikiAgent
from sensors.captions import captions_sensor, captions_to_index_sensor
from sensors.run_health import dead_runs_sensor
from sensors.inbox import bot_requests_sensor, inbox_sensor, wiki_requests_sensor
from sensors.schedules import x_sync_sensor
from sensors.source_notifications import source_failures_sensor, source_outcomes_sensor
from telegram_bridge.notify import TelegramNotifier
from sensors.wiki import wiki_lint_schedule, wiki_synthesis_schedule, wiki_waiting_sensor

STAGE_MODULES = [
    capture, normalize, documents, captions, transcripts, chunks, translations, index,
    sources, wiki, wiki_checks, wiki_index,
]


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


all_assets = dg.load_assets_from_modules(STAGE_MODULES)
all_checks = dg.load_asset_checks_from_modules(STAGE_MODULES)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources=build_resources(),
    jobs=[x_sync_job, source_intake_job, wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job],
    schedules=[wiki_lint_schedule, wiki_synthesis_schedule],
    sensors=[
        x_sync_sensor, captions_sensor, captions_to_index_sensor,
        inbox_sensor, bot_requests_sensor, wiki_requests_sensor, source_outcomes_sensor, source_failures_sensor,
        wiki_waiting_sensor, dead_runs_sensor,
    ],
)
