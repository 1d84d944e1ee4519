"""The first line of an error message: what the owner reads in a notice,
`kb status`, a stage's failure or a log line. An error can span many lines
(a traceback, a server's whole answer); one line names it."""

from __future__ import annotations


def first_line(message: str, empty: str = "", limit: int = 300) -> str:
    """The first line of `message`, at most `limit` characters, or `empty`
    when the message has no text."""
    text = message.strip()
    return text.splitlines()[0][:limit] if text else empty


def error_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, or the name of its type
    when it has no message."""
    return first_line(str(error), type(error).__name__, limit)
