"""`kb-bot`: the Telegram bot. Intake only: Dagster does the work.

Long polling through aiogram 3 at TELEGRAM_API_BASE. For each message from
a user on ALLOWED_USER_IDS:
1. The item id comes from the chat and message ids: the same message twice
   gives one item.
2. Type detection (kb/telegram/intake.py) accepts or refuses it.
3. An attachment (up to telegram_max_file_mb) is downloaded into the inbox.
4. The manifest is written atomically; the reply says `queued for processing`.

A user not on the allowlist gets no reply, and nothing is written.
Commands read item state through the `read_states` callable they are given
and write requests that the request sensors turn into runs. The bot never
imports Dagster or the graph: `kb-bot` (kb/apps/bot_runner.py) passes in a
reader of the Dagster instance. The bot never opens DuckDB.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import sys
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
from aiogram import BaseMiddleware, Bot, Dispatcher, F, Router
from aiogram.exceptions import TelegramAPIError
from aiogram.filters import Command, CommandObject
from aiogram.types import BotCommand, Message

from kb.settings import Settings
from kb.enrich.voice_model import english_only_reason
from kb.telegram import replies
from kb.telegram.inbox import Inbox, InboxError, InboxItem, telegram_item_id, utc_now_iso
from kb.telegram.intake import Accepted, Attachment, Refused, classify
from kb.telegram.item_states import ItemState, State, StateReader
from kb.telegram.api import build_bot
from kb.telegram.bot_token import bot_token, install_redaction, redact

log = logging.getLogger("kb.bot")

STATUS_LIMIT = 10
MAX_REPLY_CHARS = 3500  # Telegram's limit is 4096; keep room for the rest of the reply
# A reply quotes at most this much of what the user typed. Telegram refuses a
# message of more than 4096 characters, so a reply that quoted a long /status
# argument in full was never sent (found by tests/test_bad_input.py).
MAX_ECHO_CHARS = 60
MAX_TOPIC_CHARS = 200  # a topic is a few words; a longer one is a pasted text
DOWNLOAD_TIMEOUT_S = 120
OVERRIDABLE = (State.REJECTED, State.DUPLICATE)
TOPIC_WORD = re.compile(r"[A-Za-z0-9]")

COMMANDS = [
    BotCommand(command="help", description="what I accept, and the commands"),
    BotCommand(command="status", description="your last 10 items, or /status <id>"),
    BotCommand(command="override", description="/override <id>: ingest a rejected or duplicate item"),
    BotCommand(command="lint", description="check the wiki now"),
    BotCommand(command="synthesize", description="/synthesize <topic>: write a synthesis now"),
]


class DownloadFailed(Exception):
    """The attachment could not be downloaded. The message has no token."""


class AllowlistMiddleware(BaseMiddleware):
    """Drops every message from a user who is not on the allowlist, before
    any handler runs: no reply, no file, no log of the message text."""

    def __init__(self, allowed: set[int]):
        self.allowed = allowed

    async def __call__(self, handler, event: Message, data: dict):
        user = event.from_user
        if user is None or user.id not in self.allowed:
            log.info("ignored a message from user %s: not on the allowlist", user.id if user else "unknown")
            return None
        return await handler(event, data)


def echo(text: str) -> str:
    """What the user typed, short enough to quote in a reply."""
    return text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 1] + "…"


def age(iso_time: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    try:
        seconds = max(0, int((now - datetime.fromisoformat(iso_time)).total_seconds()))
    except ValueError:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def status_line(item: InboxItem, state: ItemState) -> str:
    unscored = "  not scored" if state.gate == "skipped-no-key" else ""
    return f"{item.id}  {item.type}  {state.state}  {age(item.received_at)}{unscored}"


def status_detail(item: InboxItem, state: ItemState) -> str:
    lines = [f"item {item.id}: {item.type}, {state.state}"]
    title = state.title or item.url or item.file_name
    if title:
        lines.append(f"source: {title}")
    lines.append(f"received: {age(item.received_at)} ago")
    if state.score_text:
        lines.append(f"score: {state.score_text}")
    if state.gate_note:
        lines.append(f"gate: {state.gate_note}")
    if state.duplicate_of:
        lines.append(f"duplicate of: {state.duplicate_of}")
    if state.error:
        lines.append(f"error: {state.error}")
    if state.commit:
        lines.append(f"commit: {state.commit}")
    return "\n".join(lines)[:MAX_REPLY_CHARS]


class BotApp:
    """The handlers, with the settings, the inbox and the state reader they share."""

    def __init__(self, settings: Settings, read_states: StateReader):
        self.settings = settings
        # Blocking (it reads the Dagster instance): call it in a thread.
        self.read_states = read_states
        self.inbox = Inbox(settings.inbox_dir)
        self.token = bot_token(settings)
        self.allowed = settings.allowed_users()
        self.max_file_bytes = settings.telegram_max_file_mb * 1024 * 1024

    def own_item(self, message: Message, item_id: str) -> InboxItem | None:
        item = self.inbox.find(item_id.strip())
        return item if item is not None and item.user_id == message.from_user.id else None

    # --- commands ---------------------------------------------------------------------
    async def on_help(self, message: Message) -> None:
        await message.reply(replies.help_text(message.from_user.id, len(self.allowed)))

    async def on_status(self, message: Message, command: CommandObject) -> None:
        wanted = (command.args or "").strip()
        if wanted:
            item = self.own_item(message, wanted)
            if item is None:
                await message.reply(f"no item {echo(wanted)} of yours. Send /status for your last items.")
                return
            states = await asyncio.to_thread(self.read_states, [item.id])
            await message.reply(status_detail(item, states[item.id]))
            return
        items = self.inbox.items_of_user(message.from_user.id, STATUS_LIMIT)
        if not items:
            await message.reply("you have no items yet. Send a link, a file, a voice note or a text.")
            return
        states = await asyncio.to_thread(self.read_states, [item.id for item in items])
        lines = [status_line(item, states[item.id]) for item in items]
        await message.reply("id  type  state  age\n" + "\n".join(lines))

    async def on_override(self, message: Message, command: CommandObject) -> None:
        wanted = (command.args or "").strip()
        if not wanted:
            await message.reply("usage: /override <id>")
            return
        item = self.own_item(message, wanted)
        if item is None:
            await message.reply(f"no item {echo(wanted)} of yours. Send /status for your last items.")
            return
        state = (await asyncio.to_thread(self.read_states, [item.id]))[item.id]
        if state.state not in OVERRIDABLE:
            await message.reply(f"item {item.id} is {state.state}; /override works on rejected or duplicate items.")
            return
        self.inbox.add_request("override", item_id=item.id, user_id=message.from_user.id)
        await message.reply(f"override queued for item {item.id}: it is ingested whatever the gate says.")

    async def on_lint(self, message: Message) -> None:
        self.inbox.add_request("lint", user_id=message.from_user.id)
        await message.reply("lint requested: the wiki lint starts within a minute.")

    async def on_synthesize(self, message: Message, command: CommandObject) -> None:
        topic = (command.args or "").strip()
        if len(topic) > MAX_TOPIC_CHARS:
            await message.reply(f"the topic is too long: {len(topic)} characters; the limit is {MAX_TOPIC_CHARS}.")
            return
        if topic and not TOPIC_WORD.search(topic):
            # The wiki names a topic page by its Latin letters and digits (kb.wiki.prompts.topic_key).
            await message.reply(f"the topic {echo(topic)!r} has no Latin letters or digits. Example: /synthesize raft consensus")
            return
        self.inbox.add_request("synthesize", topic=topic, user_id=message.from_user.id)
        what = f"a synthesis of {topic!r}" if topic else "the weekly synthesis"
        await message.reply(f"synthesis requested: {what} starts within a minute.")

    async def on_unknown_command(self, message: Message) -> None:
        command = message.text.split()[0].lstrip("/").split("@")[0]
        await message.reply(replies.unknown_command(echo(command)))

    # --- sources ----------------------------------------------------------------------
    async def on_source(self, message: Message, bot: Bot) -> None:
        item_id = telegram_item_id(message.chat.id, message.message_id)
        if self.inbox.find(item_id) is not None:
            await message.reply(replies.already_queued(item_id))
            return
        intake = classify(message, max_file_bytes=self.max_file_bytes)
        if isinstance(intake, Refused):
            await message.reply(intake.reply)
            return
        file_rel = None
        if intake.attachment is not None:
            try:
                file_rel = await self.download(bot, item_id, intake.attachment)
            except DownloadFailed as exc:
                await message.reply(replies.download_failed(str(exc)))
                return
        item = self.new_item(item_id, intake, message, file_rel)
        try:
            item, created = self.inbox.add(item)
        except (OSError, InboxError) as exc:
            log.error("item %s: cannot write the inbox manifest: %s", item_id, exc)
            await message.reply(replies.not_saved(type(exc).__name__))
            return
        reply = replies.queued(item.id) if created else replies.already_queued(item.id)
        if created and intake.type == "voice":
            # The owner must know before the note fails: only English works now, and the fix.
            warning = english_only_reason(self.settings)
            reply = f"{reply}\n{warning}" if warning else reply
        await message.reply(reply[:MAX_REPLY_CHARS])

    def new_item(self, item_id: str, intake: Accepted, message: Message, file_rel: str | None) -> InboxItem:
        attachment = intake.attachment
        return InboxItem(
            id=item_id, type=intake.type, received_at=utc_now_iso(), origin="telegram",
            url=intake.url, text=intake.text, file=file_rel,
            file_name=attachment.file_name if attachment else None,
            mime_type=attachment.mime_type if attachment else None,
            file_size=attachment.file_size if attachment else None,
            chat_id=message.chat.id, message_id=message.message_id, user_id=message.from_user.id,
        )

    async def download(self, bot: Bot, item_id: str, attachment: Attachment) -> str:
        """Download into inbox/files/<id>/<name>; returns the path relative to
        the inbox. A partial file never stays: it is written under a temp
        name and renamed when complete."""
        folder = self.inbox.files_dir(item_id)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / attachment.file_name
        # A unique temp name: two copies of one update may download at once.
        partial = folder / f".{attachment.file_name}.{secrets.token_hex(4)}.part"
        limit = self.max_file_bytes
        try:
            file = await bot.get_file(attachment.file_id)
            if file.file_size is not None and file.file_size > limit:
                raise DownloadFailed(replies.too_large(file.file_size, limit))
            if not file.file_path:
                raise DownloadFailed("the Bot API gave no file path")
            await bot.download_file(file.file_path, destination=partial, timeout=DOWNLOAD_TIMEOUT_S)
            size = partial.stat().st_size
            if size > limit:
                raise DownloadFailed(replies.too_large(size, limit))
            os.replace(partial, target)
        except TelegramAPIError as exc:
            raise DownloadFailed(redact(exc.message, self.token)) from None
        except aiohttp.ClientResponseError as exc:
            # Its text holds the file URL, and the URL holds the token: use the status only.
            raise DownloadFailed(f"the file server answered HTTP {exc.status} {exc.message}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise DownloadFailed(redact(f"{type(exc).__name__}: {exc}", self.token) or type(exc).__name__) from None
        except OSError as exc:
            raise DownloadFailed(f"cannot write the file ({type(exc).__name__})") from None
        finally:
            partial.unlink(missing_ok=True)
        return str(target.relative_to(self.inbox.root))


def build_dispatcher(app: BotApp) -> Dispatcher:
    router = Router(name="kb")
    router.message.outer_middleware(AllowlistMiddleware(app.allowed))
    router.message.register(app.on_help, Command("start", "help"))
    router.message.register(app.on_status, Command("status"))
    router.message.register(app.on_override, Command("override"))
    router.message.register(app.on_lint, Command("lint"))
    router.message.register(app.on_synthesize, Command("synthesize"))
    router.message.register(app.on_unknown_command, F.text.startswith("/"))
    router.message.register(app.on_source)
    dispatcher = Dispatcher()
    dispatcher.include_router(router)
    return dispatcher


def build(settings: Settings, read_states: StateReader) -> tuple[Bot, Dispatcher]:
    return build_bot(settings), build_dispatcher(BotApp(settings, read_states))


# The Bot API can be out of reach when the bot starts: the machine boots
# before its network, or a container starts before its route out. aiogram's
# polling loop waits out network errors, but its first call (getMe, in
# start_polling) does not: the bot stopped, and a container that restarts it
# was not running for part of each minute (found by tests/test_containers.py).
# So the bot waits for getMe itself, with waits that double up to 60 s.
BOT_API_FIRST_WAIT_S = 1.0
BOT_API_MAX_WAIT_S = 60.0


async def wait_for_bot_api(bot: Bot, token: str, first_wait_s: float = BOT_API_FIRST_WAIT_S) -> None:
    """Call getMe until the Bot API answers. A network error or a server
    error (5xx) waits and tries again; a refusal of the token
    (TelegramUnauthorizedError) goes to the caller at once."""
    import tenacity
    from aiogram.exceptions import TelegramNetworkError, TelegramServerError

    def told(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception()
        log.warning("the Bot API does not answer (%s); try %d again in %.0f s",
                    redact(f"{type(error).__name__}: {error}", token), state.attempt_number + 1,
                    state.next_action.sleep if state.next_action else 0)

    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type((TelegramNetworkError, TelegramServerError, aiohttp.ClientError,
                                                asyncio.TimeoutError)),
        wait=tenacity.wait_exponential(multiplier=first_wait_s, max=BOT_API_MAX_WAIT_S),
        before_sleep=told, reraise=True)
    async for attempt in retrying:
        with attempt:
            await bot.me()  # aiogram keeps the answer: start_polling asks no second time


async def run(settings: Settings, read_states: StateReader, *, polling_timeout: int = 30,
              handle_signals: bool = True, first_wait_s: float = BOT_API_FIRST_WAIT_S) -> None:
    bot, dispatcher = build(settings, read_states)
    await wait_for_bot_api(bot, bot_token(settings), first_wait_s)
    try:
        await bot.set_my_commands(COMMANDS)
    except (TelegramAPIError, aiohttp.ClientError) as exc:
        log.warning("cannot set the command menu: %s", redact(str(exc), bot_token(settings)))
    await dispatcher.start_polling(bot, polling_timeout=polling_timeout, handle_signals=handle_signals,
                                   allowed_updates=["message"])


def serve(settings: Settings, read_states: StateReader) -> int:
    """Run the bot until it is stopped; the exit code of `kb-bot`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = bot_token(settings)
    if not token:
        print(f"TELEGRAM_BOT_TOKEN is not set: there is no bot. Drop files in {settings.inbox_dir} instead.",
              file=sys.stderr)
        return 2
    install_redaction(token)
    if not settings.allowed_users():
        log.warning("ALLOWED_USER_IDS is empty: the bot answers nobody. Add your Telegram user id.")
    Path(settings.inbox_dir).mkdir(parents=True, exist_ok=True)
    log.info("kb-bot: inbox %s, Bot API %s", settings.inbox_dir, settings.telegram_api_base)
    from aiogram.exceptions import TelegramUnauthorizedError

    try:
        asyncio.run(run(settings, read_states))
    except TelegramUnauthorizedError:
        print(f"The Bot API at {settings.telegram_api_base} refuses TELEGRAM_BOT_TOKEN (Unauthorized). "
              "Get the token again from @BotFather.", file=sys.stderr)
        return 2
    return 0
