"""What one search asks: the query, its filters and its options, checked
(SearchRequest). kb.index.search.search() makes one from its keyword
arguments; a bad value raises ValueError with the name of the option and
the reason, before the search reads the index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

import numpy as np

from kb.index.fusion import DEFAULT_FUSION, FUSION_METHODS
from kb.index.rerank import RERANK_TOP
from kb.index.store import to_utc

MODES = ("bm25", "dense", "hybrid")
MAX_LIMIT = 100
# The longest query, in characters. A query comes from a stranger too: a page
# in the owner's browser can open `kb web` with ?q= of 60 kB (15,000 words),
# and that query took 38 s of CPU of kb web (7 December 2026). A question of
# a person is far shorter.
MAX_QUERY_CHARS = 1000
# An author, a folder, a bookmark's id or a document's address has fewer
# characters: MCP reads lines of JSON up to 64 MB, and an author of 10 MB
# took 0.6 s and 200 MB in each search (7 December 2026).
MAX_FILTER_CHARS = 1000
# Passages fetched from each retriever before grouping by bookmark. Several
# passages of one bookmark can fill the list, so it is deeper than `limit`.
MIN_DEPTH = 100
MAX_DEPTH = 300
DEPTH_PER_HIT = 2


@dataclass(eq=False)
class SearchRequest:
    """The options of search(). See kb/index/search.py for modes, fusion and
    filters.

    `after` is inclusive and `before` exclusive, on the post date (UTC); a
    date means its midnight UTC. `query_vector` skips the query embedding
    (the evaluation uses it to time the search alone). `rerank`: a deep
    search; a cross-encoder sorts the first kb.index.rerank.RERANK_TOP hits
    again (see kb/index/rerank.py).

    After the checks: `query` has single spaces, `limit` is at most
    MAX_LIMIT, `after` and `before` are UTC datetimes, `sources` holds the
    source kinds in lower case, and `folder` has single spaces (or None)."""

    query: str
    limit: int = 10
    author: str | None = None
    source: str | list[str] | None = None
    after: str | date | datetime | None = None
    before: str | date | datetime | None = None
    mode: str = "hybrid"
    tweet_id: str | None = None
    ref: str | None = None
    folder: str | None = None
    fusion: str = DEFAULT_FUSION
    query_vector: np.ndarray | None = None
    rerank: bool = False
    sources: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.query = check_query(self.query)
        for name in ("author", "folder", "tweet_id", "ref"):
            value = getattr(self, name)
            if isinstance(value, str) and len(value) > MAX_FILTER_CHARS:
                raise ValueError(f"{name} has {len(value):,} characters: a filter has at most {MAX_FILTER_CHARS:,}")
        self.limit = _check_limit(self.limit)
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown: use one of {', '.join(MODES)}")
        if self.fusion not in FUSION_METHODS:
            raise ValueError(f"fusion={self.fusion!r} is unknown: use one of {', '.join(FUSION_METHODS)}")
        self.after = to_utc(self.after, name="after")
        self.before = to_utc(self.before, name="before")
        self.sources = _sources(self.source)
        folder = self.folder
        self.folder = " ".join(folder.split()) if isinstance(folder, str) and folder.strip() else None

    @property
    def filters(self) -> dict:
        """The filters as the response names them."""
        return {"author": self.author, "source": self.source, "after": self.after and self.after.isoformat(),
                "before": self.before and self.before.isoformat(), "tweet_id": self.tweet_id, "ref": self.ref,
                "folder": self.folder}

    @property
    def per_document(self) -> bool:
        """True when the search reads one document: its passages are the hits."""
        return self.tweet_id is not None or self.ref is not None

    @property
    def only_sources(self) -> bool:
        """True when no filter but the source kinds applies: then the rows in
        memory can answer for the filter."""
        return not (self.author or self.after or self.before or self.per_document or self.folder)

    @property
    def depth(self) -> int:
        """Passages that each retriever gives."""
        return min(MAX_DEPTH, max(MIN_DEPTH, self.limit * DEPTH_PER_HIT))

    @property
    def wants_dense(self) -> bool:
        return self.mode in ("dense", "hybrid")

    @property
    def wants_lexical(self) -> bool:
        return self.mode in ("bm25", "hybrid")

    @property
    def picked(self) -> int:
        """Hits chosen before the re-rank: a deep search sorts the first
        RERANK_TOP again, also when fewer are shown."""
        return max(self.limit, RERANK_TOP) if self.rerank else self.limit


def check_query(query: str) -> str:
    """The query with single spaces; ValueError when it is empty or too long.
    Every front end checks its query here (also the wiki's search of the
    files, which does not go through search())."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query is empty: give words to search for")
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query has {len(query):,} characters: a query has at most {MAX_QUERY_CHARS:,}")
    return " ".join(query.split())


def _check_limit(limit: int) -> int:
    try:
        limit = int(limit)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"limit={limit!r} is not a whole number") from exc
    if limit < 1:
        raise ValueError(f"limit={limit} must be 1 or more")
    return min(limit, MAX_LIMIT)


def _sources(source: str | list[str] | None) -> list[str]:
    if source is None or source == "":
        return []
    items = source.split(",") if isinstance(source, str) else list(source)
    return [s.strip().lower() for s in items if s and s.strip()]
