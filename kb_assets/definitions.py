"""The Definitions that `dagster dev -w workspace.yaml` loads: every asset,
check, resource, job, sensor and schedule of kb."""

from __future__ import annotations

import gc

import dagster as dg

from kb_assets import documents, enrich, index, telegram, wiki, x
from kb_assets.backups import backup_job
from kb_assets.instance_config import ensure_on_load
from kb_assets.jobs import (
    captions_job, captions_to_index_job, extract_job, index_rebuild_job, normalize_job, source_index_job,
    transcribe_job, translate_job, wiki_index_job, x_catch_up_job, x_sync_job, capture_job)
from kb_assets.telegram.sources import source_intake_job
from kb_assets.wiki.wiki_pages import wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job
from kb.private_files import private_process
from kb.settings import Settings, get_settings
from kb_resources.services import (
    BrowserResource,
    CaptionerResource,
    EmbedderResource,
    QualityGateResource,
    TelegramNotifierResource,
    TranscriberResource,
    TranslatorResource,
    WikiAgentResource,
)
from kb_resources.stores import ChunkIndexResource, DuckDBResource, InboxResource, RawStoreResource, WikiResource
from sensors.backup_schedule import backup_schedule
from sensors.waiting_photos import captions_sensor, captions_to_index_sensor
from sensors.inbox_folder import bot_requests_sensor, inbox_sensor, wiki_requests_sensor
from sensors.capture_failed import x_catch_up_sensor
from sensors.x_sync_sensor import x_full_sync_sensor, x_sync_sensor
from sensors.source_outcomes import run_endings_sensor, source_outcomes_sensor
from sensors.wiki_results import wiki_results_sensor
from sensors.stuck_steps import stuck_steps_sensor
from sensors.wiki_schedules import wiki_lint_schedule, wiki_synthesis_schedule, wiki_waiting_sensor

# Each file that a run writes is the owner's only: `dagster dev` and the
# run workers it starts do not come through the kb CLI (kb/private_files.py).
private_process()
# dagster dev, the daemon and every code server load this module: each of
# them then finds kb's dagster.yaml (pools, run monitoring, retries).
ensure_on_load()

# One package per asset group, as the Dagster UI shows them.
ASSET_GROUPS = [x, documents, enrich, index, telegram, wiki]


def build_resources(settings: Settings | None = None) -> dict:
    """One instance of each resource, built from the settings once. The
    resource keys are the parameter names of the assets and sensors."""
    settings = settings or get_settings()
    return {
        "duckdb": DuckDBResource.from_settings(settings),
        "raw_store": RawStoreResource.from_settings(settings),
        "lance": ChunkIndexResource.from_settings(settings),
        "wiki": WikiResource.from_settings(settings),
        "inbox": InboxResource.from_settings(settings),
        "browser": BrowserResource.from_settings(settings),
        "embedder": EmbedderResource.from_settings(settings),
        "captioner": CaptionerResource.from_settings(settings),
        "transcriber": TranscriberResource.from_settings(settings),
        "translator": TranslatorResource.from_settings(settings),
        "gate": QualityGateResource.from_settings(settings),
        "telegram": TelegramNotifierResource.from_settings(settings),
        "wiki_agent": WikiAgentResource.from_settings(settings),
    }


all_assets = [a for group in ASSET_GROUPS for a in dg.load_assets_from_package_module(group)]
all_checks = [c for group in ASSET_GROUPS for c in dg.load_asset_checks_from_package_module(group)]

# What the imports made (about 340,000 objects: Dagster, pydantic, the
# clients) lives as long as the process. A full garbage collection scanned
# all of it: 0.2 to 0.5 s each time, one to three times in a sync run. Frozen
# objects are not scanned. kb.apps.sync freezes again before each run.
gc.freeze()

@dg.definitions
def defs() -> dg.Definitions:
    """The Definitions, built at each load of the code location: the
    resources take the settings of that moment. One process can change its
    settings between two loads (kb demo sets KB_HOME; a test sets keys)."""
    return dg.Definitions(
        assets=all_assets,
        asset_checks=all_checks,
        resources=build_resources(),
        jobs=[x_sync_job, x_catch_up_job, capture_job, captions_job, captions_to_index_job, index_rebuild_job, source_index_job, wiki_index_job,
              extract_job, transcribe_job, translate_job, normalize_job, source_intake_job,
              wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job, backup_job],
        schedules=[wiki_lint_schedule, wiki_synthesis_schedule, backup_schedule],
        sensors=[
            x_sync_sensor, x_full_sync_sensor, x_catch_up_sensor, captions_sensor, captions_to_index_sensor,
            inbox_sensor, bot_requests_sensor, wiki_requests_sensor, source_outcomes_sensor, run_endings_sensor,
            wiki_waiting_sensor, wiki_results_sensor, stuck_steps_sensor,
        ],
    )
