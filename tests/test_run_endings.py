"""Every ending is told once: each run of any job that ends failed or
canceled gets one notice with the job, the partition and the reason, also
after a restart of the daemon; `kb up` tells when a part dies and when it
restarts in a loop. Without a bot token the notices go to the log and to
`kb status`. Real SQLite instance, loopback Bot API."""

from __future__ import annotations

import sys
import time

import dagster as dg

from kb.settings import get_settings
import pytest

from kb_assets.instance_config import ensure_dagster_home
from kb_resources.services import TelegramNotifierResource
from kb_resources.stores import InboxResource
from sensors.source_outcomes import build_run_endings_sensor
from tests.fake_telegram import owner_bot

TOKEN = "123456:TEST-SECRET-ENDINGS-TOKEN"
OWNER_CHAT = 777
BATCH = "2026-12-01T10-00-00"


@pytest.fixture
def fake(monkeypatch):
    with owner_bot(monkeypatch, TOKEN, OWNER_CHAT) as server:
        yield server


def open_instance() -> dg.DagsterInstance:
    """The instance as the daemon opens it at each start."""
    return dg.DagsterInstance.from_config(str(ensure_dagster_home()))


def tick(instance: dg.DagsterInstance, cursor: str | None) -> str | None:
    context = dg.build_sensor_context(cursor=cursor, instance=instance, resources={
        "telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
    build_run_endings_sensor(get_settings())(context)
    return context.cursor


def ended_run(instance: dg.DagsterInstance, job: str, run_id: str, tags: dict[str, str], *,
              canceled: bool = False, reason: str = "") -> dg.DagsterRun:
    # dagster/max_retries 0: the run is not run again (kb's dagster.yaml allows one retry).
    run = instance.add_run(dg.DagsterRun(job_name=job, run_id=run_id, status=dg.DagsterRunStatus.STARTED,
                                         tags={"dagster/max_retries": "0", **tags}))
    if canceled:
        instance.report_run_canceled(run, "canceled from the Dagster UI")
    else:
        instance.report_run_failed(run, reason)
    return run


def test_each_failed_or_canceled_run_of_any_job_is_told_once_also_after_a_restart(fake):
    instance = open_instance()
    cursor = tick(instance, None)  # the first tick: endings from now on count
    ended_run(instance, "x_sync", "aaaa1111-0000-0000-0000-000000000000", {"dagster/partition": BATCH},
              reason="the capture stopped: X answered HTTP 500")
    ended_run(instance, "backup_job", "bbbb2222-0000-0000-0000-000000000000", {}, canceled=True)
    ended_run(instance, "captions_job", "cccc3333-0000-0000-0000-000000000000",
              {"dagster/asset_partition_range_start": "b1", "dagster/asset_partition_range_end": "b2"},
              reason="the caption backend stopped")
    ended_run(instance, "wiki_lint_job", "dddd4444-0000-0000-0000-000000000000",
              {"dagster/partition": "2026-12-02"}, reason="the agent endpoint answered 529")
    # A run that Dagster runs again is not the end: its retry tells.
    ended_run(instance, "extract_job", "eeee5555-0000-0000-0000-000000000000",
              {"dagster/partition": BATCH, "dagster/max_retries": "1"}, reason="a first try")
    assert instance.get_run_by_id("eeee5555-0000-0000-0000-000000000000").tags["dagster/will_retry"] == "true"

    # The Bot API fails once: nothing is lost, the next tick sends it.
    fake.send_errors = [(502, "Bad Gateway")]
    assert tick(instance, cursor) == cursor and fake.sent == []
    after = tick(instance, cursor)
    assert [m["chat_id"] for m in fake.sent] == [OWNER_CHAT] * 4
    assert [m["text"] for m in fake.sent] == [
        f"failed: x_sync partition {BATCH}: the capture stopped: X answered HTTP 500 (run aaaa1111)",
        "canceled: backup_job: the run was canceled (run bbbb2222)",
        "failed: captions_job partition b1...b2: the caption backend stopped (run cccc3333)",
        "failed: wiki_lint_job partition 2026-12-02: the agent endpoint answered 529 (run dddd4444)",
    ]
    # The daemon starts again: a new instance, the cursor that Dagster kept, or an
    # older one (the last tick's cursor was not stored): no notice goes out twice.
    instance.dispose()
    instance = open_instance()
    assert tick(instance, after) == after
    tick(instance, cursor)
    assert len(fake.sent) == 4
    ended_run(instance, "normalize_job", "ffff6666-0000-0000-0000-000000000000", {"dagster/partition": BATCH},
              reason="a raw page is not JSON")
    tick(instance, after)
    assert len(fake.sent) == 5 and fake.sent[-1]["text"].startswith(f"failed: normalize_job partition {BATCH}")


def test_without_a_bot_the_notices_go_to_the_log_and_to_kb_status(capsys):
    from kb.apps.status import collect_status, format_status

    instance = open_instance()
    cursor = tick(instance, None)
    ended_run(instance, "x_sync", "abcd0000-0000-0000-0000-000000000000", {"dagster/partition": BATCH},
              reason="Chromium did not start")
    tick(instance, cursor)
    text = f"failed: x_sync partition {BATCH}: Chromium did not start (run abcd0000)"
    assert f"[kb] {text}" in capsys.readouterr().out  # the daemon's log
    [notice] = collect_status()["unsent_notices"]
    assert notice["text"] == text and notice["not_sent"] == "no TELEGRAM_BOT_TOKEN"
    assert f"  {notice['at']}  {text}" in format_status(collect_status())


def test_kb_up_tells_when_a_part_dies_and_once_when_it_restarts_in_a_loop(fake, tmp_path):
    from kb.apps import up
    from kb.telegram.notifier import TelegramNotifier

    part = up.Part("kb web", [sys.executable, "-c", "import sys; sys.exit(4)"], "a part that dies",
                   tmp_path / "web.log")
    supervisor = up.Supervisor([part], [], {}, tmp_path, TelegramNotifier.from_settings())
    part.start(supervisor.env | {"PATH": "/usr/bin:/bin"})
    part.wait_s = 0.0  # no growing waits in a test
    deadline = time.monotonic() + 60
    while len(part.deaths) < 6 and time.monotonic() < deadline:
        supervisor.watch()
        part.wait_s = 0.0
        time.sleep(0.05)
    supervisor.stop_all()
    assert len(part.deaths) == 6
    texts = [m["text"] for m in fake.sent]
    # One notice for each of the first 3 stops, then one for the loop, then silence.
    # Each notice goes out in its own thread, so they can come in any order
    # (the loop notice came before a stop notice at load 4, 3 December 2026).
    assert len(texts) == 4, texts
    assert sum(t.startswith("kb up: kb web stopped (exit 4) after ") for t in texts) == 3, texts
    assert (f"kb up: kb web restarts in a loop: 4 stops in 10 minutes. Read its log: {tmp_path / 'web.log'}"
            in texts)
    assert all(m["chat_id"] == OWNER_CHAT for m in fake.sent)
