"""`kb caption [--limit N] [--retry]`: one caption run over every sync batch
with waiting photos, whatever their count, then the index stages for each of
those batches."""

from __future__ import annotations

import dagster as dg

from kb.apps.sync import _first_error
from kb_assets.enrich.photo_captions import captions, captions_coverage, waiting_by_batch
from kb_assets.jobs import INDEX_STAGES
from kb_assets.partitions import sync_batches
from kb.duckdb_store import DuckDBStore
from kb.vision import Captioner


def run_captions(*, limit: int = 0, retry: bool = False, resources: dict | None = None,
                 assets: list | None = None) -> dict:
    """One caption run over every sync batch with waiting photos, whatever
    their count (`kb caption [--limit N] [--retry]`). Then, for each of
    those batches, chunks, translations and chunk_index run, so the new
    captions are searchable. `assets`: the graph for that (default: the
    Definitions). Returns a summary."""
    # Dagster has no public name for these tags; they make one run cover a range of partitions.
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from kb_resources.dagster_home import ensure_dagster_home

    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    known = instance.get_dynamic_partitions(sync_batches.name)
    with DuckDBStore.from_settings().connect() as conn:
        by_batch = waiting_by_batch(conn, retry=retry)
    batches = [key for key in known if key in by_batch]
    if not batches:
        return {"ok": True, "waiting": 0, "captioned": 0, "failed": {}, "message": "No photo waits for a caption."}
    if resources is None:
        from kb_assets.definitions import build_resources

        resources = build_resources()
    resources = {"captioner": Captioner.from_settings(), **resources}
    result = dg.materialize(
        [captions, captions_coverage],
        instance=instance,
        resources=resources,
        run_config={"ops": {"captions": {"config": {"limit": limit, "retry": retry, "min_photos": 0}}}},
        tags={ASSET_PARTITION_RANGE_START_TAG: batches[0], ASSET_PARTITION_RANGE_END_TAG: batches[-1],
              "kb/stage": "captions"},
        raise_on_error=False,
    )
    summary = {"ok": result.success, "batches": len(batches), "waiting_before": sum(by_batch[b] for b in batches)}
    materializations = result.asset_materializations_for_node("captions") if result.success else []
    if materializations:
        metadata = materializations[-1].metadata
        summary.update({key: metadata[key].value for key in ("captioned", "failed", "waiting", "model") if key in metadata})
    if not result.success:
        summary["error"] = _first_error(result)
        return summary
    summary["indexed_batches"], summary["index_errors"] = _index_batches(batches, resources, instance, assets)
    return summary


def _index_batches(batches: list[str], resources: dict, instance: dg.DagsterInstance,
                   assets: list | None) -> tuple[int, list[str]]:
    """Run the stages after captions for each batch; (batches done, errors)."""
    if assets is None:
        from kb_assets.definitions import all_assets, all_checks

        assets = [*all_assets, *all_checks]
    known = {key.to_user_string() for a in assets if hasattr(a, "keys") for key in a.keys}
    selection = [key for key in INDEX_STAGES if key in known]
    if not selection:
        return 0, []
    done, errors = 0, []
    for batch in batches:
        result = dg.materialize(assets, selection=selection, partition_key=batch, instance=instance,
                                resources=resources, raise_on_error=False,
                                tags={"kb/sync_batch": batch, "kb/stage": "captions-index"})
        if result.success:
            done += 1
        else:
            errors.append(f"{batch}: {_first_error(result)}")
    return done, errors
