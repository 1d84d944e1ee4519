"""Text that a stranger wrote, as words only."""

from __future__ import annotations

import unicodedata


def readable_text(text: str) -> str:
    """The text without control and format characters (NUL, zero-width and
    the like), which carry no words: 60 NUL characters are not a source.
    An escape sequence of a terminal (ESC ] 52 writes the clipboard, ESC ] 0
    the window's title) loses its ESC and shows as plain characters."""
    return "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
