"""Cut a text into paragraph-aligned passages.

The same function cuts bookmark texts (asset `chunks`) and the retrieval
evaluation corpus, so the evaluation measures what the owner searches.

Rules:
- A blank line ends a paragraph. Short paragraphs are merged up to the size
  limit, so a passage has enough words to embed well.
- A paragraph over the limit is cut at sentence ends into parts of about
  equal size. Equal parts, because a 20-word tail passage embeds badly and
  steals hits from its neighbours.
- A sentence over the limit is cut at spaces; a run without spaces over the
  limit is cut between its characters.

Words: a run of characters between spaces is one word, but in a script
that puts no spaces between its words (Chinese, Japanese, Thai, Lao, Khmer,
Burmese) each character counts as one word, with its combining marks; and
each Hangul syllable. So 4,480 characters of Chinese make 25 passages, not
one passage of one word. Why characters and not a word segmenter: the
tokenizer of the embedding model makes one token of each Chinese or
Japanese character (measured on real text: benchmarks/filters_and_scripts.md),
so the limit in characters is the limit that the model window needs; and
no dictionary to install or to keep up to date.

The default limit of 200 words keeps a passage inside the 256-token window of
all-MiniLM-L6-v2: words past the window would be indexed for BM25 but not
seen by the embedding.
"""

from __future__ import annotations

import math
import re

DEFAULT_MAX_WORDS = 200

PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n+")
# Scripts in which each character counts as a word: those written without
# spaces between words (Thai, Lao, Burmese, Khmer, CJK punctuation, kana,
# bopomofo, Han with its extensions, half-width katakana), and Hangul. Korean
# puts spaces between words, and a cut comes at a space first; but the model
# makes about 6 tokens of a Korean word (it splits each syllable into its
# letters), so the limit counts syllables.
UNSPACED = ("\u0e00-\u0eff\u1000-\u11ff\u1780-\u17ff\u3001-\u303f\u3040-\u30ff\u3100-\u318f\u31f0-\u31ff"
            "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff61-\uff9f\U00020000-\U0003134f")
# One word: a character of such a script with its combining marks, or a run
# of other characters between spaces.
MARKS = ("\u0300-\u036f\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd\u102b-\u103e"
         "\u17b4-\u17d3\u3099\u309a\ufe00-\ufe0f")
CHARACTER_WORD = rf"[{UNSPACED}][{MARKS}]*"
# A run of more than LONG_WORD_CHARS characters without a space counts one
# word for each LONG_WORD_CHARS, and a cut may come between them. Without
# it a run with no space was one word of any length: an inline image of
# 20 MB in Base64 (a Markdown note), or a page's line of 5 MB, was one
# passage, which every search that found it gave whole to the web page
# and to an MCP client (7 December 2026). A word of a dictionary or the
# address of a post is shorter.
LONG_WORD_CHARS = 64
WORD = re.compile(rf"{CHARACTER_WORD}|[^\s{UNSPACED}]{{1,{LONG_WORD_CHARS}}}")
# A sentence ends at . ! ? and white space (a closing quote or bracket may
# come between), or at the CJK 。！？ (with no space after them).
SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+"
                          r"|(?:(?<=[。！？])|(?<=[。！？][」』”’)）\]]))(?![」』”’)）\]])\s*")
SPACE = re.compile(r"\s+")


def word_count(text: str) -> int:
    return len(WORD.findall(text))


def chunk_text(text: str, *, max_words: int = DEFAULT_MAX_WORDS) -> list[str]:
    """Paragraph-aligned passages of at most `max_words` words each.

    Empty or blank text gives no passages. The characters of the text, but
    for white space, are kept in order, none dropped, none repeated."""
    if max_words < 1:
        raise ValueError(f"max_words must be 1 or more, not {max_words}")
    paragraphs = [_clean(p) for p in PARAGRAPH_BREAK.split(text.replace("\r\n", "\n").replace("\r", "\n"))]
    pieces: list[tuple[str, int]] = []
    for paragraph in paragraphs:
        if not paragraph:
            continue
        words = word_count(paragraph)
        if words <= max_words:
            pieces.append((paragraph, words))
        else:
            pieces.extend((part, word_count(part)) for part in _split_long(paragraph, words, max_words))
    return [part for part in _pack(pieces, max_words, "\n\n")]


def _clean(paragraph: str) -> str:
    # Keep single line breaks (lists, verse), drop blank space at line ends.
    lines = [line.strip() for line in paragraph.split("\n")]
    return "\n".join(line for line in lines if line)


def _pack(pieces: list[tuple[str, int]], max_words: int, separator: str, target: float = math.inf) -> list[str]:
    """Join neighbouring (piece, words) with `separator`, in order. A part
    closes when it reached `target` words, or when the next piece would push
    it over `max_words`."""
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for piece, words in pieces:
        if current and (size >= target or size + words > max_words):
            parts.append(separator.join(current))
            current, size = [], 0
        current.append(piece)
        size += words
    if current:
        parts.append(separator.join(current))
    return parts


def _split_long(paragraph: str, words: int, max_words: int) -> list[str]:
    """Cut one long paragraph into parts of about equal size: at sentence
    ends; a sentence over the limit at spaces; a run over the limit between
    its words (the characters of an unspaced script). Each piece keeps the
    white space after it, so the parts join without a separator."""
    pieces = _pieces(paragraph, max_words, (SENTENCE_END, SPACE, None))
    parts = math.ceil(words / max_words)
    # Parts of about equal size: each closes once it reached the mean.
    packed = _pack(pieces, max_words, "", target=sum(n for _, n in pieces) / parts)
    return [part.strip() for part in packed if part.strip()]


def _pieces(text: str, max_words: int, levels: tuple) -> list[tuple[str, int]]:
    """(piece, words) of `text`, cut at the first level of breaks, and each
    piece over the limit at the next level. Level None: between words."""
    breaks, deeper = levels[0], levels[1:]
    if breaks is None:
        return [(match.group() + _space_after(text, match.end()), 1) for match in WORD.finditer(text)]
    out: list[tuple[str, int]] = []
    for piece in _cut_after(text, breaks):
        words = word_count(piece)
        if words == 0:
            if out:  # white space alone: keep it with the piece before
                out[-1] = (out[-1][0] + piece, out[-1][1])
            continue
        if words > max_words:
            out.extend(_pieces(piece, max_words, deeper))
        else:
            out.append((piece, words))
    return out


def _cut_after(text: str, breaks: re.Pattern) -> list[str]:
    """`text` cut after each match of `breaks`; each piece keeps its match."""
    pieces, start = [], 0
    for match in breaks.finditer(text):
        if start < match.end() < len(text):
            pieces.append(text[start:match.end()])
            start = match.end()
    pieces.append(text[start:])
    return pieces


def _space_after(text: str, end: int) -> str:
    match = SPACE.match(text, end)
    return match.group() if match else ""


UNSPACED_RUN = re.compile(rf"(?:{CHARACTER_WORD})+")


def unspaced_runs(*texts: str) -> str:
    """The runs of characters of the scripts that count each character as a
    word (UNSPACED) in these texts, one space between runs: the text that
    the n-gram full-text index reads (kb/index/maintenance.py). Empty for a text
    in Latin letters only."""
    return " ".join(run.group() for text in texts if text for run in UNSPACED_RUN.finditer(text))
