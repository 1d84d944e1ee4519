"""A loopback stand-in for the Telegram Bot API.

It speaks the HTTP protocol that aiogram's AiohttpSession uses:
`POST /bot<token>/<method>` with form fields (objects as JSON strings),
answered with `{"ok": true, "result": ...}` or `{"ok": false,
"error_code": ..., "description": ...}`; and `GET /file/bot<token>/<path>`
for file downloads. Methods: getMe, getUpdates (long polling, with offset
confirmation), sendMessage, getFile, setMyCommands, deleteWebhook.

The server runs its own event loop in a thread, so sync code (the
notifier in a sensor) and async code (the bot) can both use it. A request
with another token gets 401, as Telegram answers.

Update builders at the bottom make the Update JSON of each message kind.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web

BOT_ID = 123456
BOT_USERNAME = "kb_test_bot"
MAX_MESSAGE_CHARS = 4096  # Telegram refuses a longer sendMessage text


@dataclass
class StoredFile:
    file_id: str
    file_path: str
    content: bytes
    get_file_error: tuple[int, str] | None = None  # (status, description) for getFile
    download_status: int = 200  # the file server's answer


@dataclass
class FakeTelegram:
    token: str
    updates: list[dict] = field(default_factory=list)
    sent: list[dict] = field(default_factory=list)  # sendMessage calls, as received
    calls: list[tuple[str, dict]] = field(default_factory=list)
    files: dict[str, StoredFile] = field(default_factory=dict)
    downloads: list[str] = field(default_factory=list)
    unauthorized: int = 0
    confirmed_offset: int = 0
    send_errors: list[tuple[int, str]] = field(default_factory=list)  # answers for the next sendMessage calls

    def __post_init__(self):
        self._message_ids = itertools.count(10_000)
        self._update_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._new_update: asyncio.Event | None = None
        self._started = threading.Event()
        self.base_url = ""

    # --- life cycle -------------------------------------------------------------------
    def start(self, port: int = 0, host: str = "127.0.0.1") -> FakeTelegram:
        """`host`: the address to listen on (the container test listens on the
        machine's own address, which the containers' proxy reaches)."""
        self._port, self._host = port, host
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fake-telegram")
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the fake Telegram server did not start")
        return self

    def stop(self) -> None:
        if self._loop:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._new_update = asyncio.Event()
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self._host, self._port)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://{self._host}:{port}"
        self._started.set()
        self._loop.run_forever()

    # --- what tests do ------------------------------------------------------------------
    def next_update_id(self) -> int:
        return next(self._update_ids)

    def push(self, *updates: dict) -> None:
        with self._lock:
            self.updates.extend(updates)
        self._loop.call_soon_threadsafe(self._new_update.set)

    def add_file(self, file_id: str, file_path: str, content: bytes, **kwargs) -> None:
        self.files[file_id] = StoredFile(file_id, file_path, content, **kwargs)

    def replies_to(self, message_id: int) -> list[str]:
        return [m["text"] for m in self.sent if m.get("reply_to_message_id") == message_id]

    def all_confirmed(self) -> bool:
        """True when the bot has confirmed (by offset) every update pushed."""
        with self._lock:
            return not self.updates or self.confirmed_offset > max(u["update_id"] for u in self.updates)

    async def wait_until(self, condition, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake Telegram: condition not met in {timeout} s; sent={self.sent}")
            await asyncio.sleep(0.02)

    # --- the Bot API ------------------------------------------------------------------------
    def _error(self, status: int, description: str) -> web.Response:
        return web.json_response({"ok": False, "error_code": status, "description": description}, status=status)

    async def _api(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            self.unauthorized += 1
            return self._error(401, "Unauthorized")
        method = request.match_info["method"].lower()
        form = await request.post()
        params = {key: form[key] for key in form}
        self.calls.append((method, params))
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return self._error(404, "Not Found: method not found")
        result = await handler(params)
        if isinstance(result, web.Response):
            return result
        return web.json_response({"ok": True, "result": result})

    async def _m_getme(self, params):
        return {"id": BOT_ID, "is_bot": True, "first_name": "kb", "username": BOT_USERNAME}

    async def _m_deletewebhook(self, params):
        return True

    async def _m_setmycommands(self, params):
        return True

    async def _m_getupdates(self, params):
        offset = int(params.get("offset", 0) or 0)
        timeout = float(params.get("timeout", 0) or 0)
        deadline = time.monotonic() + min(timeout, 1.0)
        while True:
            with self._lock:
                if offset:
                    self.confirmed_offset = max(self.confirmed_offset, offset)
                # As Telegram: a confirmed update is gone for good, also for a
                # new bot process that asks with no offset (a restart of kb up).
                pending = [u for u in self.updates if u["update_id"] >= max(offset, self.confirmed_offset)]
            if pending or time.monotonic() >= deadline:
                return pending
            self._new_update.clear()
            try:
                await asyncio.wait_for(self._new_update.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass

    async def _m_sendmessage(self, params):
        if self.send_errors:
            return self._error(*self.send_errors.pop(0))
        if len(params.get("text", "")) > MAX_MESSAGE_CHARS:
            return self._error(400, "Bad Request: message is too long")
        reply = json.loads(params["reply_parameters"]) if params.get("reply_parameters") else {}
        chat_id = int(params["chat_id"])
        record = {
            "chat_id": chat_id,
            "text": params["text"],
            "reply_to_message_id": reply.get("message_id") or (int(params["reply_to_message_id"]) if params.get("reply_to_message_id") else None),
        }
        self.sent.append(record)
        return {
            "message_id": next(self._message_ids), "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private"}, "text": params["text"],
            "from": {"id": BOT_ID, "is_bot": True, "first_name": "kb"},
        }

    async def _m_getfile(self, params):
        stored = self.files.get(params["file_id"])
        if stored is None:
            return self._error(400, "Bad Request: invalid file_id")
        if stored.get_file_error:
            return self._error(*stored.get_file_error)
        return {"file_id": stored.file_id, "file_unique_id": "u" + stored.file_id,
                "file_size": len(stored.content), "file_path": stored.file_path}

    async def _file(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            self.unauthorized += 1
            return web.Response(status=401, text="Unauthorized")
        path = request.match_info["path"]
        self.downloads.append(path)
        for stored in self.files.values():
            if stored.file_path == path:
                if stored.download_status != 200:
                    return web.Response(status=stored.download_status, text="error")
                return web.Response(body=stored.content, content_type="application/octet-stream")
        return web.Response(status=404, text="Not Found")


# --- Update JSON ------------------------------------------------------------------------------


@contextmanager
def owner_bot(monkeypatch, token: str, owner_chat: int) -> Iterator["FakeTelegram"]:
    """A FakeTelegram that kb's notifier reaches: the bot token, the API
    base and the owner's chat are in the environment until the end."""
    server = FakeTelegram(token).start()
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", token)
    monkeypatch.setenv("TELEGRAM_API_BASE", server.base_url)
    monkeypatch.setenv("OWNER_CHAT_ID", str(owner_chat))
    try:
        yield server
    finally:
        server.stop()


def message_update(update_id: int, message_id: int, user_id: int, *, chat_id: int | None = None, **fields) -> dict:
    return {
        "update_id": update_id,
        "message": {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": chat_id if chat_id is not None else user_id, "type": "private", "first_name": "Owner"},
            "from": {"id": user_id, "is_bot": False, "first_name": "Owner"},
            **fields,
        },
    }


def text_fields(text: str, entities: list[dict] | None = None) -> dict:
    fields = {"text": text}
    if entities:
        fields["entities"] = entities
    return fields


def text_link_entity(text: str, label: str, url: str) -> dict:
    """A text_link entity over `label` in `text`. Offsets count UTF-16 code units."""
    start = text.index(label)
    offset = len(text[:start].encode("utf-16-le")) // 2
    return {"type": "text_link", "offset": offset, "length": len(label.encode("utf-16-le")) // 2, "url": url}


def command_fields(text: str) -> dict:
    command = text.split()[0]
    return {"text": text, "entities": [{"type": "bot_command", "offset": 0, "length": len(command)}]}


def voice_fields(file_id: str, size: int, duration: int = 4) -> dict:
    return {"voice": {"file_id": file_id, "file_unique_id": "u" + file_id, "duration": duration,
                      "mime_type": "audio/ogg", "file_size": size}}


def document_fields(file_id: str, file_name: str, mime_type: str, size: int, caption: str | None = None) -> dict:
    fields = {"document": {"file_id": file_id, "file_unique_id": "u" + file_id, "file_name": file_name,
                           "mime_type": mime_type, "file_size": size}}
    if caption:
        fields["caption"] = caption
    return fields


def photo_fields(file_id: str) -> dict:
    return {"photo": [{"file_id": file_id, "file_unique_id": "u" + file_id, "width": 90, "height": 90, "file_size": 1000}]}


def sticker_fields(file_id: str) -> dict:
    return {"sticker": {"file_id": file_id, "file_unique_id": "u" + file_id, "type": "regular", "width": 512,
                        "height": 512, "is_animated": False, "is_video": False}}


def video_fields(file_id: str) -> dict:
    return {"video": {"file_id": file_id, "file_unique_id": "u" + file_id, "width": 640, "height": 360,
                      "duration": 5, "mime_type": "video/mp4", "file_size": 50_000}}


def converse(fake: "FakeTelegram", *updates: dict, timeout: float = 20) -> None:
    """Run the real bot's long polling against this fake until it has handled
    and confirmed every update. The bot is the code under test; the fake only
    speaks the Bot API."""
    from kb.apps.bot_runner import dagster_reader
    from kb.settings import get_settings
    from telegram_bridge.bot import build

    async def session():
        # The state reader `kb-bot` uses: commands read a real Dagster instance.
        settings = get_settings()
        bot, dispatcher = build(settings, dagster_reader(settings))
        fake.push(*updates)
        # handle_as_tasks=False: one update after another, so "all confirmed"
        # means "all handled".
        polling = asyncio.create_task(dispatcher.start_polling(
            bot, polling_timeout=1, handle_signals=False, handle_as_tasks=False, allowed_updates=["message"]))
        try:
            await fake.wait_until(fake.all_confirmed, timeout)
        finally:
            await dispatcher.stop_polling()
            await polling
    asyncio.run(session())
