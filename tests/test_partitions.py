"""Partitions say what they hold (issue 57): a run of a sync batch's
partition reads and writes only that batch's items, and the catch-up of an
older batch is a run of that batch's own partition.

The owner imports page 1 with `--no-post`: the posts of batch 1 stay out of
the index, and wait for it. A plain import of page 2 then catches up: one
run of `x_catch_up` for batch 1. Each materialization names only its own
batch in `from_batches`, and search finds batch 1's posts.
"""

from __future__ import annotations

import dagster as dg
import pytest

from kb.sample_data import sample_pages
from tests.test_sync import duck, instance, kb

pytestmark = pytest.mark.slow  # three whole Dagster runs of the graph

STAGES = ("documents", "captions", "transcripts", "translations", "chunks", "chunk_index")


@pytest.fixture(autouse=True)
def offline_stages(monkeypatch):
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")  # no model load


def materializations(inst: dg.DagsterInstance, asset: str) -> list[tuple[str, str, dict]]:
    """(run id, partition, from_batches) of each materialization of `asset`, oldest first."""
    records = inst.fetch_materializations(dg.AssetKey(asset), limit=100, ascending=True).records
    return [(r.run_id, r.partition_key, r.asset_materialization.metadata["from_batches"].value)
            for r in records if "from_batches" in r.asset_materialization.metadata]


def test_a_catch_up_leaves_each_materialization_holding_only_its_own_partitions_items(capsys):
    from kb.index.search import search

    page1, page2, *_ = (str(p) for p in sample_pages())
    assert kb("import", "--no-link", "--no-post", page1) == 0
    inst = instance()
    [(batch1,)] = duck("SELECT DISTINCT batch FROM bookmarks")
    capsys.readouterr()

    assert kb("import", "--no-link", page2) == 0
    out = capsys.readouterr().out
    batch2 = max(inst.get_dynamic_partitions("sync_batches"))
    runs = list(reversed(inst.get_runs()))
    assert [(r.job_name, r.tags["dagster/partition"]) for r in runs] == [
        ("x_sync", batch1), ("x_sync", batch2), ("x_catch_up", batch1)]
    assert runs[2].tags["kb/exclude"] == "link"  # the sync's choice for one run goes with its catch-up
    # The report names the catch-up and its stages with their batch.
    assert f"Caught up the work that waits in earlier batches, one run each: {batch1}." in out
    assert f"chunk_index (batch {batch1})" in out

    for asset in STAGES:
        for run_id, partition, origins in materializations(inst, asset):
            assert set(origins) <= {partition}, (asset, partition, origins)
    # Batch 2's index holds batch 2's bookmarks; the catch-up's index of batch 1 holds batch 1's.
    by_run = {(run_id, partition): origins for run_id, partition, origins in materializations(inst, "chunk_index")}
    per_batch = dict(duck("SELECT batch, count(*) FROM bookmarks GROUP BY batch"))
    assert by_run[(runs[1].run_id, batch2)] == {batch2: per_batch[batch2]}
    assert by_run[(runs[2].run_id, batch1)] == {batch1: per_batch[batch1]}
    assert (runs[1].run_id, batch1) not in by_run and (runs[2].run_id, batch2) not in by_run

    # The stages' checks are per partition too: each evaluation of a run names
    # the run's partition, and a coverage check counts that partition's items.
    # (The bookmarks' checks hold for the whole table: they have no partition.)
    photos = dict(duck("SELECT b.batch, count(DISTINCT m.url) FROM media m JOIN bookmarks b USING (tweet_id) "
                       "WHERE m.kind = 'photo' GROUP BY b.batch"))
    assert photos[batch1] and photos[batch2]
    for run in runs:
        partition = run.tags["dagster/partition"]
        evaluations = {(e.asset_key.to_user_string(), e.check_name): e for e in (
            r.event_log_entry.dagster_event.event_specific_data for r in inst.get_records_for_run(
                run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION, limit=1000).records)}
        stage_checks = [e for (asset, _), e in evaluations.items() if asset in STAGES]
        assert stage_checks and {e.partition for e in stage_checks} == {partition}, run.job_name
        assert ("captions", "captions_stage") in evaluations
        coverage = evaluations[("captions", "captions_coverage")].metadata
        assert coverage["photos"].value == photos[partition], (partition, coverage)

    # Search finds a post of batch 1: the catch-up indexed it.
    [(tweet_id, text)] = duck(f"SELECT tweet_id, text FROM bookmarks WHERE batch = '{batch1}' "
                              "AND length(text) > 80 ORDER BY tweet_id LIMIT 1")
    hits = search(" ".join(text.split()[:12]), limit=10).hits
    assert tweet_id in {hit.tweet_id for hit in hits}
    assert any(hit.tweet_id == tweet_id and hit.best_source == "post" for hit in hits)

    # Nothing waits now: the next sync makes no catch-up run.
    assert kb("import", "--no-link", str(sample_pages()[2])) == 0
    assert [r.job_name for r in inst.get_runs(limit=2)] == ["x_sync", "x_catch_up"]
    assert len(inst.get_runs()) == 4
