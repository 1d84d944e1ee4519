"""Notifications: an item is done, failed, rejected, a duplicate, or waits
for the wiki agent; a wiki lint or synthesis has a result.

- At most once per item and state, across retries and restarts: a file in
  inbox/notified/ records each one before it goes out (see
  Inbox.claim_notification). A send that fails removes the record, so the
  next sensor tick can try again.
- A Telegram item gets a reply to the message that brought it. A system
  item (a file dropped in the inbox) goes to OWNER_CHAT_ID.
- With no bot token (or no chat to write to), the notification goes to
  stdout, where `dagster dev` and the daemon's log show it, and to the
  notices log ($KB_HOME/logs/notices.jsonl), where `kb status` reads it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timezone

from pathlib import Path

from pydantic import BaseModel, SecretStr

from kb.settings import Settings, get_settings
from kb.telegram.inbox import Inbox, InboxItem
from kb.telegram.item_states import State
from kb.wiki.schema import NOTHING_NEW

log = logging.getLogger(__name__)

NOTIFIED_STATES = (State.DONE, State.FAILED, State.REJECTED, State.DUPLICATE, State.WAITING, State.REFUSED)
MAX_SUMMARY_CHARS = 300


class NotificationError(RuntimeError):
    """The Bot API did not take the notification. The message has no token."""


def describe(item: InboxItem | None, item_id: str, title: str | None) -> str:
    """The name of an item in a notice: its title, else its URL or file name, else `item <id>`."""
    return title or (item.url if item and item.url else None) or (item.file_name if item else None) or f"item {item_id}"


# The notices follow the owner's specification (section 9.3): the state in
# its words on the first line, the title in quotes, the detail, and the
# short id. kb's own lines (the summary, the commit, the gate's note, the
# /override hint) come after the specification's lines.
def notification_text(state: str, title: str, *, item_id: str = "", error: str | None = None,
                      commit: str | None = None, score: int | None = None,
                      reason: str | None = None, duplicate_of: str | None = None, created: list | None = None,
                      updated: list | None = None, summary: str | None = None, warnings: list | None = None,
                      gate_note: str = "") -> str:
    lines = _state_lines(state, f'"{clip(title, 200)}"', item_id, error=error, commit=commit, score=score,
                         reason=reason, duplicate_of=duplicate_of, created=created, updated=updated,
                         summary=summary, warnings=warnings)
    # A source that the gate let in only because every try failed: the owner must know.
    if gate_note and state in (State.DONE, State.WAITING, State.REFUSED):
        lines.append(gate_note)
    return "\n".join(line for line in lines if line)


def _state_lines(state: str, quoted: str, item_id: str, *, error, commit, score, reason, duplicate_of, created,
                 updated, summary, warnings) -> list[str]:
    ident = f"ID: {item_id}" if item_id else ""
    override = f"Send /override {item_id} to ingest it anyway." if item_id else ""
    if state == State.DONE:
        lines = ["Ingested", quoted, f"+{len(created or [])} pages, {len(updated or [])} updates", ident]
        if warnings:
            lines.append(f"\u26a0 {len(warnings)} warning(s)")
            # A partial change is in the wiki; the owner reads what is missing.
            lines += [clip(w) for w in warnings if str(w).startswith("partial: ")]
        return lines + [clip(summary) if summary else "", f"Commit: {commit[:12]}" if commit else ""]
    if state == State.FAILED:
        return ["Ingest failed", quoted, clip(error or "no error message", 600), ident]
    if state == State.REJECTED:
        scored = f"score {score}" if score is not None else "no score"
        return [f"Skipped (low quality, {scored})", quoted, reason or "no reason given", override]
    if state == State.DUPLICATE:
        return [f"Skipped (duplicate of item {duplicate_of})", quoted, override]
    if state == State.WAITING:
        return ["Waiting for the wiki agent", quoted,
                "It is approved and searchable now. The wiki agent has no endpoint (ANTHROPIC_BASE_URL), so the "
                "wiki ingest waits. Nothing is lost: it starts when you set one.", ident]
    if state == State.REFUSED:
        return ["Wiki change refused", quoted,
                f"kb refused the wiki change: {reason or 'a rule of the wiki'}. Nothing of the change is in the "
                "wiki. The source stays approved and searchable, and kb tries the ingest again.", ident]
    raise ValueError(f"no notification for state {state!r}; states: {', '.join(NOTIFIED_STATES)}")


# The one notice about a missing gate key (source_outcomes_sensor sends it once).
NO_GATE_KEY_NOTICE = "nogatekey"


def no_gate_key_text() -> str:
    return ("No quality gate key\n"
            "DEEPSEEK_API_KEY is not set, so kb accepts every source without a score. /status shows "
            "\"not scored\" for them. Set the key, and kb scores the sources that come after it.")


def run_ending_text(state: str, job: str, partition: str, reason: str, run_id: str) -> str:
    """The notice of a run that failed for good or was canceled: the job,
    the partition and the reason, and the run id for the Dagster UI."""
    where = f" partition {partition}" if partition else ""
    return f"{state}: {job}{where}: {clip(reason or 'no error message', 600)} (run {run_id[:8]})"


def clip(text: str, limit: int = MAX_SUMMARY_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def wiki_result_text(asset: str, partition: str, metadata: dict) -> str:
    """The notice of a wiki lint, a weekly synthesis or a topic synthesis."""
    warnings = metadata.get("warnings") or []
    tail = f" Warnings: {len(warnings)}." if warnings else ""
    if asset == "wiki_lint":
        before = metadata.get("findings_by_kind") or {}
        kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(before.items()) if n) or "none"
        found, left = metadata.get("findings_before", 0), metadata.get("findings_after", 0)
        fixed = max(0, found - left)
        unsupported = metadata.get("unsupported_claims") or []
        claims = (f" Claims that their sources do not hold: {len(unsupported)}, for example "
                  f"{', '.join(unsupported[:3])}." if unsupported else "")
        return (f"lint {partition}: {found} findings ({kinds}); {fixed} fixed, {left} left.{claims} "
                f"Report: wiki/syntheses/lint/{partition}.md.{tail}")
    if asset == "wiki_synthesis":
        week = metadata.get("week") or partition
        themes = clip(metadata.get("summary") or "") or "no summary"
        return (f"weekly synthesis {week}: {metadata.get('sources', 0)} sources. Themes: {themes} "
                f"Page: wiki/syntheses/weekly/{week}.md.{tail}")
    if asset == "wiki_topic_synthesis":
        topic = metadata.get("topic") or partition
        summary = clip(metadata.get("summary") or "") or "no summary"
        if any(str(w).startswith(NOTHING_NEW) for w in warnings):
            summary = "nothing new since the last version: the page stays as it was."
        return f"topic synthesis {topic}: {summary} Page: wiki/syntheses/topics/{topic}.md.{tail}"
    raise ValueError(f"no wiki notice for asset {asset!r}")


async def _send(api_base: str, token: str, chat_id: int | str, text: str, reply_to: int | None,
                egress_proxy: str = "") -> None:
    # aiogram is imported here, not at the top: every Dagster process imports
    # this module when it loads the graph, and aiogram's types are slow to
    # import (benchmarks/figures_from_comments.md).
    from aiogram.types import ReplyParameters

    from kb.telegram.api import bot_at

    bot = bot_at(api_base, token, egress_proxy)
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
    egress_proxy: str = ""  # KB_EGRESS_PROXY: the Bot API through kb's egress proxy
    # Where a notice goes when no bot can send it (`kb status` reads it).
    notices_log: str = ""

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> TelegramNotifier:
        s = settings or get_settings()
        return cls(**{"inbox_dir": str(s.inbox_dir), "api_base": s.telegram_api_base,
                      "bot_token": s.telegram_bot_token, "owner_chat_id": s.owner_chat_id,
                      "egress_proxy": s.kb_egress_proxy,
                      "notices_log": str(notices_log_path(s)), **overrides})

    def notify(self, item_id: str, state: str, text: str, *, chat_id: int | str | None = None) -> bool:
        """Send once. True when sent now, False when it was sent before.
        Raises NotificationError when the Bot API refuses it (not recorded).
        `item_id` names what the notice is about (an inbox item, or a run of
        the wiki). `chat_id` (the owner who sent /lint, for example) wins
        over the item's chat and over OWNER_CHAT_ID."""
        inbox = Inbox(Path(self.inbox_dir))
        if not inbox.claim_notification(item_id, state):
            return False
        item = inbox.find(item_id) if chat_id is None else None
        token = self.bot_token.get_secret_value().strip() if self.bot_token else ""
        if chat_id is not None:
            reply_to = None
        elif item is not None and not item.is_system:
            chat_id, reply_to = item.chat_id, item.message_id
        else:
            chat_id, reply_to = self.owner_chat_id.strip() or None, None
        if not token or chat_id is None:
            print(f"[kb] {text}", flush=True)
            self._log_unsent(item_id, state, text, "no TELEGRAM_BOT_TOKEN" if not token else "no OWNER_CHAT_ID")
            return True
        try:
            asyncio.run(_send(self.api_base, token, chat_id, text, reply_to, self.egress_proxy))
        except Exception as exc:  # aiogram and aiohttp raise many kinds
            from kb.telegram.bot_token import redact

            inbox.release_notification(item_id, state)
            raise NotificationError(f"notification {state} of item {item_id} not sent: "
                                    f"{redact(f'{type(exc).__name__}: {exc}', token)}") from None
        return True

    def _log_unsent(self, key: str, state: str, text: str, why: str) -> None:
        if not self.notices_log:
            return
        path = Path(self.notices_log)
        record = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "key": key, "state": state,
                  "text": text, "not_sent": why}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as log_file:  # one short line: an append is whole
                log_file.write(json.dumps(record) + "\n")
        except OSError as exc:
            log.warning("could not write the notice to %s: %s", path, exc)


def notices_log_path(settings: Settings) -> Path:
    return settings.home / "logs" / "notices.jsonl"


def recent_notices(settings: Settings, limit: int = 5) -> list[dict]:
    """The newest notices that no bot sent, newest last, for `kb status`."""
    path = notices_log_path(settings)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    notices = []
    for line in lines[-limit:]:
        try:
            notices.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a full disk: the others still count
    return notices
