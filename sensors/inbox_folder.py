"""Sensors of the Telegram inflow: the inbox, and the bot's requests.

`inbox_sensor`: each new inbox item becomes a partition of `sources` and a
run of `source_intake` for it.
- The cursor is the name of the last manifest seen. Names only go up in the
  order the files appear (see telegram_bridge/inbox.py), so an item cannot
  appear behind the cursor.
- The run key is the item id. The daemon applies the partition requests,
  then the run requests, then stores the cursor. If it dies between two of
  these steps, the next tick sees the same items again: adding a partition
  that exists does nothing, and Dagster does not start a second run with
  the same run key. So a crash neither loses nor repeats an item.
- Files that the owner drops in the inbox (no bot) are made into items first.

`bot_requests_sensor`: /override <id> from the bot, as a request file.
`wiki_requests_sensor`: /lint and /synthesize [topic], as request files,
run the wiki stage's jobs (kb_assets/wiki/wiki_pages.py).
Each request sensor keeps its own cursor over inbox/requests/; the run key
is the request's file name, so each request gives one run.
"""

from __future__ import annotations

import dagster as dg

from kb_assets.keys import OVERRIDE_TAG, OVERRIDE_VALUE, REQUESTED_BY_TAG, TOPIC_TAG
from kb_assets.partitions import sources
from kb_assets.telegram.sources import source_intake_job
from kb.wiki.weeks import iso_week_label
from kb.wiki.prompts import topic_key
from kb_assets.wiki.wiki_pages import (
    monday_in_zone,
    today_in_zone,
    wiki_lint_job,
    wiki_synthesis_job,
    wiki_topic_job,
    wiki_topics,
)
from kb.settings import Settings, get_settings
from kb_resources.stores import InboxResource
from kb.telegram.inbox import FileStillChanging, Inbox, InboxError, item_id_of_manifest

# A burst of items (a backfill of dropped files) is taken in slices, so
# that one tick stays short.
MAX_ITEMS_PER_TICK = 100



def adopt_dropped_files(inbox: Inbox, log) -> None:
    # Only whole files: one that another program still writes waits for a
    # later tick (kb/telegram/inbox.py, KB_INBOX_SETTLE_S).
    for path in inbox.settled_dropped_files():
        try:
            item = inbox.adopt_dropped_file(path)
        except FileStillChanging as exc:
            log.info(str(exc))
            continue
        except (OSError, InboxError) as exc:
            log.warning(f"inbox: cannot take the dropped file {path.name}: {exc}")
            continue
        if item is None:
            log.warning(f"inbox: {path.name} is not a type kb can parse; moved to {inbox.root / 'unsupported'}")
        else:
            log.info(f"inbox: the dropped file {path.name} is item {item.id} ({item.type})")


def build_inbox_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="inbox_sensor",
        job=source_intake_job,
        minimum_interval_seconds=settings.kb_inbox_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Each new inbox item (from the bot, or a file dropped in the inbox) becomes a "
                    "partition of `sources` and a run keyed by the item id.",
    )(new_items)


def new_items(context: dg.SensorEvaluationContext, inbox: InboxResource) -> dg.SensorResult | dg.SkipReason:
    inbox = inbox.get_client()
    adopt_dropped_files(inbox, context.log)
    names = inbox.manifest_names_after(context.cursor, limit=MAX_ITEMS_PER_TICK)
    if not names:
        return dg.SkipReason("no new inbox items")
    item_ids = [item_id_of_manifest(name) for name in names]
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=item_id, partition_key=item_id) for item_id in item_ids],
        dynamic_partitions_requests=[sources.build_add_request(item_ids)],
        cursor=names[-1],
    )


def _requests(inbox: Inbox, cursor: str | None, kinds: set[str], log) -> tuple[list[tuple[str, dict]], str | None]:
    """(name, request) of new requests of these kinds, and the new cursor."""
    names = inbox.request_names_after(cursor)
    found = []
    for name in names:
        try:
            request = inbox.read_request(name)
        except InboxError as exc:
            log.warning(str(exc))
            continue
        if request["kind"] in kinds:
            found.append((name, request))
    return found, (names[-1] if names else cursor)


def build_bot_requests_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="bot_requests_sensor",
        job=source_intake_job,
        minimum_interval_seconds=settings.kb_inbox_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="/override <id> from the bot: run the item again and accept it whatever the gate says.",
    )(override_requests)


def override_requests(context: dg.SensorEvaluationContext, inbox: InboxResource) -> dg.SensorResult | dg.SkipReason:
    inbox = inbox.get_client()
    found, cursor = _requests(inbox, context.cursor, {"override"}, context.log)
    run_requests, item_ids = [], []
    for name, request in found:
        item_id = str(request.get("item_id", ""))
        if inbox.find(item_id) is None:
            context.log.warning(f"request {name}: no inbox item {item_id!r}")
            continue
        item_ids.append(item_id)
        run_requests.append(dg.RunRequest(
            run_key=f"override-{name}", partition_key=item_id,
            tags={OVERRIDE_TAG: OVERRIDE_VALUE, REQUESTED_BY_TAG: str(request.get("user_id", ""))},
        ))
    if cursor == context.cursor:
        return dg.SkipReason("no new requests")
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=[sources.build_add_request(item_ids)] if item_ids else [],
        cursor=cursor,
    )


def wiki_run_request(name: str, request: dict, tz: str) -> tuple[dg.RunRequest, str | None]:
    """(run request, new wiki_topics partition or None) for a /lint or
    /synthesize request. Raises ValueError for a topic with no words.
    `tz`: the owner's zone, whose today and week the request names."""
    tags = {REQUESTED_BY_TAG: str(request.get("user_id", ""))}
    if request["kind"] == "lint":
        return dg.RunRequest(run_key=name, job_name=wiki_lint_job.name, tags=tags,
                             partition_key=today_in_zone(tz).isoformat()), None
    topic = str(request.get("topic") or "").strip()
    if topic:
        key = topic_key(topic)
        return dg.RunRequest(run_key=name, job_name=wiki_topic_job.name, partition_key=key,
                             tags={**tags, TOPIC_TAG: topic}), key
    # No topic: the weekly synthesis of the week that is running.
    monday = monday_in_zone(tz)
    return dg.RunRequest(run_key=name, job_name=wiki_synthesis_job.name, partition_key=monday.isoformat(),
                         tags={**tags, "week": iso_week_label(monday)}), None


def build_wiki_requests_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="wiki_requests_sensor",
        jobs=[wiki_lint_job, wiki_synthesis_job, wiki_topic_job],
        minimum_interval_seconds=settings.kb_inbox_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="/lint and /synthesize [topic] from the bot: run the wiki lint (today), the synthesis of a "
                    "topic (a partition of wiki_topics), or the weekly synthesis (this week) now.",
    )(wiki_requests)


def wiki_requests(context: dg.SensorEvaluationContext, inbox: InboxResource) -> dg.SensorResult | dg.SkipReason:
    # Today and this week in TZ: read at each tick, as the schedules read it at each load.
    tz = get_settings().tz
    inbox = inbox.get_client()
    found, cursor = _requests(inbox, context.cursor, {"lint", "synthesize"}, context.log)
    run_requests, topics = [], []
    for name, request in found:
        try:
            run_request, topic = wiki_run_request(name, request, tz)
        except ValueError as exc:
            context.log.warning(f"request {name}: {exc}")
            continue
        run_requests.append(run_request)
        if topic:
            topics.append(topic)
    if cursor == context.cursor:
        return dg.SkipReason("no new requests")
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=[wiki_topics.build_add_request(topics)] if topics else [],
        cursor=cursor,
    )
