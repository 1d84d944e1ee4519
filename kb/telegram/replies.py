"""The texts that the bot sends. One function per reply, so tests and
handlers use the same words. The replies of the owner's specification
(section 12.2) come first, in its words; kb adds the detail after them (the
kind that it refused, the length of a short text)."""

from __future__ import annotations

SUPPORTED = (
    "- a web link (one per message)\n"
    "- a YouTube link\n"
    "- a PDF file\n"
    "- a Markdown file (.md, .markdown)\n"
    "- a voice note\n"
    "- text of 50 characters or more"
)


def queued(short_id: str) -> str:
    return f"queued for processing (id {short_id})"


def already_queued(short_id: str) -> str:
    return f"already received: this message is item {short_id}"


ACCEPTED = "I accept: PDF, MD, web URLs, YouTube URLs, text (50+ chars), and voice messages."


def unsupported(kind: str) -> str:
    return f"Unsupported message type ({kind}). {ACCEPTED}"


def unsupported_document(file_name: str | None, mime_type: str | None) -> str:
    return unsupported(file_name or mime_type or "this document")


def too_short(length: int, minimum: int) -> str:
    return f"Text is too short (min {minimum} chars): it has {length}. Send more, or a link."


def several_urls(count: int) -> str:
    return f"Send one link per message please. This message has {count}."


def not_saved(error_kind: str) -> str:
    """The item could not be saved (the inbox cannot be written). The
    specification's words first (11.2: "system error, try again"), then
    the kind of the error: never its text, which can name paths."""
    return f"system error, try again. The item is not queued: the inbox cannot be written ({error_kind})."


def download_failed(reason: str) -> str:
    return f"Could not download attachment: {reason}"


def too_large(size: int, limit: int) -> str:
    return f"the file is {size / 1024 / 1024:.1f} MB; the limit is {limit / 1024 / 1024:.0f} MB"


def help_text(user_id: int, allowed_count: int) -> str:
    return (
        "I add sources to your knowledge base. Send me:\n"
        f"{SUPPORTED}\n\n"
        "Commands:\n"
        "/status - your last 10 items\n"
        "/status <id> - state, error and wiki commit of one item\n"
        "/override <id> - ingest a rejected or duplicate item anyway\n"
        "/lint - check the wiki now\n"
        "/synthesize <topic> - write a synthesis now\n\n"
        f"Allowlist: on. You (user {user_id}) are one of {allowed_count} allowed users."
    )


def unknown_command(command: str) -> str:
    return f"unknown command /{command}. Send /help for the list."
