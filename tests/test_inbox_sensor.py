"""The inbox sensor and the request sensors, with build_sensor_context:
new items, the cursor, no loss and no repeat."""

import os
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import dagster as dg

from kb_assets.partitions import sources
from kb_assets.keys import OVERRIDE_TAG, TOPIC_TAG
from kb_assets.telegram.sources import gated_sources, parsed_sources, source_intake_job
from kb.wiki.weeks import iso_week_label
from kb_assets.wiki.wiki_pages import (
    wiki_lint,
    wiki_lint_days,
    wiki_lint_job,
    wiki_pages,
    wiki_synthesis,
    wiki_synthesis_job,
    wiki_synthesis_weeks,
    wiki_topic_job,
    wiki_topic_synthesis,
    wiki_topics,
)
from kb.settings import get_settings
from sensors.inbox_folder import MAX_ITEMS_PER_TICK, build_bot_requests_sensor, build_inbox_sensor, build_wiki_requests_sensor
from sensors.source_outcomes import build_run_endings_sensor, build_source_outcomes_sensor
from kb.telegram.inbox import FileStillChanging, Inbox, dropped_item_id
from kb.telegram.notifier import TelegramNotifier
from kb_assets.telegram.source_index import source_passages
from tests import source_helpers as h
from kb_resources.services import TelegramNotifierResource
from kb_resources.stores import InboxResource


def tick(build, cursor=None, instance=None, definitions=None):
    """One tick of the sensor that `build` makes from the settings."""
    context = dg.build_sensor_context(cursor=cursor, instance=instance or dg.DagsterInstance.ephemeral(),
                                      definitions=definitions,
                                      resources=None if definitions else {"inbox": InboxResource.from_settings()})
    return build(get_settings())(context)


def run_keys(result) -> list[str]:
    return [r.run_key for r in result.run_requests]


def added_partitions(result) -> list[str]:
    return [key for request in result.dynamic_partitions_requests for key in request.partition_keys]


def test_new_items_become_partitions_and_runs_keyed_by_item_id():
    items = [h.add_item("text", n, text=f"note {n} " * 10) for n in range(1, 4)]
    result = tick(build_inbox_sensor)
    ids = [item.id for item in items]
    assert run_keys(result) == ids
    assert [r.partition_key for r in result.run_requests] == ids
    assert added_partitions(result) == ids
    assert result.dynamic_partitions_requests[0].partitions_def_name == sources.name
    assert result.cursor == items[-1].manifest
    # The next tick, with the cursor, has nothing to do: no repeat.
    assert isinstance(tick(build_inbox_sensor, cursor=result.cursor), dg.SkipReason)
    # A new item after the cursor is the only one in the next tick.
    newer = h.add_item("text", 4, text="note 4 " * 10)
    later = tick(build_inbox_sensor, cursor=result.cursor)
    assert run_keys(later) == [newer.id] and later.cursor == newer.manifest


def test_a_crash_before_the_cursor_is_stored_loses_nothing_and_repeats_nothing():
    items = [h.add_item("text", n, text=f"note {n} " * 10) for n in range(1, 3)]
    instance = dg.DagsterInstance.ephemeral()
    first = tick(build_inbox_sensor, instance=instance)
    # The daemon added the partitions, then died before it stored the cursor.
    instance.add_dynamic_partitions(sources.name, added_partitions(first))
    again = tick(build_inbox_sensor, cursor=None, instance=instance)
    # Same requests: adding a partition that exists changes nothing, and the
    # daemon does not start a second run for a run key it has seen.
    assert run_keys(again) == run_keys(first) == [i.id for i in items]
    instance.add_dynamic_partitions(sources.name, added_partitions(again))
    assert sorted(instance.get_dynamic_partitions(sources.name)) == sorted(i.id for i in items)


@pytest.mark.slow
def test_a_burst_is_taken_in_slices_without_loss():
    inbox = h.inbox()
    ids = [h.add_item("text", n, text="x" * 60).id for n in range(MAX_ITEMS_PER_TICK + 5)]
    first = tick(build_inbox_sensor)
    second = tick(build_inbox_sensor, cursor=first.cursor)
    assert len(run_keys(first)) == MAX_ITEMS_PER_TICK
    assert run_keys(first) + run_keys(second) == ids
    assert second.cursor == inbox.manifest_names_after(None)[-1]


def test_manifest_names_only_go_up_even_when_the_clock_steps_back():
    inbox = h.inbox()
    inbox.root.mkdir(parents=True, exist_ok=True)
    future = "29991231T235959999999Z"
    (inbox.root / ".last-stamp").write_text(future)
    item = h.add_item("text", 1, text="y" * 60)
    assert item.manifest > future
    result = tick(build_inbox_sensor, cursor=f"{future}-zzzz.json")
    assert run_keys(result) == [item.id]


def test_half_written_manifests_are_not_seen():
    inbox = h.inbox()
    inbox.items_dir.mkdir(parents=True)
    (inbox.items_dir / ".20260101T000000000000Z-abc.json.x1.tmp").write_text("{")
    assert isinstance(tick(build_inbox_sensor), dg.SkipReason)


def test_files_dropped_in_the_inbox_become_items(monkeypatch):
    monkeypatch.setenv("KB_INBOX_SETTLE_S", "0")  # the files are whole: no wait (see the tests below)
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    pdf, note, link, odd = b"%PDF-1.7 dropped", b"# Dropped\n\nnotes " * 5, b"https://example.com/dropped\n", b"MZ binary"
    (inbox.root / "paper.pdf").write_bytes(pdf)
    (inbox.root / "notes.md").write_bytes(note)
    (inbox.root / "link.txt").write_bytes(link)
    (inbox.root / "tool.exe").write_bytes(odd)
    result = tick(build_inbox_sensor)
    items = {item.file_name: item for item in (inbox.find(key) for key in run_keys(result))}
    assert set(items) == {"paper.pdf", "notes.md", "link.txt"}
    assert items["paper.pdf"].id == dropped_item_id(pdf)
    assert (items["paper.pdf"].type, items["notes.md"].type) == ("pdf", "md")
    assert (items["link.txt"].type, items["link.txt"].url, items["link.txt"].file) == ("web", "https://example.com/dropped", None)
    assert inbox.attachment_path(items["paper.pdf"]).read_bytes() == pdf
    assert all(item.origin == "drop" and item.is_system for item in items.values())
    assert inbox.dropped_files() == []
    assert (inbox.root / "unsupported" / "tool.exe").read_bytes() == odd
    # The same file dropped again is the same item: nothing new.
    (inbox.root / "paper again.pdf").write_bytes(pdf)
    assert isinstance(tick(build_inbox_sensor, cursor=result.cursor), dg.SkipReason)
    assert inbox.dropped_files() == []


def test_an_adoption_cut_off_after_the_manifest_is_finished_next_tick(monkeypatch):
    monkeypatch.setenv("KB_INBOX_SETTLE_S", "0")
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    dropped = inbox.root / "notes.md"
    dropped.write_bytes(b"# A note\n\nwith enough words to be a source of its own")
    item = inbox.adopt_dropped_file(dropped)
    dropped.write_bytes(b"# A note\n\nwith enough words to be a source of its own")  # as if unlink never ran
    result = tick(build_inbox_sensor)
    assert run_keys(result) == [item.id]
    assert inbox.dropped_files() == []


# Long enough that a tick right after a write comes before it on a loaded
# machine; each test waits it once or twice.
SETTLE_S = 1.0


def settled_tick(instance):
    """A tick after the settle time: the dropped file has not changed since."""
    time.sleep(SETTLE_S + 0.05)
    return tick(build_inbox_sensor, instance=instance)


def test_a_file_that_grows_between_ticks_is_taken_whole_when_it_stops(monkeypatch):
    """Another program copies a large file into the inbox. Each tick during
    the copy leaves it; the first tick after it stayed unchanged for
    KB_INBOX_SETTLE_S takes all of it."""
    monkeypatch.setenv("KB_INBOX_SETTLE_S", str(SETTLE_S))
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    whole = b"%PDF-1.7\n" + os.urandom(3 << 20)
    dropped = inbox.root / "report.pdf"
    instance = dg.DagsterInstance.ephemeral()
    with dropped.open("wb") as copy:
        for start, end in ((0, 1009), (1009, 1 << 20), (1 << 20, 2 << 20)):
            copy.write(whole[start:end])
            copy.flush()
            assert isinstance(tick(build_inbox_sensor, instance=instance), dg.SkipReason)  # it waits; nothing is taken
            assert dropped.stat().st_size == end and inbox.dropped_files() == [dropped]
        copy.write(whole[2 << 20:])
    result = settled_tick(instance)
    [item_id] = run_keys(result)
    item = inbox.find(item_id)
    assert inbox.attachment_path(item).read_bytes() == whole
    assert (item.file_size, item.id) == (len(whole), dropped_item_id(whole))
    assert inbox.dropped_files() == []


def test_a_copy_that_sets_an_old_modification_time_still_waits(monkeypatch):
    """cp -p and touch -r set the modification time; the change time shows
    that the file was just written."""
    monkeypatch.setenv("KB_INBOX_SETTLE_S", str(SETTLE_S))
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    dropped = inbox.root / "notes.md"
    instance = dg.DagsterInstance.ephemeral()
    note = b"# Notes\n\nthe first part of a long note, " * 20
    dropped.write_bytes(note)
    os.utime(dropped, (time.time() - 3600, time.time() - 3600))
    assert isinstance(tick(build_inbox_sensor, instance=instance), dg.SkipReason)
    assert inbox.dropped_files() == [dropped]
    assert run_keys(settled_tick(instance)) == [dropped_item_id(note)]


def test_a_partial_download_waits_for_its_final_name(monkeypatch):
    monkeypatch.setenv("KB_INBOX_SETTLE_S", str(SETTLE_S))
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    instance = dg.DagsterInstance.ephemeral()
    partial = inbox.root / "paper.pdf.crdownload"
    partial.write_bytes(b"%PDF-1.7 half")
    assert isinstance(settled_tick(instance), dg.SkipReason)
    assert partial.exists() and not (inbox.root / "unsupported").exists()  # not taken as an odd type
    partial.write_bytes(b"%PDF-1.7 half and the rest")
    partial.rename(inbox.root / "paper.pdf")
    assert run_keys(settled_tick(instance)) == [dropped_item_id(b"%PDF-1.7 half and the rest")]


def test_a_file_that_changes_while_it_is_read_is_left_for_a_later_tick():
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    dropped = inbox.root / "grows.md"
    dropped.write_bytes(b"# Grows\n\n" + b"words " * 100)
    real_read = Path.read_bytes

    def read_while_it_grows(path):
        data = real_read(path)
        with path.open("ab") as more:  # the other program writes on
            more.write(b"more words ")
        return data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "read_bytes", read_while_it_grows)
        with pytest.raises(FileStillChanging, match=r"grows.md changed while kb read it \(609 of 620 bytes\)"):
            inbox.adopt_dropped_file(dropped)
    assert inbox.dropped_files() == [dropped] and not (inbox.root / "items").exists()


def test_override_requests_run_the_item_again_with_the_override_tag():
    item = h.add_item("text", 1, text="z" * 60)
    inbox = h.inbox()
    inbox.add_request("override", item_id=item.id, user_id=h.OWNER_ID)
    inbox.add_request("override", item_id="0000000000", user_id=h.OWNER_ID)
    inbox.add_request("lint", user_id=h.OWNER_ID)
    result = tick(build_bot_requests_sensor)
    [request] = result.run_requests
    assert request.partition_key == item.id
    assert request.run_key.startswith("override-") and request.tags[OVERRIDE_TAG] == "true"
    assert added_partitions(result) == [item.id]
    assert result.cursor == inbox.request_names_after(None)[-1]
    assert isinstance(tick(build_bot_requests_sensor, cursor=result.cursor), dg.SkipReason)


def test_intake_job_keeps_run_retries_for_crashes_only():
    assert source_intake_job.tags == {"dagster/retry_on_asset_or_op_failure": "false"}


def test_lint_and_synthesis_requests_run_the_wiki_jobs():
    inbox = Inbox(get_settings().inbox_dir)
    inbox.add_request("lint", user_id=h.OWNER_ID)
    inbox.add_request("synthesize", topic="Raft Consensus!", user_id=h.OWNER_ID)
    inbox.add_request("synthesize", topic="", user_id=h.OWNER_ID)
    inbox.add_request("synthesize", topic="???", user_id=h.OWNER_ID)
    inbox.add_request("override", item_id="0000000000", user_id=h.OWNER_ID)
    result = tick(build_wiki_requests_sensor)
    lint, topic, weekly = result.run_requests
    today = datetime.now(ZoneInfo(get_settings().tz)).date()
    assert (lint.job_name, lint.partition_key) == (wiki_lint_job.name, today.isoformat())
    # Today in TZ is a partition of the lint in every zone (end_offset=2, in UTC).
    assert today.isoformat() in wiki_lint_days.get_partition_keys()
    assert (topic.job_name, topic.partition_key, topic.tags[TOPIC_TAG]) == (
        wiki_topic_job.name, "raft-consensus", "Raft Consensus!")
    assert added_partitions(result) == ["raft-consensus"]
    assert result.dynamic_partitions_requests[0].partitions_def_name == wiki_topics.name
    week = (today - timedelta(days=today.weekday())).isoformat()
    assert (weekly.job_name, weekly.partition_key) == (wiki_synthesis_job.name, week)
    assert week in wiki_synthesis_weeks.get_partition_keys()
    assert weekly.tags["week"] == iso_week_label(date.fromisoformat(week)) and TOPIC_TAG not in weekly.tags
    assert len({lint.run_key, topic.run_key, weekly.run_key}) == 3
    assert result.cursor == inbox.request_names_after(None)[-1]
    assert isinstance(tick(build_wiki_requests_sensor, cursor=result.cursor), dg.SkipReason)


def test_the_sensors_load_with_the_real_wiki_stage():
    definitions = dg.Definitions(
        assets=[parsed_sources, gated_sources, source_passages, wiki_pages, wiki_lint, wiki_synthesis,
                wiki_topic_synthesis],
        jobs=[source_intake_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job],
        sensors=[build(get_settings()) for build in (build_inbox_sensor, build_bot_requests_sensor,
                 build_wiki_requests_sensor, build_source_outcomes_sensor, build_run_endings_sensor)],
        resources={**h.resources(), "telegram": TelegramNotifierResource.from_settings()},
    )
    dg.Definitions.validate_loadable(definitions)
    job = definitions.resolve_job_def(source_intake_job.name)
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == {
        "parsed_sources", "gated_sources", "source_passages", "wiki_pages"}


def test_today_in_every_zone_is_a_partition_of_the_lint_and_the_synthesis():
    """The partitions are in UTC (they are built at import; TZ is read at
    each load): the day and the week of the farthest zones must be keys."""
    from kb_assets.wiki.wiki_pages import monday_in_zone, today_in_zone

    lint_days, weeks = set(wiki_lint_days.get_partition_keys()), set(wiki_synthesis_weeks.get_partition_keys())
    for zone in ("Pacific/Kiritimati", "Etc/GMT+12", "Europe/Berlin", "UTC"):  # UTC+14, UTC-12
        assert today_in_zone(zone).isoformat() in lint_days, zone
        assert monday_in_zone(zone).isoformat() in weeks, zone
