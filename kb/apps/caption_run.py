"""`kb caption [--limit N] [--retry]`: one run of `captions_job` over every
sync batch with waiting photos, whatever their count, then one run of
`captions_to_index_job` for each of those batches.

The runs are runs of the code location's jobs, executed where `kb sync`
executes its runs (kb/apps/sync.py, class Runs). `captions_job` carries dagster/max_retries
0: a caption run never starts a GPU again by itself; only `--retry` tries the
failed photos again.
"""

from __future__ import annotations

import dagster as dg

from kb.apps.sync import PARTITION_TAG, QUIET_LOGS, Runs
from kb_assets.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from kb_assets.instance_config import ensure_dagster_home
from kb_assets.partitions import sync_batches
from kb_assets.run_launcher import fail_runs_of_dead_workers
from kb.store.duckdb_store import DuckDBStore
from kb.enrich.photo_queue import waiting_by_batch


def run_captions(*, limit: int = 0, retry: bool = False) -> dict:
    """Caption every waiting photo in one run, then carry the captions into
    the index of each batch. Returns a summary."""
    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    fail_runs_of_dead_workers(instance)
    known = instance.get_dynamic_partitions(sync_batches.name)
    with DuckDBStore.from_settings().connect() as conn:
        by_batch = waiting_by_batch(conn, retry=retry)
    batches = sorted(key for key in known if key in by_batch)
    if not batches:
        return {"ok": True, "waiting": 0, "captioned": 0, "failed": {}, "message": "No photo waits for a caption."}
    summary: dict = {"batches": len(batches), "waiting_before": sum(by_batch[b] for b in batches)}
    runs = Runs(instance)
    run_id, stages = runs.run(
        "captions_job",
        run_config={**QUIET_LOGS, "ops": {"captions": {"config": {"limit": limit, "retry": retry, "min_photos": 0}}}},
        tags={ASSET_PARTITION_RANGE_START_TAG: batches[0], ASSET_PARTITION_RANGE_END_TAG: batches[-1]})
    # No run (kb up refused it): the one result names the job and the reason.
    [result] = [r for r in stages if r.stage == "captions"] or stages
    summary["run_id"] = run_id
    summary["ok"] = result.ok
    records = instance.fetch_materializations(dg.AssetKey("captions"), limit=1).records
    if records and records[0].run_id == run_id:
        metadata = records[0].asset_materialization.metadata
        summary.update({key: metadata[key].value for key in ("captioned", "failed", "waiting", "model")
                        if key in metadata})
    if not result.ok:
        summary["error"] = result.error
        return summary
    done, errors = 0, []
    for batch in batches:
        _, index_stages = runs.run("captions_to_index_job", run_config=QUIET_LOGS, tags={PARTITION_TAG: batch})
        failed = [r for r in index_stages if not r.ok]
        if failed:
            errors.append(f"{batch}: {failed[0].stage}: {failed[0].error}")
        else:
            done += 1
    summary["indexed_batches"], summary["index_errors"] = done, errors
    return summary
