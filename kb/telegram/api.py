"""The one place that builds an aiogram `Bot`, for the bot and for the
notifications. kb/telegram/bot_token.py keeps the token out of every log line
and reply; it imports no aiogram, so `kb status` does not pay for it.
"""

from __future__ import annotations

import json
import logging

from aiogram import Bot, __version__ as aiogram_version
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.methods import GetUpdates, Response, TelegramMethod
from aiogram.types import Update
from aiohttp import ClientSession
from aiohttp.hdrs import USER_AGENT
from aiohttp.http import SERVER_SOFTWARE
from pydantic import ValidationError

from kb.settings import Settings
from kb.telegram.bot_token import bot_token

log = logging.getLogger("kb.bot")


class UpdateSafeSession(AiohttpSession):
    """An aiohttp session that reads getUpdates one update at a time.

    Why: aiogram validates the whole getUpdates answer as one list. One
    update that it cannot read (a field of a type that it does not expect)
    fails the whole answer; the polling loop then asks again from the same
    offset, forever, and no later message is handled. Its error log also
    holds the full answer, with the text of every message in it (strangers'
    messages too). Here an unreadable update becomes an empty update with
    the same update_id: the dispatcher skips it, the offset moves past it,
    and the log names only its update_id and the fields that were wrong.

    `egress_proxy` (KB_EGRESS_PROXY): every request goes through kb's egress
    proxy (an HTTP proxy). aiogram's own `proxy` needs aiohttp-socks; aiohttp
    itself takes an HTTP proxy for its session, so kb gives it there."""

    def __init__(self, *, egress_proxy: str = "", **kwargs):
        super().__init__(**kwargs)
        self.egress_proxy = egress_proxy or None

    async def create_session(self) -> ClientSession:
        if self.egress_proxy is None:
            return await super().create_session()
        # aiogram's create_session (3.x), with the proxy of the session.
        if self._should_reset_connector:
            await self.close()
        if self._session is None or self._session.closed:
            self._session = ClientSession(connector=self._connector_type(**self._connector_init),
                                          headers={USER_AGENT: f"{SERVER_SOFTWARE} aiogram/{aiogram_version}"},
                                          proxy=self.egress_proxy)
            self._should_reset_connector = False
        return self._session

    def check_response(self, bot: Bot, method: TelegramMethod, status_code: int, content: str) -> Response:
        if isinstance(method, GetUpdates):
            content = readable_updates(bot, content)
        return super().check_response(bot, method, status_code, content)


def readable_updates(bot: Bot, content: str) -> str:
    """The getUpdates answer with each unreadable update replaced by
    {"update_id": N}. An update with no whole-number update_id is left out."""
    try:
        data = json.loads(content)
    except ValueError:
        return content  # aiogram reports the answer that is not JSON
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        return content
    kept = []
    for raw in data["result"]:
        try:
            Update.model_validate(raw, context={"bot": bot})
            kept.append(raw)
            continue
        except ValidationError as exc:
            fields = sorted({".".join(str(part) for part in error["loc"]) for error in exc.errors()})
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            log.warning("update %s skipped: it cannot be read (fields: %s)", update_id, ", ".join(fields[:10]))
            kept.append({"update_id": update_id})
        else:
            log.warning("an update with no update_id skipped (fields: %s)", ", ".join(fields[:10]))
    data["result"] = kept
    return json.dumps(data)


def build_bot(settings: Settings) -> Bot:
    """A Bot for TELEGRAM_API_BASE: the official Bot API, a local Bot API
    server, or the loopback stand-in of the tests."""
    return bot_at(settings.telegram_api_base, bot_token(settings), settings.kb_egress_proxy)


def bot_at(api_base: str, token: str, egress_proxy: str = "") -> Bot:
    session = UpdateSafeSession(api=TelegramAPIServer.from_base(api_base.rstrip("/")), egress_proxy=egress_proxy)
    return Bot(token=token, session=session)
