"""The sensor that tells the owner the result of each wiki lint, weekly
synthesis and topic synthesis: the daily digest, the week's themes, and the
reply to /lint and /synthesize.

It reads new materializations of wiki_lint, wiki_synthesis and
wiki_topic_synthesis after its cursor. Each result goes out once (a claim
file per run and asset, see TelegramNotifier.notify). A run that /lint or
/synthesize started carries the sender's user id (kb/requested_by): the
notice goes to that chat; any other goes to OWNER_CHAT_ID. A send that
fails stops the tick before that event, so the next tick tries it again.
"""

from __future__ import annotations

import json

import dagster as dg

from kb.settings import Settings

from kb.telegram.notifier import NotificationError, TelegramNotifier, wiki_result_text
from kb_assets.keys import WIKI_LINT, WIKI_SYNTHESIS, WIKI_TOPIC_SYNTHESIS
from kb_assets.run_config_rules import requester_chat
from kb_resources.services import TelegramNotifierResource

EVENTS_PER_TICK = 100
WIKI_RESULTS = (WIKI_LINT, WIKI_SYNTHESIS, WIKI_TOPIC_SYNTHESIS)


def notify_result(instance: dg.DagsterInstance, notifier: TelegramNotifier, record, asset_key: dg.AssetKey) -> bool:
    metadata = {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}
    asset = asset_key.to_user_string()
    text = wiki_result_text(asset, record.partition_key or "", metadata)
    run = instance.get_run_by_id(record.run_id)
    requester = requester_chat(run.tags) if run else None
    # One notice per run and asset: a claim name has letters and digits only.
    key = f"run{record.run_id.replace('-', '')}"
    return notifier.notify(key, asset, text, chat_id=requester)


def build_wiki_results_sensor(settings: Settings) -> dg.SensorDefinition:
    return dg.sensor(
        name="wiki_results_sensor",
        minimum_interval_seconds=settings.kb_notify_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Tells the owner the result of each wiki lint, weekly synthesis and topic synthesis.",
    )(told_results)


def told_results(context: dg.SensorEvaluationContext, telegram: TelegramNotifierResource) -> dg.SkipReason:
    telegram = telegram.get_client()
    cursor = json.loads(context.cursor) if context.cursor else {}
    sent = 0
    failed = False
    for asset_key in WIKI_RESULTS:
        name = asset_key.to_user_string()
        result = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, after_storage_id=cursor.get(name)),
            limit=EVENTS_PER_TICK, ascending=True,
        )
        for record in result.records:
            try:
                sent += notify_result(context.instance, telegram, record, asset_key)
            except NotificationError as exc:
                # The Bot API is down: stop here, the next tick tries again in order.
                context.log.warning(str(exc))
                failed = True
                break
            cursor[name] = record.storage_id
        if failed:
            break
    context.update_cursor(json.dumps(cursor))
    return dg.SkipReason(f"{sent} wiki notices sent")
