"""Cut a text into paragraph-aligned passages.

The same function cuts bookmark texts (asset `chunks`) and the retrieval
evaluation corpus, so the evaluation measures what the owner searches.

Rules:
- A blank line ends a paragraph. Short paragraphs are merged up to the size
  limit, so a passage has enough words to embed well.
- A paragraph over the limit is cut at sentence ends into parts of about
  equal size. Equal parts, because a 20-word tail passage embeds badly and
  steals hits from its neighbours.
- A sentence over the limit is cut between words.

The default limit of 200 words keeps a passage inside the 256-token window of
all-MiniLM-L6-v2: words past the window would be indexed for BM25 but not
seen by the embedding.
"""

from __future__ import annotations

import math
import re

DEFAULT_MAX_WORDS = 200

PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n+")
# A sentence ends at . ! ? (or their CJK forms), then space or a closing quote.
SENTENCE_END = re.compile(r"(?<=[.!?。！？])[\"'”’)\]]*\s+")


def word_count(text: str) -> int:
    return len(text.split())


def chunk_text(text: str, *, max_words: int = DEFAULT_MAX_WORDS) -> list[str]:
    """Paragraph-aligned passages of at most `max_words` words each.

    Empty or blank text gives no passages. The words of the text are kept in
    order, none dropped, none repeated."""
    if max_words < 1:
        raise ValueError(f"max_words must be 1 or more, not {max_words}")
    paragraphs = [_clean(p) for p in PARAGRAPH_BREAK.split(text.replace("\r\n", "\n").replace("\r", "\n"))]
    pieces: list[str] = []
    for paragraph in paragraphs:
        if not paragraph:
            continue
        if word_count(paragraph) <= max_words:
            pieces.append(paragraph)
        else:
            pieces.extend(_split_long(paragraph, max_words))
    return _merge(pieces, max_words)


def _clean(paragraph: str) -> str:
    # Keep single line breaks (lists, verse), drop blank space at line ends.
    lines = [line.strip() for line in paragraph.split("\n")]
    return "\n".join(line for line in lines if line)


def _merge(pieces: list[str], max_words: int) -> list[str]:
    """Join neighbouring pieces while the sum stays within the limit."""
    return _pack(pieces, max_words, "\n\n")


def _pack(pieces: list[str], max_words: int, separator: str, target: float = math.inf) -> list[str]:
    """Join neighbouring pieces with `separator`, in order. A part closes
    when it reached `target` words, or when the next piece would push it
    over `max_words`."""
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for piece in pieces:
        words = word_count(piece)
        if current and (size >= target or size + words > max_words):
            parts.append(separator.join(current))
            current, size = [], 0
        current.append(piece)
        size += words
    if current:
        parts.append(separator.join(current))
    return parts


def _split_long(paragraph: str, max_words: int) -> list[str]:
    """Cut one long paragraph at sentence ends into parts of about equal size."""
    sentences: list[str] = []
    for sentence in SENTENCE_END.split(paragraph):
        sentence = sentence.strip()
        if not sentence:
            continue
        if word_count(sentence) > max_words:
            sentences.extend(_split_words(sentence, max_words))
        else:
            sentences.append(sentence)
    total = sum(word_count(s) for s in sentences)
    parts = math.ceil(total / max_words)
    # Parts of about equal size: each closes once it reached the mean.
    return _pack(sentences, max_words, " ", target=total / parts)


def _split_words(sentence: str, max_words: int) -> list[str]:
    words = sentence.split()
    parts = math.ceil(len(words) / max_words)
    step = math.ceil(len(words) / parts)
    return [" ".join(words[i:i + step]) for i in range(0, len(words), step)]
