"""The exact-word rules of a search (kb/index/search.py):

- A passage that holds the exact query phrase (or every "quoted phrase")
  ranks above the passages that do not.
- A rare word is one that at most RARE_SHARE of the passages hold (at least
  RARE_MIN): a name, an identifier, a CVE number. An embedding model has
  never seen such a word, so semantic neighbours can outscore the one
  passage that holds it. For a keyword query (at most KEYWORD_QUERY_WORDS
  content words), the passages that hold every rare word rank first. For a
  longer query, the best such passage is kept among the first RARE_SLOT hits.

A server (search.warm_up()) counts, once per data fragment and source, the
passages that hold each word: a query word that surely more than rare_max
passages hold is not rare, and needs no look-up (skip_common_words()). A
new table version counts its new fragments on a thread of its own. The
look-ups themselves are Lance queries: search.py makes them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from functools import lru_cache

from kb.index.chunking import UNSPACED
from kb.index.fusion import Candidate
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS
from kb.index.passage_rows import PassageRows
from kb.index.stop_words import FTS_STOP_WORDS, STOP_WORDS

# A query word is rare when at most this share of the passages holds it
# (but never fewer than RARE_MIN passages). One small full-text look-up per
# query word finds out, for at most MAX_PROBES words per query: the words that
# the fewest lexical hits hold. A word that the word counts show in more
# passages needs no look-up (skip_common_words()).
RARE_SHARE = 0.001
RARE_MIN = 3
MAX_PROBES = 3
# On a large table the look-ups start with the lexical query, before it
# tells which words the fewest hits hold, for queries of at most this many
# words: up to 2 look-ups more than MAX_PROBES, but they run while the
# dense query runs. After the lexical list, at 100k passages, 3 look-ups
# added about 3 to 7 ms to each query of 4 or 5 words.
EARLY_PROBES = MAX_PROBES + 2
# A query of at most this many content words is a keyword look-up: passages
# that hold all its rare words rank first. A longer query is a question or a
# description: the best passage that holds all its rare words is kept among
# the first RARE_SLOT hits, and the fusion orders the rest. (On SciFact,
# pinning such passages first for long queries cost 0.02 nDCG@10; the slot
# costs nothing.)
KEYWORD_QUERY_WORDS = 4
RARE_SLOT = 3
# The whole query counts as an exact phrase only when it is this short. A
# long question never occurs word for word, so the check would cost time
# for nothing.
MAX_PHRASE_WORDS = 8
# The token limit of the full-text index (tantivy's filter, as
# kb.index.maintenance.fts_config() sets it up).
FTS_MAX_TOKEN = 40
QUOTED = re.compile(r'"([^"]+)"')
TOKEN = re.compile(r"\w+", re.UNICODE)


class LowerTexts:
    """The lowered text of the candidates, read once per search: the
    rare-word count and the phrase test read the same texts. Lowering and
    reading each text twice cost about 1 ms per query at 10,000 passages."""

    def __init__(self, rows: PassageRows):
        self._rows = rows
        self._lowered: dict[int, str] = {}

    def lowered(self, row_ids: list[int]) -> list[str]:
        missing = [r for r in row_ids if r not in self._lowered]
        if missing:
            for row_id, text in zip(missing, self._rows.column("text", missing)):
                self._lowered[row_id] = text.lower()
        return [self._lowered[r] for r in row_ids]


def rare_candidates(query: str) -> list[str]:
    """The query words that may be rare: no stop word, not one letter."""
    words: dict[str, None] = {}
    for word in TOKEN.findall(QUOTED.sub(lambda m: m.group(1), query).lower()):
        if word not in STOP_WORDS and len(word) > 1:
            words[word] = None
    return list(words)


def rare_word_max(table_rows: int) -> int:
    return max(RARE_MIN, int(table_rows * RARE_SHARE))


# The look-up results kept per table version: at most this many words and
# this many row ids in all (8 bytes each: at most 16 MB), so that a long-lived
# server on a large table does not grow without a limit.
WORD_CACHE_WORDS = 20_000
WORD_CACHE_IDS = 2_000_000


def lowered_words(text: str) -> set[str]:
    """The words of a text as the rare-word rule sees them: the whole words
    that _holds_word() finds in the lowered text."""
    return set(TOKEN.findall(text.lower()))


# A thread of its own counts the words of the new data fragments of a table
# version (a sync's new passages; all of them after a compaction), so that
# no search waits for the count. Until it ends, the search looks up more
# words. A daemon thread: a server that stops does not wait for a count (an
# executor's worker would hold the exit for up to 10 s at 100k passages).
# The lock lets one count run at a time.
_COUNTING = threading.Lock()


def count_new_fragments(rows: PassageRows) -> None:
    """Count the words of the fragments of a new table version that have no
    counts yet, when the index counts words (warm_up() starts that: a server
    does; a one-off search from the command line does not wait seconds for
    it)."""
    if rows.uncounted() and not rows.counting_started:
        rows.counting_started = True
        threading.Thread(target=_count_words, args=(rows,), name="kb-word-count", daemon=True).start()


def _count_words(rows: PassageRows) -> None:
    with _COUNTING:
        rows.count_words()
        _give_back_freed_memory()


def _give_back_freed_memory() -> None:
    """Return the free memory of the C heap to the system (glibc's
    malloc_trim). Why: the count makes and frees a set of words per passage,
    and the C allocator kept about 22 MB of it at 100,000 passages, in each
    serving process (benchmarks/index_and_retrieval.md). No-op without glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def wait_for_word_counts(index: ChunkIndex, timeout: float) -> bool:
    """Wait until the word counts of the newest table version are made (after
    warm_up()). True when they are; False after `timeout` seconds. For
    benchmarks and tests, which measure the steady state."""
    deadline = time.monotonic() + timeout
    while True:
        table = index.dataset(CHUNKS)
        rows = index.passage_rows(table) if table is not None else None
        if rows is None or not rows.uncounted():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def skip_common_words(rows: PassageRows, words: list[str], where: str | None, table_rows: int,
                       sources: list[str] | None) -> None:
    """Keep the answer "not rare" (None) for each query word that the word
    counts show in more than rare_max passages: its look-up would find more
    than rare_max passages, so it needs none. The look-up matches the stem of
    the word, so it finds at least the passages that hold the word itself.
    Why: a look-up costs about 1.6 ms of CPU, and on a large table each query
    word is looked up (the lexical list cannot show a common word).

    `where`: no filter, or the filter of `sources` alone (the MCP server and
    kb web leave out the wiki pages so): the counts are per source. Only for
    an ASCII word: for such a word, the words of the count (runs of re's
    word characters) and those of the full-text index (runs of Unicode
    letters and digits) have the same limits. (A mark of another script
    that touches the word can still make them differ; the count in the
    lexical list has the same limit.)"""
    if rows.words_of is None:
        return
    rare_max = rare_word_max(table_rows)
    kept = rows.word_holders
    for word in words:
        if ((where, word) not in kept and word.isascii() and len(kept) < WORD_CACHE_WORDS
                and rows.least_holders(word, sources) > rare_max):
            kept[(where, word)] = None


def words_to_look_up(rows: PassageRows, held_by: dict[str, int], rare_max: int, where: str | None,
                      lexical: list[tuple[int, float]], texts: LowerTexts) -> list[str]:
    """The query words that may be rare, at most MAX_PROBES of them, in the
    order in which their passages join the candidates."""
    if len(held_by) <= MAX_PROBES and all((where, w) in rows.word_holders for w in held_by):
        # Every word was looked up before on this version. The count
        # below would only leave out words that hold more than rare_max
        # passages, and their stored result is None: the same answer.
        return list(held_by)
    # A word that more than rare_max lexical hits hold is not rare: no
    # look-up needed. (Stemming can hide a hit from this count, never
    # add one.) The look-up of such a word finds more than rare_max
    # passages, or none (a stop word of the index), and both are left
    # out below: the same answer without it. The count reads the text
    # of the hits (in memory).
    lowered = texts.lowered([row_id for row_id, _ in lexical])
    for word in held_by:
        held_by[word] = sum(1 for text in lowered if _holds_word(text, word))
    if len(held_by) <= MAX_PROBES:
        # In the order of the query, as the look-ups that start early:
        # the passages that they add join the candidates in that order.
        return [w for w, n in held_by.items() if n <= rare_max]
    # The words that the fewest lexical hits hold.
    return [w for _, w in sorted((n, w) for w, n in held_by.items() if n <= rare_max)[:MAX_PROBES]]


def _holds_word(text: str, word: str) -> bool:
    r"""True when `word` (word characters only) is a whole word of `text`:
    the test of re's r"\bword\b", without a regular expression. Why: str.find
    skips to each place that holds the letters, where the regular expression
    tries each place of the text; at 10,000 passages the count took 1.5 ms
    per query. A word character is one that str.isalnum() accepts, or "_",
    as re's \w in a str pattern."""
    end = len(word)
    at = text.find(word)
    while at >= 0:
        after = at + end
        if ((at == 0 or not _word_char(text[at - 1]))
                and (after == len(text) or not _word_char(text[after]))):
            return True
        at = text.find(word, at + 1)
    return False


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def indexed_words(query: str) -> list[str]:
    """The query words that the full-text index holds: not a stop word of
    its English filter, not longer than its token limit."""
    return [w for w in TOKEN.findall(query.lower()) if w not in FTS_STOP_WORDS and len(w) <= FTS_MAX_TOKEN]


def query_phrases(query: str) -> list[str]:
    quoted = [" ".join(TOKEN.findall(p.lower())) for p in QUOTED.findall(query)]
    quoted = [p for p in quoted if p]
    if quoted:
        return quoted
    words = TOKEN.findall(query.lower())
    return [" ".join(words)] if 0 < len(words) <= MAX_PHRASE_WORDS else []


def _holds_phrases(text: str, phrases: list[str]) -> bool:
    """True when the words of each phrase follow each other in the text."""
    return PhraseTest(phrases)(text.lower())


class PhraseTest:
    """The phrase test of one search, for the lowered text of each candidate.
    Cheap test first: most passages lack a word, and the longest word is most
    often the one that they lack. The words are split and sorted once per
    search, not once per text: at 100,000 passages the test of about 200
    candidates took 1.4 ms of CPU, now about 0.1 ms."""

    def __init__(self, phrases: list[str]):
        self._phrases = phrases
        self._words = sorted({word for p in phrases for word in p.split(" ")}, key=len, reverse=True)

    def __call__(self, lowered: str) -> bool:
        if not self._phrases:
            return False
        for word in self._words:
            if word not in lowered:
                return False
        return all(_phrase_pattern(p).search(lowered) for p in self._phrases)


@lru_cache(maxsize=1024)
def _phrase_pattern(phrase: str) -> re.Pattern:
    # The phrase's words as whole words, with only non-word characters
    # between them: the same test as joining the text's words (TOKEN) with
    # spaces and looking for the phrase, without splitting the whole text.
    # At 10,000 passages the split cost about 3 ms per query. A phrase that
    # starts or ends with a character of a script without spaces (Chinese,
    # Japanese, Thai...) needs no word boundary there: its words lie inside
    # a run of characters.
    start = "" if _UNSPACED_CHAR.match(phrase[:1]) else r"\b"
    end = "" if _UNSPACED_CHAR.match(phrase[-1:]) else r"\b"
    return re.compile(start + r"\W+".join(map(re.escape, phrase.split(" "))) + end)


_UNSPACED_CHAR = re.compile(f"[{UNSPACED}]")


# --- results -----------------------------------------------------------------
def _content_words(query: str) -> list[str]:
    return [w for w in TOKEN.findall(query.lower()) if w not in STOP_WORDS]


def is_keyword_query(query: str) -> bool:
    """A keyword look-up, not a question (see KEYWORD_QUERY_WORDS)."""
    return len(_content_words(query)) <= KEYWORD_QUERY_WORDS


def keep_rare_in_top(ranked: list[Candidate], chosen: list[Candidate], limit: int,
                     with_keys: Callable[[list[Candidate]], None]) -> list[Candidate]:
    """Put the best passage that holds every rare query word among the first
    RARE_SLOT hits, when it is not there yet. with_keys(): sets the key of
    candidates that have none (the chosen ones have theirs)."""
    best = next((c for c in ranked if c.rare), None)
    if best is None:
        return chosen
    with_keys([best])
    position = next((i for i, c in enumerate(chosen) if c.key == best.key), None)
    if position is not None and position < RARE_SLOT:
        return chosen
    rest = [c for c in chosen if c.key != best.key]
    slot = min(RARE_SLOT - 1, len(rest))
    return (rest[:slot] + [best] + rest[slot:])[:limit]
