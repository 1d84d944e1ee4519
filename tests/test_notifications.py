"""Notifications through the loopback Bot API: threaded replies, the owner
chat for system items, stdout without a token, at most once per item and
state, and the two sensors that send them."""

import dagster as dg
import pytest

from kb.settings import get_settings
from kb_assets.partitions import sources
from sensors.source_outcomes import build_run_endings_sensor, build_source_outcomes_sensor
from kb.telegram.notifier import NotificationError, TelegramNotifier, notification_text
from tests import source_helpers as h
from tests.fake_openai_chat import FakeOpenAIChat, chat
from tests.fake_telegram import owner_bot
from tests.loopback_site import LoopbackSite
from kb_resources.services import TelegramNotifierResource
from kb_resources.stores import InboxResource

# The loopback sites stand in for the web: let the fetch guard reach them.
pytestmark = [pytest.mark.usefixtures('loopback_fetches'), pytest.mark.slow]  # slow: a sync, sensors and source runs

TOKEN = "123456:TEST-SECRET-TOKEN"
OWNER_CHAT = 555
NOTE = "Leases let a leader serve reads without a quorum round, as long as the clocks behave."


@pytest.fixture
def fake(monkeypatch):
    with owner_bot(monkeypatch, TOKEN, OWNER_CHAT) as server:
        yield server


def test_a_notification_is_a_reply_and_goes_out_once_per_state(fake):
    item = h.add_item("web", 42, url="https://example.com/a")
    notifier = TelegramNotifier.from_settings()
    assert notifier.notify(item.id, "rejected", "rejected: a") is True
    assert notifier.notify(item.id, "rejected", "rejected: a") is False
    assert TelegramNotifier.from_settings().notify(item.id, "rejected", "after a restart") is False
    assert notifier.notify(item.id, "done", "done: a") is True
    assert fake.sent == [
        {"chat_id": h.OWNER_ID, "text": "rejected: a", "reply_to_message_id": 42},
        {"chat_id": h.OWNER_ID, "text": "done: a", "reply_to_message_id": 42},
    ]


def test_system_items_go_to_the_owner_chat(fake):
    inbox = h.inbox()
    inbox.root.mkdir(parents=True)
    (inbox.root / "dropped.md").write_text("# Dropped\n\nA file that the owner dropped in the inbox folder.")
    item = inbox.adopt_dropped_file(inbox.root / "dropped.md")
    TelegramNotifier.from_settings().notify(item.id, "failed", "failed: dropped.md")
    assert fake.sent == [{"chat_id": OWNER_CHAT, "text": "failed: dropped.md", "reply_to_message_id": None}]


def test_without_a_token_the_notification_goes_to_stdout(capsys, monkeypatch):
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    item = h.add_item("text", 1, text=NOTE)
    assert TelegramNotifier.from_settings().notify(item.id, "done", "done: a note") is True
    assert capsys.readouterr().out == "[kb] done: a note\n"
    assert TelegramNotifier.from_settings().notify(item.id, "done", "done: a note") is False
    assert capsys.readouterr().out == ""


def test_a_failed_send_is_not_recorded_and_names_no_token(fake):
    item = h.add_item("text", 2, text=NOTE)
    fake.send_errors = [(500, "Internal Server Error")]
    with pytest.raises(NotificationError) as error:
        TelegramNotifier.from_settings().notify(item.id, "done", "done: a note")
    assert "Internal Server Error" in str(error.value)
    assert TOKEN not in str(error.value) and "TEST-SECRET" not in str(error.value)
    assert fake.sent == []
    # Not recorded: the next try sends it.
    assert TelegramNotifier.from_settings().notify(item.id, "done", "done: a note") is True
    assert [m["text"] for m in fake.sent] == ["done: a note"]


def test_notification_texts_follow_the_specification():
    """Section 9.3 of the owner's specification: the state in its words, the
    title in quotes, the detail, the short id. kb's own lines come after."""
    assert notification_text("rejected", "Ads", score=20, reason="an advert", item_id="x1") == (
        'Skipped (low quality, score 20)\n"Ads"\nan advert\nSend /override x1 to ingest it anyway.')
    assert notification_text("done", "A", item_id="x2", commit="0123456789abcdef0123") == (
        'Ingested\n"A"\n+0 pages, 0 updates\nID: x2\nCommit: 0123456789ab')
    assert notification_text("done", "A", item_id="x2", created=["wiki/sources/a.md", "wiki/concepts/b.md"],
                             updated=["index.md"], summary="Two pages  about\nleases.", warnings=["w"]) == (
        'Ingested\n"A"\n+2 pages, 1 updates\nID: x2\n\u26a0 1 warning(s)\nTwo pages about leases.')
    # A partial change of the agent: committed, and told as a warning.
    assert notification_text("done", "A", item_id="x2", warnings=["partial: no entity pages", "w"]) == (
        'Ingested\n"A"\n+0 pages, 0 updates\nID: x2\n\u26a0 2 warning(s)\npartial: no entity pages')
    assert notification_text("failed", "A", item_id="x2", error="HTTP 404, the page does not exist") == (
        'Ingest failed\n"A"\nHTTP 404, the page does not exist\nID: x2')
    assert notification_text("waiting", "A", item_id="x2") == (
        'Waiting for the wiki agent\n"A"\nIt is approved and searchable now. The wiki agent has no endpoint '
        "(ANTHROPIC_BASE_URL), so the wiki ingest waits. Nothing is lost: it starts when you set one.\nID: x2")
    assert notification_text("duplicate", "B", duplicate_of="x0", item_id="x3") == (
        'Skipped (duplicate of item x0)\n"B"\nSend /override x3 to ingest it anyway.')
    with pytest.raises(ValueError, match="no notification for state 'parsed'"):
        notification_text("parsed", "C")


def test_outcomes_sensor_sends_rejected_duplicate_and_done_once_each(fake, monkeypatch):
    dagster = h.ephemeral_instance()
    gate = FakeOpenAIChat(chat('{"score": 15, "topics": [], "reason": "thin"}'),
                          chat('{"score": 90, "topics": [], "reason": "good"}'))
    with gate:
        monkeypatch.setenv("KB_GATE_BASE_URL", gate.base_url)
        monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-TEST-SECRET-GATE-KEY-0003")
        rejected = h.add_item("text", 10, text="Thin text that the gate will not like at all, sadly.")
        accepted = h.add_item("text", 11, text=NOTE)
        duplicate = h.add_item("text", 12, text=NOTE.upper())
        for item in (rejected, accepted, duplicate):
            h.run_item(dagster, item.id, raise_on_error=True)

    def tick(cursor=None):
        context = dg.build_sensor_context(cursor=cursor, instance=dagster, resources={"telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
        build_source_outcomes_sensor(get_settings())(context)
        return context.cursor

    cursor = tick()
    assert [(m["reply_to_message_id"], m["text"].splitlines()[0]) for m in fake.sent] == [
        (10, "Skipped (low quality, score 15)"), (12, f"Skipped (duplicate of item {accepted.id})"),
        (11, "Waiting for the wiki agent")]
    assert fake.sent[0]["text"].splitlines()[1:3] == ['"Thin text that the gate will not like at all, sadly."', "thin"]
    assert fake.sent[2]["text"] == notification_text("waiting", f"{NOTE[:79]}…", item_id=accepted.id)
    # The cursor lost (a restart with old state): the events are read again, nothing is sent again.
    tick(cursor=None)
    assert len(fake.sent) == 3

    @dg.asset(partitions_def=sources, name="wiki_pages")
    def wiki_pages():
        return dg.MaterializeResult(metadata={
            "commit_sha": "feedfacecafe0001", "pages_created": dg.MetadataValue.json(["wiki/sources/leases.md"]),
            "pages_updated": dg.MetadataValue.json(["index.md", "log.md"]), "summary": "One page on leases.",
            "warnings": dg.MetadataValue.json([])})

    dg.materialize([wiki_pages], partition_key=accepted.id, instance=dagster)
    tick(cursor=cursor)
    assert fake.sent[-1]["reply_to_message_id"] == 11
    assert fake.sent[-1]["text"] == (f'Ingested\n"{NOTE[:79]}…"\n+1 pages, 2 updates\nID: {accepted.id}\n'
                                     "One page on leases.\nCommit: feedfacecafe")
    assert len(fake.sent) == 4


def test_a_source_that_the_gate_let_in_by_default_is_marked_so_in_status_and_the_notice(fake, monkeypatch):
    """Every try of the gate failed: the source is in, with the default 65,
    and the owner reads that it has no score of the model."""
    from kb.telegram.item_states import ItemState
    from kb.telegram.inbox import Inbox
    from kb_assets.source_states import read_item_state
    from telegram_bridge.bot import status_detail
    from tests.fake_openai_chat import status

    dagster = h.ephemeral_instance()
    with FakeOpenAIChat(status(503, "overloaded")) as gate:
        monkeypatch.setenv("KB_GATE_BASE_URL", gate.base_url)
        monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-TEST-SECRET-GATE-KEY-0004")
        item = h.add_item("text", 13, text=NOTE)
        h.run_item(dagster, item.id, raise_on_error=True)
    assert len(gate.requests) == 4
    context = dg.build_sensor_context(instance=dagster, resources={
        "telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
    build_source_outcomes_sensor(get_settings())(context)
    [notice] = fake.sent
    assert notice["text"].startswith("Waiting for the wiki agent\n")
    assert notice["text"].endswith("The quality gate failed 4 tries, so kb accepted the source with the default "
                                   "score 65, without a score from the model.")
    state = read_item_state(dagster, item.id)
    detail = status_detail(Inbox(h.get_settings().inbox_dir).find(item.id), state)
    assert "score: 65 (a default, not a score of the model)" in detail
    assert "gate: The quality gate failed 4 tries" in detail
    # A scored source has no such line.
    scored = ItemState(item.id, "approved", score=80)
    assert "default" not in status_detail(Inbox(h.get_settings().inbox_dir).find(item.id), scored)


def test_outcomes_sensor_tries_a_failed_send_again_next_tick(fake, monkeypatch):
    dagster = h.ephemeral_instance()
    with FakeOpenAIChat(chat('{"score": 5, "topics": [], "reason": "spam"}')) as gate:
        monkeypatch.setenv("KB_GATE_BASE_URL", gate.base_url)
        monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-TEST-SECRET-GATE-KEY-0004")
        item = h.add_item("text", 20, text="Buy cheap watches now, best prices, click the link today!")
        h.run_item(dagster, item.id, raise_on_error=True)
    fake.send_errors = [(502, "Bad Gateway")]
    context = dg.build_sensor_context(instance=dagster, resources={"telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
    build_source_outcomes_sensor(get_settings())(context)
    assert fake.sent == []
    context = dg.build_sensor_context(cursor=context.cursor, instance=dagster, resources={"telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
    build_source_outcomes_sensor(get_settings())(context)
    assert [m["text"].splitlines()[0] for m in fake.sent] == ["Skipped (low quality, score 5)"]


def test_failures_sensor_sends_a_final_failure_once_and_tries_a_failed_send_again(fake):
    dagster = h.ephemeral_instance()

    def tick(cursor: str | None) -> str | None:
        context = dg.build_sensor_context(cursor=cursor, instance=dagster, resources={
            "telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
        build_run_endings_sensor(get_settings())(context)
        return context.cursor

    started = tick(None)  # the first tick: failures from now on count
    with LoopbackSite({}) as site:
        item = h.add_item("web", 30, url=site.url("/gone"))
        result = h.run_item(dagster, item.id)
    assert not result.success
    gone = site.url("/gone")
    text = f'Ingest failed\n"{gone}"\n{gone}: HTTP 404, the page does not exist\nID: {item.id}'

    # A run that Dagster will run again is not the end: no notification.
    dagster.add_run_tags(result.run_id, {"dagster/will_retry": "true"})
    assert tick(started) != started and fake.sent == []
    dagster.add_run_tags(result.run_id, {"dagster/will_retry": "false"})
    # The Bot API fails once: the cursor stays before the run, the next tick sends it.
    fake.send_errors = [(502, "Bad Gateway")]
    assert tick(started) == started and fake.sent == []
    after = tick(started)
    assert after != started
    [sent] = fake.sent
    assert sent["reply_to_message_id"] == 30 and sent["text"] == text
    tick(started)  # the same failure read again: not sent again
    assert tick(after) == after and len(fake.sent) == 1


def test_readiness_says_what_is_missing(monkeypatch):
    from kb.settings import get_settings
    from kb.telegram.bot_token import readiness

    assert readiness(get_settings()) == (False, f"no TELEGRAM_BOT_TOKEN: no bot; drop files in {get_settings().inbox_dir}")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    assert readiness(get_settings()) == (False, "ALLOWED_USER_IDS is empty: the bot answers nobody")
    monkeypatch.setenv("ALLOWED_USER_IDS", "111,222")
    ready, detail = readiness(get_settings())
    assert ready and "2 allowed users" in detail and TOKEN not in detail


def test_wiki_results_reach_the_owner_once_and_a_failed_send_is_tried_again(fake, monkeypatch):
    """The daily lint digest (a real wiki_lint run with no agent), a topic
    synthesis that /synthesize asked for, and a send that fails once. A run
    whose tag kb/requested_by names no allowed user (the UI can set any tag)
    sends its result to OWNER_CHAT_ID, not to that chat."""
    from kb_assets.keys import REQUESTED_BY_TAG
    from kb_assets.wiki.wiki_pages import wiki_lint
    from kb_resources.services import WikiAgentResource
    from kb_resources.stores import WikiResource
    from sensors.wiki_results import build_wiki_results_sensor

    dagster = h.ephemeral_instance()
    dg.materialize([wiki_lint], partition_key="2026-11-30", instance=dagster,
                   resources={"wiki": WikiResource.from_settings(), "wiki_agent": WikiAgentResource.from_settings(), "telegram": TelegramNotifierResource.from_settings()})

    @dg.asset(partitions_def=dg.DynamicPartitionsDefinition(name="wiki_topics"), name="wiki_topic_synthesis")
    def topic():
        return dg.MaterializeResult(metadata={"topic": "raft", "summary": "Raft elects one leader per term.",
                                              "warnings": dg.MetadataValue.json(["contradiction: x"])})

    monkeypatch.setenv("ALLOWED_USER_IDS", f"{h.OWNER_ID},777")
    dagster.add_dynamic_partitions("wiki_topics", ["raft", "paxos"])
    dg.materialize([topic], partition_key="raft", instance=dagster, tags={REQUESTED_BY_TAG: "777"})
    dg.materialize([topic], partition_key="paxos", instance=dagster, tags={REQUESTED_BY_TAG: "666"})

    def tick(cursor):
        context = dg.build_sensor_context(cursor=cursor, instance=dagster,
                                          resources={"telegram": TelegramNotifierResource.from_settings()})
        build_wiki_results_sensor(get_settings())(context)
        return context.cursor

    fake.send_errors = [(502, "Bad Gateway")]
    cursor = tick(None)
    assert fake.sent == []
    cursor = tick(cursor)
    assert [(m["chat_id"], m["text"]) for m in fake.sent] == [
        (OWNER_CHAT, "lint 2026-11-30: 0 findings (none); 0 fixed, 0 left. Report: wiki/syntheses/lint/2026-11-30.md."),
        (777, "topic synthesis raft: Raft elects one leader per term. Page: wiki/syntheses/topics/raft.md. Warnings: 1."),
        # The fake asset names the topic raft in both runs.
        (OWNER_CHAT, "topic synthesis raft: Raft elects one leader per term. Page: wiki/syntheses/topics/raft.md. "
                     "Warnings: 1."),
    ]
    tick(None)  # a lost cursor sends nothing twice
    assert len(fake.sent) == 3


def test_a_missing_gate_key_is_told_once_and_status_says_not_scored(fake):
    """No DEEPSEEK_API_KEY: every source goes in unscored. The owner hears
    it one time (not once per source), and /status says "not scored"."""
    from kb.telegram.inbox import Inbox
    from kb_assets.source_states import read_item_state
    from telegram_bridge.bot import status_detail, status_line

    dagster = h.ephemeral_instance()
    first = h.add_item("text", 40, text=NOTE)
    second = h.add_item("text", 41, text="Raft elects a leader with randomized timeouts, then it replicates a log.")
    for item in (first, second):
        h.run_item(dagster, item.id, raise_on_error=True)

    def tick(cursor=None):
        context = dg.build_sensor_context(cursor=cursor, instance=dagster, resources={
            "telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
        build_source_outcomes_sensor(get_settings())(context)
        return context.cursor

    tick(tick())
    tick()  # a restart with the cursor lost: still one notice
    told = [m for m in fake.sent if m["text"].startswith("No quality gate key")]
    assert len(told) == 1 and told[0]["chat_id"] == first.chat_id  # the chat of the item that showed it
    assert "DEEPSEEK_API_KEY is not set" in told[0]["text"] and '"not scored"' in told[0]["text"]
    inbox = Inbox(h.get_settings().inbox_dir)
    state = read_item_state(dagster, first.id)
    assert "score: not scored (no DEEPSEEK_API_KEY)" in status_detail(inbox.find(first.id), state)
    assert status_line(inbox.find(first.id), state).endswith("  not scored")
