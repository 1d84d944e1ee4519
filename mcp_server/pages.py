"""Bounded pages of a long text, for the MCP tools that read documents.

An agent reads a document one page at a time. A page never holds more than
PAGE_WORDS words or PAGE_CHARS characters, so a 78,000-word changelog cannot
flood the caller's context. The offset counts words from the start of the
document; each page gives the offset of the next page.

A page ends at the end of a passage when that keeps at least half of the
page, so passages mostly stay whole. A passage that does not fit is cut
between two words, and the next page starts with the word after the cut.
Pages never overlap and never skip a word: joined, they give the document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PAGE_WORDS = 2000
# About 8 characters for each word. English prose needs about 6, so the word
# bound decides for prose; the character bound decides for text with few
# spaces (URLs, code, Chinese or Japanese text).
PAGE_CHARS = 16_000
# A run of more than this many characters with no space counts as several
# words. Else one 50,000-character line of base64 or of Chinese text would be
# one "word", and the page would have no bound.
MAX_WORD_CHARS = 64
WORD = re.compile(r"\S{1,%d}" % MAX_WORD_CHARS)


@dataclass(frozen=True)
class Passage:
    """One passage of a document, in reading order."""

    source: str
    ref: str
    position: int
    text: str


@dataclass(frozen=True)
class Page:
    offset: int
    next_offset: int | None
    total_words: int
    words: int
    parts: list[dict]

    @property
    def has_more(self) -> bool:
        return self.next_offset is not None


class OffsetError(ValueError):
    """The offset is not in the document."""


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character positions of each word of the text."""
    return [m.span() for m in WORD.finditer(text)]


def count_words(text: str) -> int:
    return sum(1 for _ in WORD.finditer(text))


def word_offsets(passages: list[Passage]) -> list[int]:
    """The word offset at which each passage starts."""
    offsets, total = [], 0
    for passage in passages:
        offsets.append(total)
        total += count_words(passage.text)
    return offsets


def page_of(passages: list[Passage], offset: int = 0, *,
            max_words: int = PAGE_WORDS, max_chars: int = PAGE_CHARS) -> Page:
    """The page that starts `offset` words into the passages.

    Raises OffsetError when the offset is negative or past the end. An
    offset equal to the number of words gives an empty last page."""
    # (passage index, start, end) of each word of the document.
    words = [(index, start, end) for index, passage in enumerate(passages)
             for start, end in word_spans(passage.text)]
    total = len(words)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise OffsetError(f"offset={offset!r} is not a whole number")
    if offset < 0:
        raise OffsetError(f"offset={offset} is negative: the first page has offset 0")
    if offset > total:
        raise OffsetError(f"offset={offset} is past the end: the document has {total} words")
    end = _page_end(words, offset, max_words, max_chars)
    parts = _parts(passages, words, offset, end)
    return Page(offset=offset, next_offset=end if end < total else None, total_words=total,
                words=end - offset, parts=parts)


def _page_end(words: list[tuple[int, int, int]], offset: int, max_words: int, max_chars: int) -> int:
    """The offset after the last word of the page."""
    end, chars = offset, 0
    while end < len(words) and end - offset < max_words:
        index, start, stop = words[end]
        same_passage = end > offset and words[end - 1][0] == index
        # Inside one passage the page keeps the text between the words too.
        added = stop - words[end - 1][2] if same_passage else stop - start
        if end > offset and chars + added > max_chars:
            break
        chars += added
        end += 1
    if end == len(words):
        return end
    # Prefer to stop at the end of a passage, when that keeps half the page.
    for cut in range(end, offset + (end - offset) // 2, -1):
        if words[cut][0] != words[cut - 1][0]:
            return cut
    return end


def _parts(passages: list[Passage], words: list[tuple[int, int, int]], offset: int, end: int) -> list[dict]:
    parts: list[dict] = []
    cursor = offset
    while cursor < end:
        index = words[cursor][0]
        last = cursor
        while last + 1 < end and words[last + 1][0] == index:
            last += 1
        passage = passages[index]
        start_char, end_char = words[cursor][1], words[last][2]
        whole = (cursor == 0 or words[cursor - 1][0] != index) and (
            last + 1 == len(words) or words[last + 1][0] != index)
        parts.append({
            "source": passage.source,
            "ref": passage.ref,
            "position": passage.position,
            "text": passage.text[start_char:end_char],
            # False: the passage goes on in the page before or after this one.
            "whole_passage": whole,
        })
        cursor = last + 1
    return parts


def clip_words(text: str, max_words: int, max_chars: int = PAGE_CHARS) -> tuple[str, bool]:
    """The text cut after `max_words` words (or `max_chars` characters), and
    whether it was cut."""
    spans = word_spans(text)
    keep = spans[:max_words]
    while keep and keep[-1][1] - keep[0][0] > max_chars:
        keep.pop()
    if len(keep) == len(spans):
        return text, False
    return (text[keep[0][0]:keep[-1][1]] if keep else ""), True
