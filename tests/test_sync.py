"""`kb sync` / `kb import`: one run of the job x_sync per new batch, in the
instance under KB_HOME; a stage whose service is down does not stop the
index; a failed run is re-executed from failure through Dagster's public API."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from kb.sample_data import sample_pages
from kb.settings import get_settings

pytestmark = pytest.mark.slow  # slow: whole Dagster runs of the graph, 1 to 3 s of CPU each

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def offline_stages(monkeypatch):
    # The deterministic embedder: no model load.
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")


def kb(*argv: str) -> int:
    """The `kb` command line, in this process; returns its exit code."""
    from kb.apps.cli import main

    try:
        main(list(argv), prog_name="kb", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def instance() -> dg.DagsterInstance:
    from kb_assets.instance_config import ensure_dagster_home

    return dg.DagsterInstance.from_config(str(ensure_dagster_home()))


def duck(sql: str) -> list[tuple]:
    conn = duckdb.connect(str(get_settings().duckdb_path), read_only=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _materialized_partitions(inst: dg.DagsterInstance, asset: str) -> list[str]:
    records = inst.fetch_materializations(dg.AssetKey(asset), limit=100).records
    return sorted(r.partition_key for r in records)


def test_kb_import_makes_one_x_sync_run_per_batch():
    from kb.index.client import ChunkIndex

    pages = [str(p) for p in sample_pages()]
    assert kb("import", "--no-link", *pages[:2]) == 0
    inst = instance()
    [first] = inst.get_runs()
    # One run of the job that the sensor and the UI launch, for the batch's partition.
    assert first.job_name == "x_sync" and first.status == dg.DagsterRunStatus.SUCCESS
    batch1 = first.tags["dagster/partition"]
    assert inst.get_dynamic_partitions("sync_batches") == [batch1]
    # The per-run choice is a tag of the run, not an environment variable.
    assert first.tags["kb/exclude"] == "link"
    assert first.tags["dagster/max_retries"] == "0"  # x_sync holds GPU stages
    # Without kb up the run executed here (dg.execute_job): a run worker and
    # a re-execution build its job from kb's Definitions again.
    pointer = first.job_code_origin.repository_origin.code_pointer
    assert (pointer.reconstructor_pointer.module, pointer.reconstructor_pointer.fn_name) == (
        "kb_assets.definitions", "job_named")
    assert pointer.reconstructable_args[0] == "x_sync"
    assert first.tags["kb/launch"] == pointer.reconstructable_args[1]

    assert kb("import", "--no-link", *pages[2:]) == 0
    runs = inst.get_runs()
    assert len(runs) == 2 and {r.job_name for r in runs} == {"x_sync"}
    batch2 = runs[0].tags["dagster/partition"]
    for asset in ("x_raw_pages", "bookmarks", "chunks", "chunk_index"):
        # Each batch was materialized once: the second sync did not redo the first.
        assert _materialized_partitions(inst, asset) == sorted([batch1, batch2]), asset
    per_batch = dict(duck("SELECT batch, count(*) FROM bookmarks GROUP BY batch"))
    assert set(per_batch) == {batch1, batch2} and sum(per_batch.values()) == 39
    assert duck("SELECT count(*) FROM documents WHERE kind = 'link'") == [(0,)]  # no link fetched
    assert ChunkIndex.from_settings().counts()["bookmarks"] == 39


@pytest.mark.timeout(120)  # a reader that slept its poll would hold the command for an hour
def test_a_command_ends_when_its_run_ends_and_not_at_the_next_poll(monkeypatch):
    """The reader of the events waits on the end of the run, not on a
    sleep: the command returns when its run ends, with every stage read.
    Two runs: the reader looks for the first one with a long poll from the
    start; it finds the second one while it runs (a short poll), and the
    poll is long from the first stage line on."""
    import kb.apps.sync as sync
    from kb_assets.partitions import sync_batches

    inst = instance()
    pages = sample_pages()
    finished_at_first_line: list[bool] = []

    def on_stage(stage: str, number: int, total: int) -> None:
        started.append(stage)
        if not finished_at_first_line:
            finished_at_first_line.append(inst.get_runs(limit=1)[0].is_finished)
            monkeypatch.setattr(sync, "FOLLOW_POLL_S", 3600)

    for n, poll in enumerate((3600, 0.05)):
        monkeypatch.setattr(sync, "FOLLOW_POLL_S", poll)
        batch = f"2026120{n + 1}T000000000Z"
        inst.add_dynamic_partitions(sync_batches.name, [batch])
        started: list[str] = []
        finished_at_first_line.clear()
        runs = sync.Runs(inst, on_stage=on_stage)
        run_id, stages = runs.run("x_sync", run_config=sync.sync_run_config(files=[str(pages[n])]),
                                  tags={sync.PARTITION_TAG: batch, "kb/exclude": "link"})
        assert inst.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS, stages
        assert all(s.ok for s in stages) and started == [s.stage for s in stages if s.ran], stages
    assert finished_at_first_line == [False]  # the second run: its reader followed it while it ran


def test_a_stage_whose_service_is_down_does_not_stop_the_index(monkeypatch):
    from kb.apps.sync import run_sync
    from kb.index.client import ChunkIndex

    # The translation endpoint is down: nothing listens on its port.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv("GROQ_API_KEY", "gsk-TEST-SECRET-translate-0001")
    monkeypatch.setenv("GROQ_BASE_URL", f"http://127.0.0.1:{closed_port}/openai/v1")
    # No retries: the groq client's 6 retries of a refused connection wait
    # about 20 s of back-off, and the port stays closed.
    monkeypatch.setenv("KB_TRANSLATE_MAX_RETRIES", "0")
    report = run_sync(files=[str(p) for p in sample_pages()], exclude=["link"])

    assert report.failed == ["translations"]
    translations = next(s for s in report.stages if s.stage == "translations")
    assert "Translation stopped" in translations.error
    # The run went on: the index of what exists is built.
    [run] = instance().get_runs()
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert next(s for s in report.stages if s.stage == "chunk_index").ok
    assert ChunkIndex.from_settings().counts()["bookmarks"] == 39
    assert duck("SELECT count(*) FROM translations") == [(0,)]  # the foreign texts wait


def test_a_failed_run_is_re_executed_from_failure_by_the_next_sync(tmp_path):
    """The parent run fails in the capture (its page is not there yet). The
    next sync re-executes it from failure in this process (dg.execute_job
    with dg.ReexecutionOptions.from_failure), with the parent's config and
    kb's tags of the parent. Under kb up, the UI does it:
    check_a_sync_under_kb_up in tests/test_up.py."""
    import os

    from kb.apps.sync import run_sync

    page = tmp_path / "later.json"
    report = run_sync(files=[str(page)], exclude=["link"])
    assert report.failed[0] == "x_raw_pages" and "no such file" in report.stages[0].error
    assert report.failed == ["x_raw_pages"]
    inst = instance()
    # The stages after the capture did not run in its run. No earlier batch
    # holds work that waits: no catch-up run (tests/test_partitions.py has one).
    [parent] = inst.get_runs()
    assert parent.job_name == "x_sync" and parent.status == dg.DagsterRunStatus.FAILURE

    shutil.copy(sample_pages()[0], page)  # the cause is fixed
    started: list[str] = []
    again = run_sync(files=[str(sample_pages()[1])], exclude=["link"],
                     on_stage=lambda stage, number, total: started.append(stage))
    assert again.resumed == [report.batch] and not again.failed, again.stages
    # A line for each stage as it started, read from the events while dg.execute_job ran.
    assert started == [s.stage for s in again.stages] and len(started) > 8
    child = next(r for r in inst.get_runs() if r.parent_run_id == parent.run_id)
    assert child.status == dg.DagsterRunStatus.SUCCESS, child.status
    assert child.tags["dagster/partition"] == report.batch
    assert child.tags["kb/exclude"] == "link"  # the parent's per-run choice came along
    assert child.tags["kb/pid"] == str(os.getpid()) and child.tags["kb/launch"] != parent.tags["kb/launch"]
    # From failure: the capture again, and the steps after it.
    assert child.step_keys_to_execute[0] == "x_raw_pages"
    assert duck(f"SELECT count(*) > 0 FROM bookmarks WHERE batch = '{report.batch}'") == [(True,)]
    assert set(_materialized_partitions(inst, "chunk_index")) == {report.batch, again.batch}


def test_a_second_kb_home_in_the_same_process_gets_its_own_stores(tmp_path, monkeypatch):
    """One process, two KB_HOMEs (kb demo, then the owner's home; a script):
    the second run writes to the second home, not to the first."""
    from kb.apps.sync import run_sync
    from kb.index.client import ChunkIndex

    counts = []
    for name in ("first", "second"):
        home = tmp_path / name
        monkeypatch.setenv("KB_HOME", str(home))
        monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
        # No links: the sample's links are on the real web, which a test must not reach.
        report = run_sync(files=[str(p) for p in sample_pages()[:2]], exclude=["link"])
        assert not report.failed
        counts.append(ChunkIndex.from_settings().counts()["bookmarks"])
        assert [p.name for p in (home / "raw").iterdir()], f"no raw files in {home}"
    assert counts[0] > 0 and counts[1] == counts[0]


def test_a_run_executed_here_has_the_job_of_the_code_location(monkeypatch):
    """kb builds the job of a run that executes here from the Definitions
    (kb_assets.definitions.job_named): the same job as the code location's,
    with the settings of the launch's moment. While the settings stay the
    same, a launch takes the job built before (a new build cost 40 to 50 ms
    of CPU, about four times per run); after a change, a new build."""
    from kb.apps.run_paths import reconstructable_job
    from kb_assets.definitions import defs

    monkeypatch.setenv("TZ", "UTC")
    loaded = defs().resolve_job_def("x_sync")
    first, second = (reconstructable_job("x_sync", launch).get_definition() for launch in ("a", "b"))
    assert first.get_job_snapshot_id() == loaded.get_job_snapshot_id() == second.get_job_snapshot_id()
    assert first is second is loaded
    assert first.tags["dagster/max_retries"] == "0"
    monkeypatch.setenv("TZ", "Europe/Berlin")  # the owner changes a setting
    third = reconstructable_job("x_sync", "c").get_definition()
    assert third is not first and third is defs().resolve_job_def("x_sync")
    assert defs().resources["embedder"]._settings.tz == "Europe/Berlin"


def test_the_weekly_full_sync_starts_once_a_week_and_removed_bookmarks_leave_search(tmp_path, monkeypatch):
    """The weekly sensor asks for a full sync once per weekly time, also after
    a restart, and waits for the X login. A full capture without a bookmark
    (the owner removed it on X) takes it out of search."""
    import json
    from datetime import datetime, timedelta, timezone

    from kb.apps.sync import run_sync
    from kb.index.search import search
    from sensors.x_sync_sensor import FULL_SYNC_TAG, build_x_full_sync_sensor
    from tests.x_fixtures import all_tweet_entries, paged_bookmarks

    before = datetime.now(timezone.utc) - timedelta(minutes=2)
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("KB_FULL_SYNC_DAY", before.strftime("%a"))
    monkeypatch.setenv("KB_FULL_SYNC_TIME", before.strftime("%H:%M"))
    due = before.replace(second=0, microsecond=0)

    def tick(cursor: str | None):
        context = dg.build_sensor_context(cursor=cursor, instance=instance())
        result = build_x_full_sync_sensor(get_settings())(context)
        return result, context.cursor

    result, cursor = tick(None)  # the first look: not now, one week on
    assert isinstance(result, dg.SkipReason) and cursor == due.isoformat()
    result, same = tick(cursor)  # the daemon starts again: not a second full sync
    assert isinstance(result, dg.SkipReason) and same == cursor
    week_ago = (due - timedelta(days=7)).isoformat()
    result, kept = tick(week_ago)  # a week later, with no X login: it waits
    assert "no X login" in result.skip_message and kept == week_ago
    get_settings().x_state_path.write_text("{}")
    result, _ = tick(week_ago)
    [request] = result.run_requests
    assert request.run_config == {"ops": {"x_raw_pages": {"config": {"full": True}}}}
    assert request.tags[FULL_SYNC_TAG] == due.isoformat() and result.cursor == due.isoformat()
    assert [r.partition_keys for r in result.dynamic_partitions_requests] == [[request.partition_key]]
    result, _ = tick(result.cursor)  # the next look, or a restart of the daemon: the week has its full sync
    assert "has started already" in result.skip_message

    # What that run does: a full capture, here from saved pages (no browser).
    entries = all_tweet_entries()[:30]
    gone = entries[4]["entryId"].removeprefix("tweet-")

    def pages(kept: list[dict], name: str) -> list[str]:
        folder = tmp_path / name
        folder.mkdir()
        files = []
        for n, page in enumerate(paged_bookmarks(kept, page_size=10)):
            files.append(folder / f"page-{n + 1:04d}.json")
            files[-1].write_text(json.dumps(page))
        return [str(f) for f in files]

    def found() -> set[str]:
        text = duck(f"SELECT text FROM bookmarks WHERE tweet_id = '{gone}'")[0][0]
        return {hit.tweet_id for hit in search(" ".join(text.split()[:12]), limit=10).hits}

    assert run_sync(files=pages(entries, "first"), exclude=["link"]).failed == []
    assert gone in found()
    report = run_sync(full=True, files=pages([e for e in entries if e is not entries[4]], "full"), exclude=["link"])
    assert report.failed == []
    assert duck(f"SELECT removed_at IS NOT NULL FROM bookmarks WHERE tweet_id = '{gone}'") == [(True,)]
    assert gone not in found()
