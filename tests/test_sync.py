"""`kb sync` / `kb import`: one new partition per sync, every stage in order,
a failed stage does not stop the others."""

from __future__ import annotations

import dagster as dg
import pytest

from kb.sample_data import sample_pages


@pytest.fixture(autouse=True)
def offline_stages(monkeypatch):
    # The deterministic embedder: no model load. No fetches of the sample's links.
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    monkeypatch.setenv("KB_EXCLUDE", "link")


def _materialized_partitions(instance: dg.DagsterInstance, asset: str) -> list[str]:
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=100).records
    return sorted(r.partition_key for r in records)


def test_a_new_sync_materializes_only_the_new_partition():
    from kb.apps.sync import run_sync
    from kb.lance_index import ChunkIndex

    pages = sample_pages()
    first = run_sync(files=[str(p) for p in pages[:2]])
    assert first.failed == []
    second = run_sync(files=[str(p) for p in pages[2:]])
    assert second.failed == []
    assert first.batch != second.batch

    instance = dg.DagsterInstance.get()
    for asset in ("x_raw_pages", "bookmarks", "chunks", "chunk_index"):
        # Each batch was materialized once: the second sync did not redo the first.
        assert _materialized_partitions(instance, asset) == sorted([first.batch, second.batch]), asset

    import duckdb
    from kb.settings import get_settings

    conn = duckdb.connect(str(get_settings().duckdb_path), read_only=True)
    try:
        per_batch = dict(conn.execute("SELECT batch, count(*) FROM bookmarks GROUP BY batch").fetchall())
        chunked = conn.execute("SELECT count(DISTINCT tweet_id) FROM chunks").fetchone()[0]
    finally:
        conn.close()
    assert set(per_batch) == {first.batch, second.batch}
    assert sum(per_batch.values()) == 39
    counts = ChunkIndex.from_settings().counts()
    assert counts["bookmarks"] == 39
    assert counts["chunks"] > 0 and chunked > 30


def test_a_failed_stage_does_not_stop_the_stages_after_it(tmp_path):
    from kb.apps.sync import run_sync

    missing = tmp_path / "no-such-page.json"
    report = run_sync(files=[str(missing)])
    assert "capture" in report.failed
    capture = next(s for s in report.stages if s.stage == "capture")
    assert "no-such-page.json" in capture.error
    # Later stages still ran (and had nothing to do, or failed on their own).
    ran = [s.stage for s in report.stages]
    assert ran[-1] == "index" and len(ran) >= 4
