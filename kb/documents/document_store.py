"""The `documents` table: which addresses wait for a fetch, how the results
go in (in groups, each in a short transaction), and how many addresses have
a usable document."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import datetime, timezone

import duckdb

from kb.documents.outcomes import Outcome, Target
from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.enrich.extract import Reason

# An X Article, by the kind that normalization gave the link or by its path.
IS_X_ARTICLE = "(l.kind = 'article' OR regexp_matches(l.url_norm, '^https://x\\.com/(i/article|[^/]+/article)/'))"
# normalize_url() writes every X host as https://x.com.
IS_X = "regexp_matches(l.url_norm, '^https://x\\.com(/|$)')"

# The addresses that can have a document, one row each. Links to X posts are
# left out (the capture holds the posts); X Articles are kept. The links of
# removed bookmarks are left out. The coverage check uses the same rule.
ELIGIBLE_LINKS = f"""
    SELECT l.url_norm,
           min(l.expanded_url) AS url,
           min(l.batch) AS batch,
           bool_or({IS_X_ARTICLE}) AS is_article,
           any_value(b.article_title) FILTER (WHERE b.article_text <> '') AS article_title,
           any_value(b.article_text) FILTER (WHERE b.article_text <> '') AS article_text
    FROM links l
    LEFT JOIN bookmarks b ON b.tweet_id = l.tweet_id AND l.kind = 'article'
    WHERE NOT EXISTS (SELECT 1 FROM bookmarks r WHERE r.tweet_id = l.tweet_id AND r.removed_at IS NOT NULL)
      {{batch_filter}}
    GROUP BY l.url_norm
    HAVING bool_or({IS_X_ARTICLE}) OR NOT bool_or({IS_X})
"""


def targets_for_batch(conn: duckdb.DuckDBPyConnection, batch: str | None, *, retry: bool) -> list[Target]:
    """The addresses of the batch (None: of every batch) that still need a
    fetch: never fetched, or failed when `retry` is set. Oldest batch first."""
    rows = conn.execute(
        f"""WITH eligible AS ({ELIGIBLE_LINKS.format(batch_filter="AND (? OR l.batch = ?)")})
            SELECT e.url_norm, e.url, e.is_article, e.article_title, e.article_text, coalesce(d.attempts, 0),
                   e.batch
            FROM eligible e LEFT JOIN documents d ON d.url_norm = e.url_norm
            WHERE d.url_norm IS NULL OR (d.status = 'failed' AND ?)
            ORDER BY e.batch, e.url_norm""",
        [batch is None, batch or "", retry],
    ).fetchall()
    return [Target(*row) for row in rows]


def fetchable(targets: list[Target], skip: set[str]) -> list[Target]:
    """The targets of the source kinds that are not excluded: an excluded
    kind is not fetched at all (config.toml `exclude`, or `--no-link` /
    `--no-article` for one run)."""
    if "article" in skip:
        targets = [t for t in targets if not t.is_article]
    if "link" in skip:
        targets = [t for t in targets if t.is_article]
    return targets


def document_coverage(conn: duckdb.DuckDBPyConnection,
                      batches: list[str] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """The addresses that can have a document: (links, usable, failed,
    pending), and the failed ones per reason; of the links of the given
    batches (None: of every batch)."""
    eligible = ELIGIBLE_LINKS.format(batch_filter="AND (? OR list_contains(?, l.batch))")
    which = [batches is None, batches or []]
    total, usable, failed = conn.execute(
        f"""WITH eligible AS ({eligible})
            SELECT count(*), count(*) FILTER (WHERE d.status = 'ok'), count(*) FILTER (WHERE d.status = 'failed')
            FROM eligible e LEFT JOIN documents d ON d.url_norm = e.url_norm""", which
    ).fetchone()
    reasons = dict(conn.execute(
        f"""WITH eligible AS ({eligible})
            SELECT d.reason, count(*) FROM eligible e JOIN documents d ON d.url_norm = e.url_norm
            WHERE d.status = 'failed' GROUP BY d.reason ORDER BY d.reason""", which
    ).fetchall())
    numbers = {"links": total, "usable": usable, "failed": failed, "pending": total - usable - failed}
    return numbers, reasons


def write_outcomes(conn: duckdb.DuckDBPyConnection, outcomes: Iterable[Outcome], batch: str) -> None:
    now = datetime.now(timezone.utc)
    insert_rows(conn, "documents", [o.row(batch, now) for o in outcomes])


# A killed run loses at most this many results, or this many seconds of fetching.
WRITE_EVERY = 20
WRITE_EVERY_S = 60.0


class OutcomeWriter:
    """Writes the outcomes of the fetching threads in groups, each group in
    its own short transaction (see kb/documents/__init__.py). It keeps every
    outcome for the end report, without its text once written."""

    def __init__(self, duckdb: DuckDBStore, batch: str):
        self.duckdb = duckdb
        self.batch = batch
        self.outcomes: list[Outcome] = []
        self.groups_written = 0
        self._pending: list[Outcome] = []
        self._lock = threading.Lock()
        self._since = time.monotonic()

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)
            self._pending.append(outcome)
            if len(self._pending) >= WRITE_EVERY or time.monotonic() - self._since >= WRITE_EVERY_S:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self._since = time.monotonic()
        if not self._pending:
            return
        try:
            with self.duckdb.transaction() as conn:
                write_outcomes(conn, self._pending, self.batch)
        except duckdb.Error:
            self._write_one_by_one()
        for outcome in self._pending:
            outcome.extracted = None  # the text is in DuckDB now; the report needs the summary only
        self._pending = []
        self.groups_written += 1

    def _write_one_by_one(self) -> None:
        """A group that DuckDB refused: each result alone, so that one bad
        row fails only its own address (stored as failed, with the error)."""
        for outcome in self._pending:
            try:
                with self.duckdb.transaction() as conn:
                    write_outcomes(conn, [outcome], self.batch)
            except duckdb.Error as exc:
                outcome.extracted, outcome.reason = None, Reason.ERROR.value
                outcome.detail = f"the result could not be stored: {exc}"[:500]
                with self.duckdb.transaction() as conn:
                    write_outcomes(conn, [outcome], self.batch)
