"""Where the runs of `kb sync` execute (kb/apps/run_paths.py): at kb up's
webserver, through Dagster's GraphQL client and kb's owner guard, when kb
up runs for KB_HOME; else in the command's own process."""

from __future__ import annotations

import json
import os
import shutil

import dagster as dg
import pytest

from kb.sample_data import sample_pages
from tests.loopback import free_port
from tests.test_up import Up, wait_until


def write_record(home, parts: list[dict], pid: int | None = None) -> None:
    """A record of kb up, as kb/apps/up_record.py writes it."""
    from kb.apps.up_record import LOCK_NAME, RECORD_NAME, start_time

    pid = pid or os.getpid()
    folder = home / "run"
    folder.mkdir(exist_ok=True)
    (folder / LOCK_NAME).touch()
    (folder / RECORD_NAME).write_text(json.dumps({"pid": pid, "started": start_time(pid), "parts": parts}))


def part(name: str, where: str, pid: int | None = None) -> dict:
    from kb.apps.up_record import start_time

    pid = pid or os.getpid()
    return {"name": name, "pid": pid, "pgid": pid, "started": start_time(pid), "where": where}


def test_a_record_of_kb_up_names_its_webserver_only_when_its_parts_live(kb_home):
    from kb.apps.run_paths import Webserver, kb_up_webserver

    daemon = part("dagster-daemon", "sensors, schedules, run queue, run monitoring")
    assert kb_up_webserver(kb_home) is None  # no kb up ever ran
    write_record(kb_home, [part("dagster-webserver", "http://127.0.0.1:3999"), daemon])
    assert kb_up_webserver(kb_home) == Webserver("127.0.0.1", 3999)
    write_record(kb_home, [part("dagster-webserver", "http://0.0.0.0:3999"), daemon])
    assert kb_up_webserver(kb_home) == Webserver("127.0.0.1", 3999)  # a wildcard bind: loopback
    write_record(kb_home, [part("dagster-webserver", "http://::1:3999"), daemon])
    assert kb_up_webserver(kb_home) == Webserver("[::1]", 3999)
    # Without a daemon a submitted run would wait in the queue for ever.
    write_record(kb_home, [part("dagster-webserver", "http://127.0.0.1:3999")])
    assert kb_up_webserver(kb_home) is None
    # A part whose process is gone (a pid of a dead kb up, used again): the start time differs.
    dead = {**part("dagster-webserver", "http://127.0.0.1:3999"), "started": 1.0}
    write_record(kb_home, [dead, daemon])
    assert kb_up_webserver(kb_home) is None


@pytest.mark.parametrize("where", ["http://evil.example:3000", "http://127.0.0.1.evil.example:3000",
                                   "https://127.0.0.1:3000", "http://127.0.0.1:0", "http://127.0.0.1:99999",
                                   "http://127.0.0.1", "file:///tmp/socket", ""])
def test_a_record_that_names_another_host_sends_no_run_there(kb_home, where):
    """Someone wrote the record: the runs execute here, never at a name
    that DNS resolves (only an IP address or localhost is kb up's bind)."""
    from kb.apps.run_paths import kb_up_webserver

    write_record(kb_home, [part("dagster-webserver", where), part("dagster-daemon", "sensors")])
    assert kb_up_webserver(kb_home) is None


def test_a_re_execution_keeps_the_batch_and_the_owners_choices_only():
    from kb.apps.sync import kept_tags

    parent = dg.DagsterRun(job_name="x_sync", run_id="r1", tags={
        "dagster/partition": "b1", "kb/exclude": "link", "kb/catch_up": "kb sync",
        "dagster/asset_partition_range_start": "b0", "dagster/asset_partition_range_end": "b1",
        # The parent's worker and launch: they would make the new run look dead, or be found as the parent.
        "kb/pid": "123", "kb/host": "h", "kb/boot_id": "x", "kb/launch": "abc",
        # Dagster's own tags of the parent run.
        "dagster/max_retries": "0", ".dagster/grpc_info": "{}", "dagster/run_worker": "w", "other": "v"})
    assert kept_tags(parent) == {"dagster/partition": "b1", "kb/exclude": "link", "kb/catch_up": "kb sync",
                                 "dagster/asset_partition_range_start": "b0",
                                 "dagster/asset_partition_range_end": "b1"}


@pytest.mark.slow  # kb up's parts and their run workers are processes of their own
@pytest.mark.timeout(900)  # kb up's code server, daemon and webserver, and two run workers, on two busy cores
def test_a_sync_under_kb_up_runs_in_its_daemon_and_the_ui_can_re_execute_it(kb_home, tmp_path, monkeypatch):
    """kb up runs (the real parts, behind the owner guard). The runs of the
    sync go to its webserver through Dagster's GraphQL client; its daemon
    executes them; this process prints a line when each stage starts. The
    failed run names the code location "kb", and its re-execution from
    failure goes through the webserver too, as the UI's button."""
    from kb.apps.run_paths import Webserver, answers, kb_up_webserver
    from kb.apps.sync import CATCH_UP_TAG, PARTITION_TAG, Runs, sync_run_config
    from kb_assets.instance_config import ensure_dagster_home
    from kb_assets.partitions import sync_batches

    port = free_port()
    settings = {"KB_EMBED_BACKEND": "hash", "KB_RUN_QUEUE_INTERVAL_S": "1"}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    up = Up({**os.environ, **settings}, "--dagster-port", str(port), "--no-bot", "--no-web")
    with up.parts_ended():
        up.wait_for_line("kb up: running")
        webserver = kb_up_webserver(kb_home)
        assert webserver == Webserver("127.0.0.1", port)
        wait_until(lambda: answers(webserver), "an answer of the webserver", up)
        instance = dg.DagsterInstance.from_config(str(ensure_dagster_home()))
        started: list[str] = []
        runs = Runs(instance, on_stage=lambda stage, number, total: started.append(stage))
        assert runs.webserver == webserver

        batch = "20261205T000000000Z"
        instance.add_dynamic_partitions(sync_batches.name, [batch])
        page = tmp_path / "later.json"
        run_id, stages = runs.run("x_sync", run_config=sync_run_config(files=[str(page)]),
                                  tags={PARTITION_TAG: batch, CATCH_UP_TAG: "kb sync", "kb/exclude": "link"})
        parent = instance.get_run_by_id(run_id)
        assert parent.status == dg.DagsterRunStatus.FAILURE, stages
        assert stages[0].stage == "x_raw_pages" and "no such file" in stages[0].error
        assert started == ["x_raw_pages"]  # the line came from the events that the daemon's worker wrote
        # A run of the code location "kb": the UI can re-execute it.
        assert parent.remote_job_origin.repository_origin.code_location_origin.location_name == "kb"
        assert parent.tags.get("kb/pid") != str(os.getpid())  # its worker is not this process

        shutil.copy(sample_pages()[0], page)  # the cause is fixed
        child_id, stages = runs.reexecute(parent)
        child = instance.get_run_by_id(child_id)
        assert child.status == dg.DagsterRunStatus.SUCCESS, stages
        assert all(s.ok for s in stages) and stages[0].stage == "x_raw_pages", stages
        assert child.parent_run_id == parent.run_id and child.tags[PARTITION_TAG] == batch
        assert child.tags["kb/exclude"] == "link" and child.tags.get("kb/pid") != str(os.getpid())
        assert child.remote_job_origin.repository_origin.code_location_origin.location_name == "kb"
        assert up.stop() < 15
