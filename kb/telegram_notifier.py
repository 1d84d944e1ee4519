"""Notifications: an item is done, failed, rejected or a duplicate.

- At most once per item and state, across retries and restarts: a file in
  inbox/notified/ records each one before it goes out (see
  Inbox.claim_notification). A send that fails removes the record, so the
  next sensor tick can try again.
- A Telegram item gets a reply to the message that brought it. A system
  item (a file dropped in the inbox) goes to OWNER_CHAT_ID.
- With no bot token (or no chat to write to), the notification goes to
  stdout, where `dagster dev` shows it.
"""

from __future__ import annotations

import asyncio
import logging

from pathlib import Path

from pydantic import BaseModel, SecretStr

from kb.settings import Settings, get_settings
from kb.telegram_api import bot_at, redact
from kb.telegram_inbox import Inbox, InboxItem

log = logging.getLogger(__name__)

NOTIFIED_STATES = ("done", "failed", "rejected", "duplicate")


class NotificationError(RuntimeError):
    """The Bot API did not take the notification. The message has no token."""


def describe(item: InboxItem | None, item_id: str, title: str | None) -> str:
    name = title or (item.url if item and item.url else None) or (item.file_name if item else None)
    return f"{name} (id {item_id})" if name else f"item {item_id}"


def notification_text(state: str, what: str, *, error: str | None = None, commit: str | None = None,
                      score: int | None = None, threshold: int | None = None, reason: str | None = None,
                      duplicate_of: str | None = None, item_id: str = "") -> str:
    if state == "done":
        return f"done: {what} is in the wiki" + (f" (commit {commit[:12]})" if commit else "") + "."
    if state == "failed":
        return f"failed: {what}: {error or 'no error message'}"
    if state == "rejected":
        scored = f"score {score} < {threshold}" if score is not None and threshold is not None else "below the threshold"
        because = f": {reason}" if reason else ""
        return f"rejected: {what}, {scored}{because}. Send /override {item_id} to ingest it anyway."
    if state == "duplicate":
        return f"duplicate: {what} is the same as item {duplicate_of}. Send /override {item_id} to ingest it anyway."
    raise ValueError(f"no notification for state {state!r}; states: {', '.join(NOTIFIED_STATES)}")


async def _send(api_base: str, token: str, chat_id: int | str, text: str, reply_to: int | None) -> None:
    from aiogram.types import ReplyParameters

    bot = bot_at(api_base, token)
    try:
        reply = ReplyParameters(message_id=reply_to, allow_sending_without_reply=True) if reply_to else None
        await bot.send_message(chat_id=chat_id, text=text, reply_parameters=reply)
    finally:
        await bot.session.close()


class TelegramNotifier(BaseModel):
    """Sends item notifications through the Bot API (TELEGRAM_BOT_TOKEN,
    TELEGRAM_API_BASE, OWNER_CHAT_ID)."""

    inbox_dir: str
    api_base: str
    bot_token: SecretStr | None = None
    owner_chat_id: str = ""

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> TelegramNotifier:
        s = settings or get_settings()
        return cls(**{"inbox_dir": str(s.inbox_dir), "api_base": s.telegram_api_base,
                      "bot_token": s.telegram_bot_token, "owner_chat_id": s.owner_chat_id, **overrides})

    def notify(self, item_id: str, state: str, text: str) -> bool:
        """Send once. True when sent now, False when it was sent before.
        Raises NotificationError when the Bot API refuses it (not recorded)."""
        inbox = Inbox(Path(self.inbox_dir))
        if not inbox.claim_notification(item_id, state):
            return False
        item = inbox.find(item_id)
        token = self.bot_token.get_secret_value().strip() if self.bot_token else ""
        if item is not None and not item.is_system:
            chat_id, reply_to = item.chat_id, item.message_id
        else:
            chat_id, reply_to = self.owner_chat_id.strip() or None, None
        if not token or chat_id is None:
            print(f"[kb] {text}", flush=True)
            return True
        try:
            asyncio.run(_send(self.api_base, token, chat_id, text, reply_to))
        except Exception as exc:  # aiogram and aiohttp raise many kinds
            inbox.release_notification(item_id, state)
            raise NotificationError(f"notification {state} of item {item_id} not sent: "
                                    f"{redact(f'{type(exc).__name__}: {exc}', token)}") from None
        return True
