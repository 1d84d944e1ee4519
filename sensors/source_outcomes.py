"""Sensors that tell the owner how an item ended: done, failed, rejected,
duplicate. Each notification goes out at most once per item and state
(TelegramNotifier records it), so a sensor that reads an event twice after
a restart sends nothing twice.

`source_outcomes_sensor` reads new materializations of `gated_sources`
(rejected, duplicate) and `wiki_pages` (done) after its cursor: the storage
ids of the last events it handled. A send that fails stops the tick before
that event, so the next tick tries it again.

`run_endings_sensor` reads the runs of every job that ended failed or
canceled (syncs, stage commands, lint, synthesis, backups, Telegram items)
after its cursor: the update time of the last run it handled. Dagster
keeps the cursor, so a restart of the daemon goes on from it. Each run gets
one notice with the job, the partition and the reason: a Telegram item's
notice is a reply to its message; /lint and /synthesize go to the owner who
asked; every other run goes to OWNER_CHAT_ID (without a bot: the log and
`kb status`). A run that Dagster will retry is not the end, so it sends
nothing for it. A failed send stops the tick before that run, so the next
tick tries it again. Why not Dagster's run_failure_sensor: Dagster moves a
run status sensor past the event even when the sensor raises, and the
notice of that failure was lost.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import dagster as dg

from kb.telegram.gate import default_accept_note
from kb.settings import Settings

from kb_assets.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from kb_assets.keys import GATED_SOURCES, PARTITION_TAG, WIKI_PAGES, WILL_RETRY_TAG
from kb_assets.partitions import sources
from kb_assets.run_config_rules import requester_chat
from kb_resources.stores import InboxResource
from kb.telegram.inbox import Inbox
from kb.telegram.item_states import State
from kb_assets.source_states import commit_of, failure_message
from kb.telegram.notifier import (
    NO_GATE_KEY_NOTICE,
    NotificationError,
    TelegramNotifier,
    describe,
    no_gate_key_text,
    notification_text,
    run_ending_text,
)
from kb_resources.services import TelegramNotifierResource

EVENTS_PER_TICK = 100
# The jobs that /lint and /synthesize start.
WIKI_JOBS = ("wiki_lint_job", "wiki_synthesis_job", "wiki_topic_job")


def _value(metadata, key):
    value = metadata.get(key)
    return getattr(value, "value", value)


def notify_outcome(notifier: TelegramNotifier, inbox: Inbox, record, asset_key: dg.AssetKey,
                   instance: dg.DagsterInstance | None = None) -> bool:
    """Notify the outcome in one materialization record. True when sent now."""
    item_id = record.partition_key
    metadata = record.asset_materialization.metadata
    item = inbox.find(item_id) if item_id else None
    gated = _gated_metadata(instance, item_id) if instance and item_id else {}
    title = _value(metadata, "title") or gated.get("title") or None
    what = describe(item, item_id, title)
    if asset_key == WIKI_PAGES:
        state = State.DONE
        values = {k: _value(metadata, k) for k in metadata}
        text = notification_text(state, what, item_id=item_id, commit=commit_of(values),
                                 created=values.get("pages_created"),
                                 updated=values.get("pages_updated"), summary=values.get("summary"),
                                 warnings=values.get("warnings"),
                                 gate_note=default_accept_note(gated.get("gate"), gated.get("gate_tries")))
    else:
        state = _value(metadata, "status")
        if _value(metadata, "gate") == "skipped-no-key":
            _tell_no_gate_key(notifier, item)
        if state not in (State.REJECTED, State.DUPLICATE):
            return False  # accepted: the wiki tells when it is done
        score = _value(metadata, "score")
        text = notification_text(
            state, what, score=score if isinstance(score, int) and score >= 0 else None,
            reason=_value(metadata, "reason"),
            duplicate_of=_value(metadata, "duplicate_of"), item_id=item_id,
        )
    return notifier.notify(item_id, state, text)


def _tell_no_gate_key(notifier: TelegramNotifier, item) -> bool:
    """Tell the owner one time that the gate has no key, so that no source
    is scored. Why once: with no key, every source says so, and a notice
    per source would bury the others. The claim file keeps it to one, also
    after a restart. It goes to the chat of the item that showed it."""
    chat_id = item.chat_id if item is not None and not item.is_system else None
    return notifier.notify(NO_GATE_KEY_NOTICE, "told", no_gate_key_text(), chat_id=chat_id)


def build_source_outcomes_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="source_outcomes_sensor",
        minimum_interval_seconds=settings.kb_notify_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Tells the owner when a source is rejected, a duplicate, waits for the wiki agent, or is done (in the wiki).",
    )(told_outcomes)


def told_outcomes(context: dg.SensorEvaluationContext, telegram: TelegramNotifierResource, inbox: InboxResource) -> dg.SkipReason:
    telegram = telegram.get_client()
    cursor = json.loads(context.cursor) if context.cursor else {}
    inbox = inbox.get_client()
    sent = 0
    for asset_key in (GATED_SOURCES, WIKI_PAGES):
        name = asset_key.to_user_string()
        result = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, after_storage_id=cursor.get(name)),
            limit=EVENTS_PER_TICK, ascending=True,
        )
        for record in result.records:
            if record.partition_key and context.instance.has_dynamic_partition(sources.name, record.partition_key):
                try:
                    sent += notify_outcome(telegram, inbox, record, asset_key, context.instance)
                except NotificationError as exc:
                    context.log.warning(str(exc))
                    break
            cursor[name] = record.storage_id
    sent += _notify_waiting(context, telegram, inbox, cursor)
    context.update_cursor(json.dumps(cursor))
    return dg.SkipReason(f"{sent} notifications sent")


WAITING_CURSOR = "wiki_pages_waiting"


def _notify_waiting(context: dg.SensorEvaluationContext, telegram: TelegramNotifier, inbox: Inbox,
                    cursor: dict) -> int:
    """One notice per source that waits for the wiki agent, and one per
    source whose wiki change kb refused (observations of wiki_pages with
    state `waiting` or `refused`; a refusal names the rule). The claim file
    keeps each to one, also after a restart."""
    sent = 0
    result = context.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=WIKI_PAGES, after_storage_id=cursor.get(WAITING_CURSOR)),
        limit=EVENTS_PER_TICK, ascending=True,
    )
    for record in result.records:
        observation = record.event_log_entry.asset_observation
        item_id = record.partition_key
        state = _value(observation.metadata, "state") if observation is not None else None
        if (state in (State.WAITING, State.REFUSED) and item_id
                and context.instance.has_dynamic_partition(sources.name, item_id)):
            gated = _gated_metadata(context.instance, item_id)
            what = describe(inbox.find(item_id), item_id, gated.get("title") or None)
            text = notification_text(state, what, item_id=item_id, reason=_value(observation.metadata, "reason"),
                                     gate_note=default_accept_note(gated.get("gate"), gated.get("gate_tries")))
            try:
                sent += telegram.notify(item_id, state, text)
            except NotificationError as exc:
                context.log.warning(str(exc))
                break
        cursor[WAITING_CURSOR] = record.storage_id
    return sent


def _gated_metadata(instance: dg.DagsterInstance, item_id: str) -> dict:
    """The metadata of the item's newest gate verdict (title, gate, gate_tries), or {}."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=GATED_SOURCES, asset_partitions=[item_id]), limit=1).records
    if not records:
        return {}
    metadata = records[0].asset_materialization.metadata
    return {key: _value(metadata, key) for key in metadata}


ENDED = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def build_run_endings_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="run_endings_sensor",
        minimum_interval_seconds=settings.kb_notify_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Tells the owner once of each run that failed for good or was canceled, whatever its job.",
    )(told_endings)


def told_endings(context: dg.SensorEvaluationContext, telegram: TelegramNotifierResource,
                       inbox: InboxResource) -> dg.SkipReason:
    if context.cursor is None:
        # The first tick starts the record: endings from before the sensor ran are history.
        context.update_cursor(datetime.now(timezone.utc).isoformat())
        return dg.SkipReason("started: failed and canceled runs from now on are reported")
    notifier, box = telegram.get_client(), inbox.get_client()
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(statuses=ENDED, updated_after=datetime.fromisoformat(context.cursor)),
        limit=EVENTS_PER_TICK, order_by="update_timestamp", ascending=True)
    sent = 0
    for record in records:
        try:
            sent += notify_ending(notifier, box, context.instance, record.dagster_run, context.log)
        except NotificationError as exc:
            context.log.warning(str(exc))
            break
        context.update_cursor(record.update_timestamp.isoformat())  # exact: the next tick asks for later ones
    return dg.SkipReason(f"{sent} notices of failed or canceled runs sent")


def ending_reason(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    if run.status == dg.DagsterRunStatus.CANCELED:
        return "the run was canceled"
    return failure_message(instance, run.run_id)


def run_partition(run: dg.DagsterRun) -> str:
    """The partition of the run as the owner reads it: one key, a range, or ""."""
    if run.tags.get(PARTITION_TAG):
        return run.tags[PARTITION_TAG]
    first, last = run.tags.get(ASSET_PARTITION_RANGE_START_TAG), run.tags.get(ASSET_PARTITION_RANGE_END_TAG)
    return f"{first}...{last}" if first and last else ""


def notify_ending(notifier: TelegramNotifier, inbox: Inbox, instance: dg.DagsterInstance, run: dg.DagsterRun,
                  log) -> bool:
    """Tell the owner of one failed or canceled run, once. True when sent now."""
    if run.tags.get(WILL_RETRY_TAG) == "true":
        log.info(f"run {run.run_id} failed; Dagster runs it again, so no notice yet")
        return False
    item_id = run.tags.get(PARTITION_TAG)
    reason = ending_reason(instance, run)
    if item_id and run.job_name not in WIKI_JOBS and instance.has_dynamic_partition(sources.name, item_id):
        # A Telegram item: the reply to the message that brought it.
        return notifier.notify(item_id, State.FAILED, notification_text(
            State.FAILED, describe(inbox.find(item_id), item_id, _gated_metadata(instance, item_id).get("title")),
            item_id=item_id, error=reason))
    state = "canceled" if run.status == dg.DagsterRunStatus.CANCELED else State.FAILED
    # /lint or /synthesize: the owner who asked hears of it; any other run: OWNER_CHAT_ID.
    return notifier.notify(f"run{run.run_id.replace('-', '')}", state,
                           run_ending_text(state, run.job_name, run_partition(run), reason, run.run_id),
                           chat_id=requester_chat(run.tags))
