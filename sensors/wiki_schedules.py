"""Schedules and sensors of the wiki stage.

- wiki_lint_schedule: every day at KB_LINT_TIME (02:00, in settings.tz),
  lints the wiki.
- wiki_synthesis_schedule: on KB_SYNTHESIS_DAY at KB_SYNTHESIS_TIME (Sunday
  09:00, in settings.tz), sums up every source since the last weekly
  synthesis. The page takes the name of the ISO week of that day.
- wiki_waiting_sensor: sources that waited because no agent endpoint was set
  get their ingest run when an endpoint is set. Nothing that waited is lost.
"""


import dagster as dg

from kb.telegram.item_states import State
from kb.wiki.weeks import iso_week_label, monday_of
from kb_assets.wiki.wiki_pages import (
    WIKI_PAGES,
    wiki_ingest_job,
    wiki_lint_job,
    wiki_synthesis_job,
)
from kb.settings import Settings
from kb_resources.services import WikiAgentResource


def lint_request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    key = context.scheduled_execution_time.date().isoformat()
    return dg.RunRequest(run_key=key, partition_key=key)


def synthesis_request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    monday = monday_of(context.scheduled_execution_time.date())
    key = monday.isoformat()
    return dg.RunRequest(run_key=key, partition_key=key, tags={"week": iso_week_label(monday)})


# defs() (kb_assets/definitions.py) builds each schedule and sensor from the
# settings of one load of the code location, so a Reload in the UI takes a
# changed .env.


def build_wiki_lint_schedule(settings: Settings) -> dg.ScheduleDefinition:
    return dg.schedule(
        name="wiki_lint_schedule",
        job=wiki_lint_job,
        cron_schedule=settings.cron_at(settings.kb_lint_time),
        execution_timezone=settings.tz,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Every day at {settings.kb_lint_time}: lint the wiki; the partition is the day of the run.",
    )(lint_request)


def build_wiki_synthesis_schedule(settings: Settings) -> dg.ScheduleDefinition:
    return dg.schedule(
        name="wiki_synthesis_schedule",
        job=wiki_synthesis_job,
        cron_schedule=settings.cron_at(settings.kb_synthesis_time, settings.kb_synthesis_day),
        execution_timezone=settings.tz,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"{settings.kb_synthesis_day} {settings.kb_synthesis_time}: the weekly synthesis of "
                    "the ISO week of that day.",
    )(synthesis_request)


def build_wiki_waiting_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="wiki_waiting_sensor",
        job=wiki_ingest_job,
        minimum_interval_seconds=settings.kb_waiting_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="When an agent endpoint is set, ingest the sources that waited for one.",
    )(waiting_requests)


def waiting_requests(context: dg.SensorEvaluationContext, wiki_agent: WikiAgentResource):
    if not wiki_agent.get_client().configured():
        # The cursor does not move: the waiting sources stay in the queue.
        return dg.SkipReason("No agent endpoint (ANTHROPIC_BASE_URL): approved sources wait.")
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=WIKI_PAGES, after_storage_id=after), limit=500, ascending=True,
    ).records
    requests = []
    for record in records:
        observation = record.event_log_entry.asset_observation
        partition = record.partition_key
        if observation is None or partition is None:
            continue
        if observation.metadata.get("state") is None or observation.metadata["state"].value != State.WAITING:
            continue
        later = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=WIKI_PAGES, asset_partitions=[partition],
                                  after_storage_id=record.storage_id),
            limit=1,
        ).records
        if later:
            continue  # someone ingested it since
        requests.append(dg.RunRequest(run_key=f"wiki-waited-{partition}-{record.storage_id}",
                                      partition_key=partition))
    if records:
        context.update_cursor(str(records[-1].storage_id))
    return requests or dg.SkipReason("No source waits for the wiki agent.")
