"""The Telegram bot token: read it, keep it out of every log line and
reply, and say whether the bridge is set up. No aiogram here: importing it
takes seconds of CPU, and `kb status` needs none of it.

The token is part of every Bot API URL (/bot<token>/method and
/file/bot<token>/path), and aiohttp puts the URL into its error messages.
So every text that leaves kb from kb/telegram/api.py passes `redact()`, and
`kb-bot` installs `RedactingFilter` on its log handlers.
"""

from __future__ import annotations

import logging

from kb.settings import Settings

REDACTED = "<redacted>"


def bot_token(settings: Settings) -> str:
    token = settings.telegram_bot_token
    return token.get_secret_value().strip() if token else ""


def redact(text: str, token: str) -> str:
    """The text without the token (and without the token's secret half)."""
    if not token:
        return text
    text = text.replace(token, REDACTED)
    _, _, secret = token.partition(":")
    return text.replace(secret, REDACTED) if len(secret) >= 8 else text


class RedactingFilter(logging.Filter):
    """Removes the token from log records before a handler writes them."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        if self.token:
            message = record.getMessage()
            if self.token in message or (self.token.partition(":")[2] and self.token.partition(":")[2] in message):
                record.msg, record.args = redact(message, self.token), None
            if record.exc_info:
                # Format the traceback now, redacted, so the handler does not
                # format the raw one.
                formatted = logging.Formatter().formatException(record.exc_info)
                record.exc_text, record.exc_info = redact(formatted, self.token), None
        return True


def install_redaction(token: str) -> None:
    """Put the filter on every handler of the root logger."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(token))


def readiness(settings: Settings) -> tuple[bool, str]:
    """(ready, detail) of the Telegram bridge for `kb status`. No network call."""
    if not bot_token(settings):
        return False, f"no TELEGRAM_BOT_TOKEN: no bot; drop files in {settings.inbox_dir}"
    allowed = settings.allowed_users()
    if not allowed:
        return False, "ALLOWED_USER_IDS is empty: the bot answers nobody"
    owner = "set" if settings.owner_chat_id.strip() else "not set (system notices go to stdout)"
    return True, f"kb-bot at {settings.telegram_api_base}, {len(allowed)} allowed users, OWNER_CHAT_ID {owner}"
