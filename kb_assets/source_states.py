"""The state of each inbox item and of each source's wiki ingest, read
from the Dagster instance. No asset is defined here: `kb status`, the bot
and the sensors read states without the asset modules.

Dagster is the only state store of an item: its partition of `sources`,
the runs of that partition, and the materializations of `gated_sources`
and `wiki_pages` for it. There is no second table to keep in step.

The states and what they mean: kb/telegram/item_states.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import dagster as dg
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

from kb.error_lines import first_line
from kb.telegram.gate import default_accept_note
from kb.telegram.item_states import ItemState, State, StateReader
from kb.wiki.agent import WikiAgent
from kb_assets.keys import GATED_SOURCES, PARTITION_TAG, WIKI_PAGES, WILL_RETRY_TAG
from kb_assets.partitions import sources

# The wiki asset names its commit with one of these metadata keys.
COMMIT_KEYS = ("commit_sha", "commit", "sha")
# Observations of wiki_pages that say where an accepted source stands.
WIKI_STATES = (State.WAITING, State.RETRYING, State.FAILED)

IN_PROGRESS = {
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.MANAGED,
    DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING,
}


def open_instance(dagster_home: Path) -> DagsterInstance | None:
    """The Dagster instance at settings.dagster_home, or None when Dagster
    has never run there (then every item is still `received`)."""
    if not dagster_home.is_dir():
        return None
    return DagsterInstance.from_config(str(dagster_home))


def _metadata(record) -> dict:
    event = (record.asset_materialization or record.asset_observation) if record else None
    if event is None:
        return {}
    return {key: getattr(value, "value", value) for key, value in event.metadata.items()}


def latest_materialization(instance: DagsterInstance, asset_key: dg.AssetKey, item_id: str):
    result = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[item_id]), limit=1
    )
    return result.records[0] if result.records else None


def latest_observation(instance: DagsterInstance, asset_key: dg.AssetKey, item_id: str):
    result = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[item_id]), limit=1
    )
    return result.records[0] if result.records else None


def step_error_line(error) -> str:
    """What went wrong in a failed step, on one line. Dagster wraps an error
    that the asset raises (DagsterExecutionStepExecutionError), and its own
    message names only the op: the cause says what went wrong, for example
    the model that the index holds. Without the cause the owner's notice said
    only 'Error occurred while executing op "parsed_sources"' (the month test
    of 6 December 2026)."""
    while error.cls_name == "DagsterExecutionStepExecutionError" and error.cause is not None:
        error = error.cause
    line = first_line(error.message, "the step failed")
    prefix, _, rest = line.partition(": ")
    # "kb.index.store.IndexModelMismatch: The index ...": the owner needs the sentence only.
    return rest if rest and prefix.split(".")[-1] == error.cls_name else line


def failure_message(instance: DagsterInstance, run_id: str) -> str:
    """What made the run fail, in the words of the asset that failed."""
    connection = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE)
    for record in reversed(connection.records):
        data = record.event_log_entry.dagster_event.step_failure_data
        if data.user_failure_data and data.user_failure_data.description:
            return data.user_failure_data.description
        if data.error:
            return step_error_line(data.error)
    connection = instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_FAILURE)
    for record in reversed(connection.records):
        message = record.event_log_entry.dagster_event.message
        if message:
            return message
    return "the run failed (no error message recorded)"


def commit_of(metadata: dict) -> str | None:
    for key in COMMIT_KEYS:
        if metadata.get(key):
            return str(metadata[key])
    return None


def read_item_state(instance: DagsterInstance | None, item_id: str) -> ItemState:
    if instance is None or not instance.has_dynamic_partition(sources.name, item_id):
        return ItemState(item_id, State.RECEIVED)
    runs = instance.get_run_records(dg.RunsFilter(tags={PARTITION_TAG: item_id}), limit=1)
    latest = runs[0].dagster_run if runs else None
    gated = latest_materialization(instance, GATED_SOURCES, item_id)
    wiki = latest_materialization(instance, WIKI_PAGES, item_id)
    gated_meta, wiki_meta = _metadata(gated), _metadata(wiki)
    title = gated_meta.get("title") or None
    score = gated_meta.get("score")
    score = score if isinstance(score, int) and score >= 0 else None
    gate_note = default_accept_note(gated_meta.get("gate"), gated_meta.get("gate_tries")) or None
    gate = gated_meta.get("gate") or None

    if latest is not None and latest.status in IN_PROGRESS:
        selection = latest.asset_selection or set()
        wiki_only = WIKI_PAGES in selection and GATED_SOURCES not in selection
        return ItemState(item_id, State.INGESTING if wiki_only else State.PROCESSING, title=title, score=score, gate_note=gate_note, gate=gate)
    if latest is not None and latest.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        state = State.RETRYING if latest.tags.get(WILL_RETRY_TAG) == "true" else State.FAILED
        error = failure_message(instance, latest.run_id) if latest.status == DagsterRunStatus.FAILURE else "the run was canceled"
        refusal = refusal_of_last_try(instance, item_id, after=gated.storage_id if gated else None)
        if state == State.FAILED and refusal:
            # The last try was refused by a rule of the wiki, and no try is left: the rule is the reason.
            state, error = State.REFUSED, refusal
        return ItemState(item_id, state, error=error, title=title, score=score, gate_note=gate_note, gate=gate)
    if wiki is not None and (gated is None or wiki.storage_id > gated.storage_id):
        return ItemState(item_id, State.DONE, commit=commit_of(wiki_meta), title=title, score=score, gate_note=gate_note, gate=gate)
    if gated is not None:
        status = gated_meta.get("status")
        if status == "accepted":
            # The wiki stage records why it did not ingest (yet) as an observation.
            seen = latest_observation(instance, WIKI_PAGES, item_id)
            seen_meta = _metadata(seen)
            if seen is not None and seen.storage_id > gated.storage_id and seen_meta.get("state") in WIKI_STATES:
                state, error = State(seen_meta["state"]), seen_meta.get("error") or seen_meta.get("reason")
                if state == State.FAILED and seen_meta.get("refusal"):
                    state, error = State.REFUSED, seen_meta["refusal"]
                return ItemState(item_id, state, title=title, score=score, gate_note=gate_note, gate=gate, error=error)
            return ItemState(item_id, State.APPROVED, title=title, score=score, gate_note=gate_note, gate=gate)
        if status in (State.REJECTED, State.DUPLICATE):
            return ItemState(item_id, State(status), title=title, score=score, gate_note=gate_note, gate=gate, duplicate_of=gated_meta.get("duplicate_of"))
    return ItemState(item_id, State.QUEUED if latest is None else State.PARSED, title=title)


def refusal_of_last_try(instance: DagsterInstance, item_id: str, after: int | None = None) -> str | None:
    """The rule that refused the last wiki try of the item (its newest
    failed-try observation names it), or None."""
    seen = latest_observation(instance, WIKI_PAGES, item_id)
    if seen is None or (after is not None and seen.storage_id < after):
        return None
    refusal = _metadata(seen).get("refusal")
    return str(refusal) if refusal else None


def state_reader(dagster_home: Path) -> StateReader:
    """A reader of item states for the bot. Each call opens the instance and
    closes it again, so the bot holds no Dagster connection between messages."""
    def read_states(item_ids: list[str]) -> dict[str, ItemState]:
        instance = open_instance(dagster_home)
        try:
            return {item_id: read_item_state(instance, item_id) for item_id in item_ids}
        finally:
            if instance is not None:
                instance.dispose()
    return read_states


def wiki_ingest_states(instance: DagsterInstance, limit: int = 1000) -> dict[str, dict]:
    """The last known wiki state of each source partition: done (with the
    commit), waiting, rejected, retrying or failed. For `kb status`/`/status`."""
    events = []
    for fetch in (instance.fetch_materializations, instance.fetch_observations):
        for record in fetch(WIKI_PAGES, limit=limit).records:
            entry = record.event_log_entry
            event = entry.asset_materialization or entry.asset_observation
            if event is None or record.partition_key is None:
                continue
            meta = {k: v.value for k, v in event.metadata.items()}
            state = State.DONE if entry.asset_materialization else str(meta.get("state", "unknown"))
            events.append((record.storage_id, record.partition_key, state, meta, entry.timestamp))
    states: dict[str, dict] = {}
    for storage_id, partition, state, meta, timestamp in sorted(events):
        if state in (State.REFUSED, State.STUCK) and partition in states and \
                states[partition]["state"] in (State.RETRYING, State.FAILED):
            continue  # a note on a try of a source that is already retrying: the try's own end follows
        if state == State.FAILED and meta.get("refusal"):
            state = State.REFUSED  # the last try was refused, and no try is left
        states[partition] = {"state": str(state), "at": timestamp, "commit_sha": meta.get("commit_sha"),
                             "reason": meta.get("refusal") or meta.get("reason") or meta.get("error")}
    return states


def wiki_status(instance: DagsterInstance, agent: WikiAgent) -> dict:
    """The wiki part of `kb status`: agent readiness, sources per state, and
    the sources that wait."""
    states = wiki_ingest_states(instance)
    ready, detail = agent.readiness()
    return {
        "agent": {"ready": ready, "detail": detail},
        "sources": dict(Counter(s["state"] for s in states.values())),
        "waiting": sorted(k for k, v in states.items() if v["state"] == State.WAITING),
        "failed": sorted(k for k, v in states.items() if v["state"] in (State.FAILED, State.REFUSED)),
    }
