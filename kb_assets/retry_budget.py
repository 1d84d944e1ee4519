"""The persisted count of used retries, read from the Dagster instance.

The rule (kb/retries.py, the specification's 4.4): 3 retries, after 60,
120 and 240 s, and a count that no new run resets. Dagster's own count of a
step's retries (context.retry_number) starts again in each run, also in
the run that Dagster's run retry starts after kb stopped a stuck step. So
each failed try leaves an observation on its asset partition (state
`retrying`, `failed`, or `stuck` from sensors/stuck_steps.py), and the
count is read from these observations:

- A source (a partition of `sources`): its whole life. The transient parse
  failures (DuckDB `sources.transient_failures`) and the failed tries of
  every asset of the source count together. The owner's /override starts
  the count again (as it resets the parse count): then only the tries of
  the override's own runs count.
- A lint day, a synthesis week, a topic: the tries of one request, that is
  of the runs of one root run (Dagster's run retries keep the root). A new
  /lint or schedule tick is a new request, as the specification's `_lint`
  row is a new row.
"""

from __future__ import annotations

import dagster as dg

from kb.telegram.item_states import FAILED_TRY_STATES, State
from kb_assets.keys import GATED_SOURCES, PARSED_SOURCES, PARTITION_TAG, ROOT_RUN_TAG, SOURCE_PASSAGES, WIKI_PAGES

# Every asset of one source partition: a failed try of any of them uses the source's budget.
SOURCE_ASSETS = (PARSED_SOURCES, GATED_SOURCES, SOURCE_PASSAGES, WIKI_PAGES)
# The most observations that one partition of one asset is read for.
OBSERVATIONS_LIMIT = 1000


def root_run_id(run_id: str, tags) -> str:
    """The first run of a chain of run retries (Dagster's root run tag)."""
    return tags.get(ROOT_RUN_TAG) or run_id


def try_metadata(run_id: str, tags) -> dict:
    """The metadata that ties a failed-try observation to its request."""
    return {"run_id": run_id, "root_run_id": root_run_id(run_id, tags)}


def failed_tries(instance: dg.DagsterInstance, asset_keys, partition: str, root: str | None = None) -> int:
    """The failed tries recorded on these assets for one partition: all of
    them, or only those of the runs of root run `root`."""
    count = 0
    for asset_key in asset_keys:
        records = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=OBSERVATIONS_LIMIT).records
        for record in records:
            observation = record.event_log_entry.asset_observation
            meta = {k: getattr(v, "value", v) for k, v in observation.metadata.items()} if observation else {}
            if meta.get("state") in FAILED_TRY_STATES and (root is None or meta.get("root_run_id") == root):
                count += 1
    return count


def source_retries_used(instance: dg.DagsterInstance, source_id: str, parse_failures: int, run_id: str, tags,
                        override: bool = False) -> int:
    """The retries that a source has used in its life: `parse_failures`
    (DuckDB) and the failed tries of its assets. For an override run, only
    the failed tries of its own request count."""
    root = root_run_id(run_id, tags) if override else None
    return parse_failures + failed_tries(instance, SOURCE_ASSETS, source_id, root)


def request_retries_used(instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str, run_id: str,
                         tags) -> int:
    """The retries that one request (a lint day, a week, a topic) has used:
    the failed tries of the runs of its root run."""
    return failed_tries(instance, [asset_key], partition, root_run_id(run_id, tags))


def record_stuck_try(instance: dg.DagsterInstance, run: dg.DagsterRun, step_key: str, message: str) -> None:
    """A try that kb stopped as stuck uses a retry, as the specification's
    sweeper counts it (retry_count + 1). The asset of a step of kb's jobs
    has the step's name."""
    partition = run.tags.get(PARTITION_TAG)
    if not partition:
        return
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(step_key), partition=partition,
        metadata={"state": str(State.STUCK), "error": message[:1000], "step": step_key,
                  **try_metadata(run.run_id, run.tags)}))
