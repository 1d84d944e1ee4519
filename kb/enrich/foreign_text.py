"""The chunk texts that wait for an English version, and the run that
translates them and caches each result (the `translations` table).

A chunk is a candidate (FOREIGN_CHUNK_SQL) when:
- its language tag is not English: the chunk's own tag (X's tag of a post,
  the detected language of a transcript), else the bookmark's tag. X puts
  tags for "no language" (und, zxx) and its own marks in the ISO 639
  local-use range qaa-qtz (qme: media links only, qht: hashtags only, qam,
  qct, qst ...): these are not a foreign language; or
- most of its letters are not Latin (a Russian article under an English
  post has no tag of its own).

The cache holds each text hash once: english NULL means the model found it
English already, so it is never sent again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import duckdb

from kb.store.duckdb_store import DuckDBStore
from kb.enrich.translator import TranslateError, Translator
from kb.enrich.waiting_items import ResultWriter
from kb.queries import partition_bookmarks

WRITE_EVERY = 20  # translations per write: an interrupted run loses at most this many
FAILURES_IN_A_ROW = 3  # then the endpoint is taken as down and the run stops

# A condition on `c` (chunks) and `b` (bookmarks): the text has a letter,
# and its language tag is not English, or less than half of its letters are
# Latin. A text of ASCII only (strlen, in bytes, equals length) has only
# Latin letters, so the two regular expressions that count them run only on
# the other texts: the coverage check reads every chunk of the store at each
# sync, and the expressions on every text made it several times slower.
FOREIGN_CHUNK_SQL = r"""(
    regexp_matches(c.text, '\p{L}')
    AND (
        (lower(split_part(coalesce(c.lang, b.lang, ''), '-', 1)) NOT IN ('', 'en', 'und', 'zxx')
         AND NOT regexp_matches(lower(split_part(coalesce(c.lang, b.lang, ''), '-', 1)), '^q[a-t][a-z]$'))
        OR (strlen(c.text) <> length(c.text)
            AND 2 * length(regexp_replace(c.text, '[^\p{Latin}]', '', 'g'))
                < length(regexp_replace(c.text, '[^\p{L}]', '', 'g')))
    )
)"""


def foreign_chunks(conn: duckdb.DuckDBPyConnection, tweet_ids: list[str] | None, skip: set[str]) -> list[tuple]:
    """(text_hash, text, cached, english, batch) of each distinct foreign
    chunk text of these bookmarks (None: of every live bookmark); batch: the
    oldest sync batch of a bookmark that holds it."""
    # The bookmarks and sources first, in a CTE: the regular expressions of
    # FOREIGN_CHUNK_SQL then read only their chunks. As one WHERE, DuckDB ran
    # them on every chunk of the store, for a sync of a few bookmarks.
    return conn.execute(
        f"""WITH c AS (SELECT * FROM chunks WHERE NOT list_contains(?, source)
                        AND (? OR list_contains(?, tweet_id)))
            SELECT c.text_hash, any_value(c.text), bool_or(t.text_hash IS NOT NULL), any_value(t.english),
                   min(b.batch)
            FROM c JOIN bookmarks b ON b.tweet_id = c.tweet_id AND b.removed_at IS NULL
            LEFT JOIN translations t ON t.text_hash = c.text_hash
            WHERE {FOREIGN_CHUNK_SQL}
            GROUP BY c.text_hash ORDER BY c.text_hash""",
        [sorted(skip), tweet_ids is None, tweet_ids or []],
    ).fetchall()


def waiting_texts(conn: duckdb.DuckDBPyConnection, batch: str | None, skip: set[str]) -> list[tuple[str, str, str]]:
    """(text_hash, text, batch) of each foreign chunk text with no cached
    result, of the live bookmarks of `batch` (None: of every batch)."""
    live = None if batch is None else partition_bookmarks(conn, batch)[0]
    return [(text_hash, text, origin) for text_hash, text, cached, _, origin
            in foreign_chunks(conn, live, skip) if not cached]


def waiting_by_batch(conn: duckdb.DuckDBPyConnection, skip: set[str]) -> dict[str, int]:
    """How many foreign chunk texts wait for a translation, per sync batch of
    their live bookmark (the partition whose run translates them)."""
    return dict(conn.execute(
        f"""SELECT b.batch, count(DISTINCT c.text_hash)
            FROM chunks c JOIN bookmarks b ON b.tweet_id = c.tweet_id AND b.removed_at IS NULL
            LEFT JOIN translations t ON t.text_hash = c.text_hash
            WHERE {FOREIGN_CHUNK_SQL} AND NOT list_contains(?, c.source) AND t.text_hash IS NULL
            GROUP BY b.batch""",
        [sorted(skip)],
    ).fetchall())


def translation_coverage(conn: duckdb.DuckDBPyConnection, skip: set[str],
                         batches: list[str] | None = None) -> dict[str, int]:
    """Foreign texts: total, translated, already English, waiting; of the
    given batches (None: of every batch)."""
    rows = [row for row in foreign_chunks(conn, None, skip) if batches is None or row[4] in batches]
    done = [row for row in rows if row[2]]
    return {"foreign_texts": len(rows), "translated": sum(1 for row in done if row[3] is not None),
            "already_english": sum(1 for row in done if row[3] is None), "waiting": len(rows) - len(done)}


@dataclass
class TranslationRun:
    """What one run did: the rows written, the texts that failed
    ("<hash>: <error>"), and why the run stopped early ("" when it did not)."""

    written: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: str = ""


def translate_waiting(duckdb: DuckDBStore, translator: Translator, waiting: list[tuple[str, str, str]],
                      on_failure: Callable[[str, TranslateError], None] = lambda _h, _e: None) -> TranslationRun:
    """Translate the texts of waiting_texts() and cache each result as it
    comes. A fatal error (a wrong key), or FAILURES_IN_A_ROW failures in a
    row, stops the run: the endpoint is down, and each later text would
    fail the same way. What was translated before is stored."""
    model = translator.model_name()
    client = translator.client()
    run = TranslationRun()
    in_a_row = 0
    # The writer keeps what was translated, also when the run stops.
    with ResultWriter(duckdb, "translations", WRITE_EVERY) as writer:
        for text_hash, text, _origin in waiting:
            try:
                english = translator.translate(text, client)
            except TranslateError as exc:
                run.failures.append(f"{text_hash[:12]}: {exc}")
                on_failure(text_hash, exc)
                in_a_row += 1
                if exc.fatal or in_a_row >= FAILURES_IN_A_ROW:
                    run.stop = str(exc)
                    break
                continue
            in_a_row = 0
            writer.add({"text_hash": text_hash, "english": english, "model": model,
                        "translated_at": datetime.now(timezone.utc)})
    run.written = writer.written
    return run
