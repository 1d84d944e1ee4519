"""The bot against a loopback server that speaks the Bot API: real aiogram
long polling, real downloads, real inbox files, and item state from a real
Dagster instance."""

import asyncio
import contextlib
import json
import socket

import pytest

from kb.settings import get_settings
from kb.telegram import replies
from kb.apps.bot_runner import dagster_reader, main
from kb.telegram.inbox import Inbox, telegram_item_id
from tests import fake_telegram as tg
from tests import source_helpers as h
from tests.fake_telegram import FakeTelegram, converse
from tests.loopback_site import LoopbackSite

# The loopback sites stand in for the web: let the fetch guard reach them.
pytestmark = pytest.mark.usefixtures("loopback_fetches")

TOKEN = "123456:TEST-SECRET-TOKEN"
OWNER, STRANGER = h.OWNER_ID, 999
LONG_TEXT = "Idea: keep a log of every schema change, with the reason, so that a rebuild can replay it."


@pytest.fixture
def fake(monkeypatch):
    server = FakeTelegram(TOKEN).start()
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("ALLOWED_USER_IDS", f"{OWNER}, 222")
    monkeypatch.setenv("TELEGRAM_API_BASE", server.base_url)
    yield server
    server.stop()




def msg(fake: FakeTelegram, message_id: int, user: int = OWNER, **fields) -> dict:
    return tg.message_update(fake.next_update_id(), message_id, user, **fields)


def assert_no_token(fake, caplog, capsys, home):
    captured = capsys.readouterr()
    texts = [m["text"] for m in fake.sent] + [caplog.text, captured.out, captured.err]
    texts += [p.read_text(errors="replace") for p in home.rglob("*") if p.is_file() and p.suffix == ".json"]
    secret = TOKEN.split(":")[1]
    assert not [t for t in texts if secret in t]


def test_every_kind_of_update(fake, caplog, capsys, kb_home):
    caplog.set_level("DEBUG")
    voice = b"RIFF fake voice bytes " * 50
    pdf = b"%PDF-1.7 fake pdf bytes " * 40
    markdown = b"# Notes\n\nSome notes in Markdown, long enough to keep as a source."
    fake.add_file("v1", "voice/file_1.oga", voice)
    fake.add_file("d1", "documents/file_2.pdf", pdf)
    fake.add_file("d2", "documents/file_3.md", markdown)
    fake.add_file("d3", "documents/file_4.markdown", markdown)
    fake.add_file("bad", "documents/file_5.pdf", b"x", get_file_error=(400, "Bad Request: file is temporarily unavailable"))
    fake.add_file("lost", "documents/file_6.pdf", b"x" * 100, download_status=404)
    fake.add_file("stranger-doc", "documents/file_7.pdf", pdf)
    twenty_five_mb = 25 * 1024 * 1024
    text_link = "Look at this article when you have time"
    same_url_twice = "See https://example.org/a and again https://example.org/a"
    duplicate_message = msg(fake, 10, **tg.text_fields("Read this: https://example.com/post?id=1."))

    converse(
        fake,
        msg(fake, 1, **tg.voice_fields("v1", len(voice))),
        msg(fake, 2, **tg.document_fields("d1", "paper.pdf", "application/pdf", len(pdf))),
        msg(fake, 3, **tg.document_fields("d2", "notes.md", "text/markdown", len(markdown))),
        msg(fake, 4, **tg.document_fields("d3", "more notes.markdown", "application/octet-stream", len(markdown))),
        msg(fake, 5, **tg.document_fields("dx", "report.docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document", 5000)),
        msg(fake, 6, **tg.photo_fields("p1")),
        msg(fake, 7, **tg.sticker_fields("s1")),
        msg(fake, 8, **tg.video_fields("vid1")),
        msg(fake, 9, **tg.text_fields(LONG_TEXT)),
        duplicate_message,
        msg(fake, 11, **tg.text_fields("Two links: https://a.example/one, https://b.example/two")),
        msg(fake, 12, **tg.text_fields(text_link, [tg.text_link_entity(text_link, "this article", "https://blog.example/post")])),
        msg(fake, 13, **tg.text_fields("hi there")),
        msg(fake, 14, user=STRANGER, **tg.text_fields("https://evil.example/x please add")),
        msg(fake, 15, user=STRANGER, **tg.document_fields("stranger-doc", "s.pdf", "application/pdf", len(pdf))),
        {**duplicate_message, "update_id": fake.next_update_id()},
        msg(fake, 17, **tg.document_fields("huge", "huge.pdf", "application/pdf", twenty_five_mb)),
        msg(fake, 18, **tg.text_fields("https://youtu.be/dQw4w9WgXcQ")),
        msg(fake, 19, **tg.document_fields("bad", "bad.pdf", "application/pdf", 1)),
        msg(fake, 20, **tg.document_fields("lost", "lost.pdf", "application/pdf", 100)),
        msg(fake, 21, **tg.text_fields(same_url_twice, [tg.text_link_entity(same_url_twice, "again", "https://example.org/a")])),
        msg(fake, 22, **tg.text_fields("/start", [{"type": "bot_command", "offset": 0, "length": 6}])),
    )

    def item_id(message_id):
        return telegram_item_id(OWNER, message_id)

    queued = {n: [replies.queued(item_id(n))] for n in (1, 2, 3, 4, 9, 12, 18, 21)}
    for n, expected in queued.items():
        assert fake.replies_to(n) == expected, n
    assert fake.replies_to(5)[0].startswith("Unsupported message type (report.docx). I accept: PDF, MD")
    assert fake.replies_to(6)[0].startswith("Unsupported message type (photo).")
    assert fake.replies_to(7)[0].startswith("Unsupported message type (sticker).")
    assert fake.replies_to(8)[0].startswith("Unsupported message type (video).")
    assert fake.replies_to(10) == [replies.queued(item_id(10)), replies.already_queued(item_id(10))]
    assert fake.replies_to(11) == ["Send one link per message please. This message has 2."]
    assert fake.replies_to(13) == ["Text is too short (min 50 chars): it has 8. Send more, or a link."]
    assert fake.replies_to(14) == [] and fake.replies_to(15) == []
    assert fake.replies_to(17) == ["Could not download attachment: the file is 25.0 MB; the limit is 20 MB"]
    assert fake.replies_to(19) == ["Could not download attachment: Bad Request: file is temporarily unavailable"]
    assert fake.replies_to(20) == ["Could not download attachment: the file server answered HTTP 404 Not Found"]
    assert "Allowlist: on. You (user 111) are one of 2 allowed users." in fake.replies_to(22)[0]
    # Every reply is threaded to its message, in the sender's chat.
    assert all(m["reply_to_message_id"] and m["chat_id"] == OWNER for m in fake.sent)

    inbox = Inbox(get_settings().inbox_dir)
    items = {item.message_id: item for item in (inbox.read(inbox.items_dir / n) for n in inbox.manifest_names_after(None))}
    assert sorted(items) == [1, 2, 3, 4, 9, 10, 12, 18, 21]
    assert {n: items[n].type for n in items} == {1: "voice", 2: "pdf", 3: "md", 4: "md", 9: "text", 10: "web",
                                                 12: "web", 18: "youtube", 21: "web"}
    assert items[10].url == "https://example.com/post?id=1"  # the full stop is not part of it
    assert items[12].url == "https://blog.example/post"
    assert items[21].url == "https://example.org/a"
    assert items[9].text == LONG_TEXT
    assert (items[9].chat_id, items[9].user_id, items[9].origin) == (OWNER, OWNER, "telegram")
    assert inbox.attachment_path(items[1]).read_bytes() == voice
    assert inbox.attachment_path(items[2]).read_bytes() == pdf
    assert inbox.attachment_path(items[4]).name == "more notes.markdown"
    # Nothing of the refused, failed or strangers' messages is on disk.
    files = sorted(p.parent.name for p in (inbox.root / "files").rglob("*") if p.is_file())
    assert files == sorted(item_id(n) for n in (1, 2, 3, 4))
    assert not list(inbox.root.rglob("*.part"))
    requested = [params["file_id"] for method, params in fake.calls if method == "getfile"]
    assert sorted(requested) == ["bad", "d1", "d2", "d3", "lost", "v1"]  # not "huge", not the stranger's
    assert fake.unauthorized == 0
    assert_no_token(fake, caplog, capsys, kb_home)


@pytest.mark.slow
def test_commands_read_state_from_dagster_and_write_requests(fake, caplog, capsys, kb_home):
    caplog.set_level("DEBUG")
    with LoopbackSite({}) as site:
        missing = site.url("/missing-page")
        commands_session(fake, missing)
    assert_no_token(fake, caplog, capsys, kb_home)


def commands_session(fake, missing):
    converse(fake,
             msg(fake, 1, **tg.command_fields("/status")),
             msg(fake, 2, user=STRANGER, **tg.command_fields("/help")),
             msg(fake, 3, **tg.text_fields(LONG_TEXT)),
             msg(fake, 4, **tg.text_fields(missing)),
             msg(fake, 5, **tg.text_fields(LONG_TEXT + " ")),
             msg(fake, 6, **tg.text_fields(LONG_TEXT + " (not run yet)")))
    assert fake.replies_to(1) == ["you have no items yet. Send a link, a file, a voice note or a text."]
    assert fake.replies_to(2) == []
    accepted, failed, duplicate, waiting = (telegram_item_id(OWNER, n) for n in (3, 4, 5, 6))

    # The inbox sensor and the job, as the daemon would run them.
    dagster = h.instance()
    h.run_item(dagster, accepted, raise_on_error=True)
    h.run_item(dagster, failed)
    h.run_item(dagster, duplicate, raise_on_error=True)
    dagster.dispose()

    converse(fake,
             msg(fake, 20, **tg.command_fields("/status")),
             msg(fake, 21, **tg.command_fields(f"/status {failed}")),
             msg(fake, 22, **tg.command_fields("/status 0000000000")),
             msg(fake, 23, **tg.command_fields(f"/override {accepted}")),
             msg(fake, 24, **tg.command_fields(f"/override {duplicate}")),
             msg(fake, 25, **tg.command_fields("/lint")),
             msg(fake, 26, **tg.command_fields("/synthesize raft consensus")),
             msg(fake, 27, **tg.command_fields("/frobnicate")),
             msg(fake, 29, **tg.command_fields("/synthesize ???")),
             msg(fake, 28, user=STRANGER, **tg.command_fields(f"/override {duplicate}")))

    [status] = fake.replies_to(20)
    lines = status.splitlines()
    assert lines[0] == "id  type  state  age"
    # Newest first, with the state that Dagster holds.
    assert [line.split()[:3] for line in lines[1:]] == [
        [waiting, "text", "received"], [duplicate, "text", "duplicate"],
        [failed, "web", "failed"], [accepted, "text", "waiting"]]
    [detail] = fake.replies_to(21)
    assert detail.startswith(f"item {failed}: web, failed\nsource: {missing}\n")
    assert detail.endswith(f"error: {missing}: HTTP 404, the page does not exist")
    assert fake.replies_to(22) == ["no item 0000000000 of yours. Send /status for your last items."]
    assert fake.replies_to(23) == [f"item {accepted} is waiting; /override works on rejected or duplicate items."]
    assert fake.replies_to(24) == [f"override queued for item {duplicate}: it is ingested whatever the gate says."]
    assert fake.replies_to(25) == ["lint requested: the wiki lint starts within a minute."]
    assert fake.replies_to(26) == ["synthesis requested: a synthesis of 'raft consensus' starts within a minute."]
    assert fake.replies_to(27) == ["unknown command /frobnicate. Send /help for the list."]
    assert fake.replies_to(28) == []
    assert fake.replies_to(29) == ["the topic '???' has no Latin letters or digits. Example: /synthesize raft consensus"]

    inbox = Inbox(get_settings().inbox_dir)
    requests = [inbox.read_request(name) for name in inbox.request_names_after(None)]
    assert [(r["kind"], r.get("item_id"), r.get("topic")) for r in requests] == [
        ("override", duplicate, None), ("lint", None, None), ("synthesize", None, "raft consensus")]


def test_a_wrong_token_gets_no_updates_and_leaks_nothing(fake, monkeypatch, caplog, capsys, kb_home):
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:TEST-SECRET-OTHER")
    fake.push(msg(fake, 1, **tg.text_fields(LONG_TEXT)))

    from telegram_bridge.bot import build  # aiogram: imported only where a test needs it (7 s of CPU)

    async def session():
        settings = get_settings()
        bot, dispatcher = build(settings, dagster_reader(settings))
        with pytest.raises(Exception) as error:
            await dispatcher.start_polling(bot, polling_timeout=1, handle_signals=False)
        return error.value

    error = asyncio.run(session())
    assert fake.unauthorized >= 1 and fake.sent == []
    assert "TEST-SECRET-OTHER" not in str(error) and "TEST-SECRET-OTHER" not in caplog.text
    assert not Inbox(get_settings().inbox_dir).manifest_names_after(None)


def test_main_without_a_token_says_what_to_do(capsys, monkeypatch):
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    assert main() == 2
    assert "TELEGRAM_BOT_TOKEN is not set: there is no bot. Drop files in" in capsys.readouterr().err


def test_run_sets_the_command_menu_and_writes_the_manifest_with_the_telegram_ids(fake, kb_home):
    from telegram_bridge.bot import run

    async def session():
        fake.push(msg(fake, 7, **tg.text_fields(LONG_TEXT)))
        settings = get_settings()
        task = asyncio.create_task(run(settings, dagster_reader(settings), polling_timeout=1, handle_signals=False))
        try:
            await fake.wait_until(lambda: fake.replies_to(7))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    asyncio.run(session())
    [commands] = [json.loads(params["commands"]) for method, params in fake.calls if method == "setmycommands"]
    assert [c["command"] for c in commands] == ["help", "status", "override", "lint", "synthesize"]
    inbox = Inbox(get_settings().inbox_dir)
    [name] = inbox.manifest_names_after(None)
    data = json.loads((inbox.items_dir / name).read_text())
    assert {k: data[k] for k in ("id", "type", "origin", "chat_id", "message_id", "user_id")} == {
        "id": telegram_item_id(OWNER, 7), "type": "text", "origin": "telegram",
        "chat_id": OWNER, "message_id": 7, "user_id": OWNER}
    assert name.endswith(f"-{data['id']}.json")


def test_the_bot_waits_for_a_bot_api_that_is_not_there_yet(monkeypatch, caplog, kb_home):
    """A bot that starts before its network waits for the Bot API and then
    serves: it does not stop (a container that restarts it is not running
    part of the time)."""
    from telegram_bridge.bot import run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("ALLOWED_USER_IDS", str(OWNER))
    monkeypatch.setenv("TELEGRAM_API_BASE", f"http://127.0.0.1:{port}")
    server = FakeTelegram(TOKEN)

    async def session():
        settings = get_settings()
        task = asyncio.create_task(run(settings, dagster_reader(settings), polling_timeout=1, handle_signals=False,
                                       first_wait_s=0.1))
        try:
            await asyncio.sleep(1.5)  # the Bot API refuses each connection meanwhile
            assert not task.done(), task.exception() if task.done() else None
            await asyncio.to_thread(server.start, port)
            server.push(tg.message_update(server.next_update_id(), 5, OWNER, **tg.text_fields(LONG_TEXT)))
            await server.wait_until(lambda: server.replies_to(5))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        asyncio.run(session())
    finally:
        server.stop()
    waits = [r.getMessage() for r in caplog.records if "the Bot API does not answer" in r.getMessage()]
    assert len(waits) >= 2 and all("TelegramNetworkError" in w for w in waits), waits
    assert TOKEN.split(":")[1] not in caplog.text


def test_a_refused_token_stops_the_bot_with_a_clear_error(fake, monkeypatch, capsys, caplog, kb_home):
    from telegram_bridge.bot import serve

    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:TEST-SECRET-OTHER")
    settings = get_settings()
    assert serve(settings, dagster_reader(settings)) == 2
    err = capsys.readouterr().err
    assert "refuses TELEGRAM_BOT_TOKEN (Unauthorized)" in err and fake.base_url in err
    assert fake.unauthorized == 1
    assert "TEST-SECRET-OTHER" not in err + caplog.text


def test_redaction_removes_the_token_from_text_and_log_records():
    import logging

    from kb.telegram.bot_token import RedactingFilter, redact

    assert redact(f"GET http://h/file/bot{TOKEN}/x.pdf failed", TOKEN) == "GET http://h/file/bot<redacted>/x.pdf failed"
    assert redact("secret half TEST-SECRET-TOKEN", TOKEN) == "secret half <redacted>"
    record = logging.LogRecord("kb", logging.ERROR, __file__, 1, "url %s", (f"/bot{TOKEN}/getMe",), None)
    assert RedactingFilter(TOKEN).filter(record) and record.getMessage() == "url /bot<redacted>/getMe"
    try:
        raise RuntimeError(f"connect to /bot{TOKEN}/getUpdates failed")
    except RuntimeError:
        import sys
        record = logging.LogRecord("kb", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    RedactingFilter(TOKEN).filter(record)
    assert "TEST-SECRET" not in logging.Formatter().format(record)


def test_text_of_control_characters_only_is_too_short():
    """A text of NUL or zero-width characters holds no words: it is refused,
    and a real text keeps its words without them."""
    from types import SimpleNamespace

    from kb.telegram.intake import Accepted, Refused, classify

    empty = classify(SimpleNamespace(text="\x00" * 60 + "\u200b" * 10, entities=None))
    assert isinstance(empty, Refused) and "too short" in empty.reply
    words = "A note with real words in it, long enough to keep as a source.\x00"
    kept = classify(SimpleNamespace(text=words, entities=None))
    assert isinstance(kept, Accepted) and kept.type == "text" and "\x00" not in kept.text


@pytest.mark.slow
def test_a_link_sent_to_the_bot_is_searchable_and_the_owner_hears_that_it_waits(fake, monkeypatch):
    """Issue 16 through the real bot: the URL leaves the sentence's ")", the
    intake run indexes the page before any wiki agent, and the outcomes
    sensor sends one "waiting" notice as a reply to the message."""
    import dagster as dg

    from kb.telegram.notifier import notification_text
    from kb_resources.services import TelegramNotifierResource
    from kb_resources.stores import InboxResource
    from mcp_server import server
    from sensors.source_outcomes import build_source_outcomes_sensor
    from tests.loopback_site import article_html, page
    from tests.test_parsers import PARAGRAPHS

    with LoopbackSite({"/wal": page(article_html("Write-ahead logging", PARAGRAPHS))}) as site:
        converse(fake, msg(fake, 40, **tg.text_fields(f"A good one ({site.url('/wal')}).")))
        item_id = telegram_item_id(OWNER, 40)
        assert Inbox(get_settings().inbox_dir).get(item_id).url == site.url("/wal")
        dagster = h.instance()
        h.run_item(dagster, item_id, raise_on_error=True)

    hits = server.search_bookmarks("database replays the log after a crash", limit=3)["hits"]
    assert [(x["tweet_id"], x["best_source"], x["url"]) for x in hits] == [
        (f"telegram:{item_id}", "telegram", site.url("/wal"))]
    for _ in range(2):  # a second tick (or a restart) sends nothing again
        context = dg.build_sensor_context(instance=dagster, resources={
            "telegram": TelegramNotifierResource.from_settings(), "inbox": InboxResource.from_settings()})
        build_source_outcomes_sensor(get_settings())(context)
    dagster.dispose()
    assert fake.replies_to(40)[-1:] == [notification_text("waiting", "Write-ahead logging", item_id=item_id)]
    assert len([t for t in fake.replies_to(40) if t.startswith("Waiting for the wiki agent")]) == 1


def test_a_voice_note_reply_says_when_only_english_works_and_how_to_fix_it(fake):
    """After faster-whisper `small` did not load, the bot's reply to a voice
    note says so at once, not only when a note in another language fails."""
    from kb.enrich import voice_model

    voice = b"RIFF fake voice bytes " * 50
    fake.add_file("v1", "voice/file_1.oga", voice)
    fake.add_file("v2", "voice/file_2.oga", voice)
    converse(fake, msg(fake, 1, **tg.voice_fields("v1", len(voice))),
             msg(fake, 2, **tg.text_fields(LONG_TEXT)))
    assert fake.replies_to(1) == [replies.queued(telegram_item_id(OWNER, 1))]  # small loads: no warning

    voice_model.record_fallback("small", "LocalEntryNotFoundError: Got: ConnectError: no route to huggingface.co")
    converse(fake, msg(fake, 3, **tg.voice_fields("v2", len(voice))), msg(fake, 4, **tg.text_fields(LONG_TEXT + "!")))
    [reply] = fake.replies_to(3)
    assert reply == (f"{replies.queued(telegram_item_id(OWNER, 3))}\nOnly English voice notes work now: the "
                     "faster-whisper model small did not load (LocalEntryNotFoundError: Got: ConnectError: no route "
                     f"to huggingface.co), so the English-only tiny.en stands in. {voice_model.FIX}")
    assert fake.replies_to(4) == [replies.queued(telegram_item_id(OWNER, 4))]  # a text note: no warning
    voice_model.clear_fallback()
    assert "Only English voice notes work now" not in voice_model.readiness()[1]


def test_an_item_that_cannot_be_saved_gets_the_system_error_reply(fake, kb_home):
    """The specification (11.2): when the item cannot be saved, the reply is
    "system error, try again", and nothing is queued."""
    from kb.settings import get_settings

    items = get_settings().inbox_dir / "items"
    items.parent.mkdir(parents=True, exist_ok=True)
    items.write_text("a file where the inbox's folder of manifests goes")  # the manifest cannot be written
    converse(fake, msg(fake, 1, **tg.text_fields(LONG_TEXT)))
    [reply] = fake.replies_to(1)
    assert reply == replies.not_saved("FileExistsError")
    assert reply.startswith("system error, try again")
    assert items.read_text().startswith("a file where")
