"""The Definitions that `dagster dev -w workspace.yaml` loads: every asset,
check, resource, job, sensor and schedule of kb.

An import of this module writes no file and changes nothing in the
process (tests/test_definitions.py). The set-up of a Dagster process
(on_load) runs when Dagster loads the code location: `defs()`.
"""

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
from kb.store.private_files import private_process
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
from sensors.backup_schedule import build_backup_schedule
from sensors.waiting_photos import captions_sensor, captions_to_index_sensor
from sensors.inbox_folder import build_bot_requests_sensor, build_inbox_sensor, build_wiki_requests_sensor
from sensors.capture_failed import x_catch_up_sensor, x_sync_catch_up_sensor
from sensors.x_sync_sensor import build_x_full_sync_sensor, x_sync_sensor
from sensors.source_outcomes import build_run_endings_sensor, build_source_outcomes_sensor
from sensors.wiki_results import build_wiki_results_sensor
from sensors.stuck_steps import stuck_steps_sensor
from sensors.wiki_schedules import build_wiki_lint_schedule, build_wiki_synthesis_schedule, build_wiki_waiting_sensor

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


def build_schedules(settings: Settings) -> list[dg.ScheduleDefinition]:
    """The schedules at the times of `settings`."""
    return [build_wiki_lint_schedule(settings), build_wiki_synthesis_schedule(settings), build_backup_schedule(settings)]


def build_sensors(settings: Settings) -> list[dg.SensorDefinition]:
    """The sensors; their intervals and default states come from `settings`."""
    return [
        x_sync_sensor, build_x_full_sync_sensor(settings), x_catch_up_sensor, x_sync_catch_up_sensor, captions_sensor,
        captions_to_index_sensor,
        build_inbox_sensor(settings), build_bot_requests_sensor(settings), build_wiki_requests_sensor(settings),
        build_source_outcomes_sensor(settings), build_run_endings_sensor(settings),
        build_wiki_waiting_sensor(settings), build_wiki_results_sensor(settings), stuck_steps_sensor,
    ]


all_assets = [a for group in ASSET_GROUPS for a in dg.load_assets_from_package_module(group)]
all_checks = [c for group in ASSET_GROUPS for c in dg.load_asset_checks_from_package_module(group)]



def on_load(settings: Settings) -> None:
    """The set-up of a process that loads the code location: `dagster dev`,
    the daemon, a code server and each run worker that they start. They do
    not come through the kb CLI, which does the same set-up itself."""
    # Each file that a run writes is the owner's only (kb/store/private_files.py).
    private_process()
    # Each Dagster process finds kb's dagster.yaml (pools, run monitoring, retries).
    ensure_on_load(settings)
    # What the imports made (Dagster, pydantic, the clients: hundreds of
    # thousands of objects) lives as long as the process. A full garbage
    # collection scanned all of it, one to three times in a sync run. Frozen
    # objects are not scanned. kb.apps.sync freezes again before each run.
    gc.freeze()


@dg.definitions
def defs() -> dg.Definitions:
    """The Definitions, built at each load of the code location from one
    read of the settings: the resources, the times of the schedules and the
    intervals of the sensors take the settings of that moment. So "Reload"
    of the code location in the UI takes a changed .env, and one process can
    change its settings between two loads (kb demo sets KB_HOME; a test
    sets keys). No module of kb_assets/ or sensors/ reads the settings at
    import (tests/test_settings_reload.py)."""
    settings = get_settings()
    on_load(settings)
    global _built
    # One Definitions per read of the settings: get_settings() gives the
    # same object while the environment and the settings file stay the
    # same, and a new one when they change. Why: each run resolves its job
    # from a new Definitions about four times (job_named below), and each
    # time Dagster built the repository and kb its resources again: 40 to
    # 50 ms of CPU, 176 times in 14 tests of the suite (6 December 2026).
    if _built is None or _built[0] is not settings:
        _built = (settings, dg.Definitions(
            assets=all_assets,
            asset_checks=all_checks,
            resources=build_resources(settings),
            jobs=[x_sync_job, x_catch_up_job, capture_job, captions_job, captions_to_index_job, index_rebuild_job,
                  source_index_job, wiki_index_job, extract_job, transcribe_job, translate_job, normalize_job,
                  source_intake_job, wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job, backup_job],
            schedules=build_schedules(settings),
            sensors=build_sensors(settings),
        ))
    return _built[1]


# The settings of the last defs() and the Definitions built from them.
_built: tuple[Settings, dg.Definitions] | None = None


def job_named(name: str, launch: str = "") -> dg.JobDefinition:
    """The job `name` of the Definitions, for dg.build_reconstructable_job
    (kb/apps/run_paths.py): a run worker builds the job again from this
    function. `launch` names one launch: Dagster keeps the last built job
    of equal arguments, and a new launch must take the settings of its own
    moment (kb demo changes KB_HOME in the same process)."""
    del launch
    return defs().resolve_job_def(name)
