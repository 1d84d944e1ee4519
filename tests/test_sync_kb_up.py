"""Where the runs of `kb sync` execute (kb/apps/run_paths.py): at kb up's
webserver, through Dagster's GraphQL client and kb's owner guard, when kb
up runs for KB_HOME; else in the command's own process. The run of a sync
under a real kb up is checked in tests/test_up.py, on the kb up of its
restart (check_a_sync_under_kb_up): one kb up start less."""

from __future__ import annotations

import json
import os

import dagster as dg
import pytest


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
