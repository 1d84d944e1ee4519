"""The rows of the DuckDB tables `sources` and `gate_results`: every read
and write of the Telegram inflow's tables, in one place.

`sources` holds one row per inbox item (one `sources` partition): what the
parse found and where the parsed file is. `gate_results` holds the quality
gate's verdict. The assets parsed_sources and gated_sources write them
(kb_assets/telegram/sources.py); source_passages and the wiki stage read
them. Each write is one short transaction, after the slow work (the parse,
the gate call), so that no DuckDB connection stays open during it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from kb.store.duckdb_store import DuckDBStore
from kb.telegram.gate import GateVerdict
from kb.telegram.inbox import InboxItem
from kb.telegram.source_parsers import ParsedSource, content_hash
from kb.urls import normalize_url
from kb.wiki.prompts import GateDecision


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def url_key(url: str | None) -> str | None:
    """The URL as the duplicate check compares it, or None."""
    if not url:
        return None
    try:
        return normalize_url(url)
    except ValueError:
        return None


# --- the parse ------------------------------------------------------------------------


def count_transient_failure(duckdb: DuckDBStore, item: InboxItem, error: str) -> int:
    """Add one transient failure to the item's lifetime count; return the count."""
    now = utc_now()
    with duckdb.transaction() as conn:
        row = conn.execute("SELECT transient_failures FROM sources WHERE item_id = ?", [item.id]).fetchone()
        count = (row[0] if row else 0) + 1
        if row:
            conn.execute("UPDATE sources SET transient_failures = ?, error = ?, updated_at = ? WHERE item_id = ?",
                         [count, error, now, item.id])
        else:
            conn.execute(
                """INSERT INTO sources (item_id, type, origin, chat_id, message_id, url, url_norm, received_at,
                       status, error, transient_failures, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'retrying', ?, ?, ?)""",
                [item.id, item.type, item.origin, item.chat_id, item.message_id, item.url, url_key(item.url),
                 item.received_at, error, count, now])
    return count


def record_failure(duckdb: DuckDBStore, item: InboxItem, error: str) -> None:
    """Mark the item's row `failed` with the error (the row is made when it is missing)."""
    now = utc_now()
    with duckdb.transaction() as conn:
        updated = conn.execute("UPDATE sources SET status = 'failed', error = ?, updated_at = ? WHERE item_id = ? RETURNING 1",
                               [error, now, item.id]).fetchall()
        if not updated:
            conn.execute(
                """INSERT INTO sources (item_id, type, origin, chat_id, message_id, url, url_norm, received_at,
                       status, error, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'failed', ?, ?)""",
                [item.id, item.type, item.origin, item.chat_id, item.message_id, item.url, url_key(item.url),
                 item.received_at, error, now])


def save_parsed_row(duckdb: DuckDBStore, item: InboxItem, parsed: ParsedSource, relative: Path,
                    fetched_at: datetime, transient_failures: int) -> dict:
    """Replace the item's row in `sources` with the parse result."""
    url = parsed.url or item.url
    row = {
        "item_id": item.id, "type": item.type, "origin": item.origin,
        "chat_id": item.chat_id, "message_id": item.message_id,
        "url": url, "url_norm": url_key(url), "content_hash": content_hash(parsed.body),
        "title": parsed.title, "parsed_path": str(relative),
        "char_count": parsed.char_count, "parser": parsed.parser,
        "received_at": item.received_at, "fetched_at": fetched_at,
        "status": "parsed", "error": None, "duplicate_of": None,
        "transient_failures": transient_failures, "updated_at": fetched_at,
    }
    with duckdb.transaction() as conn:
        conn.execute("DELETE FROM sources WHERE item_id = ?", [item.id])
        columns = ", ".join(row)
        conn.execute(f"INSERT INTO sources ({columns}) VALUES ({', '.join('?' for _ in row)})", list(row.values()))
    return row


def transient_failures_so_far(duckdb: DuckDBStore, item_id: str) -> int:
    with duckdb.connect() as conn:
        row = conn.execute("SELECT transient_failures FROM sources WHERE item_id = ?", [item_id]).fetchone()
    return row[0] if row else 0


def reset_transient_failures(duckdb: DuckDBStore, item_id: str) -> None:
    """Give the item its retries again (the owner's /override)."""
    with duckdb.transaction() as conn:
        conn.execute("UPDATE sources SET transient_failures = 0 WHERE item_id = ?", [item_id])


# --- the gate -------------------------------------------------------------------------


class ParsedRow(NamedTuple):
    """What the gate reads of a parsed source."""

    type: str
    url: str | None
    url_norm: str | None
    content_hash: str | None
    parsed_path: str | None
    title: str | None
    status: str


def read_parsed_row(duckdb: DuckDBStore, item_id: str) -> ParsedRow | None:
    with duckdb.connect() as conn:
        row = conn.execute(
            "SELECT type, url, url_norm, content_hash, parsed_path, title, status FROM sources WHERE item_id = ?",
            [item_id],
        ).fetchone()
    return ParsedRow(*row) if row else None


def find_duplicate(duckdb: DuckDBStore, item_id: str, url_norm: str | None, digest: str | None) -> str | None:
    """The earliest other item with the same URL key or the same words that
    the gate has judged already."""
    with duckdb.connect() as conn:
        row = conn.execute(
            """SELECT item_id FROM sources
               WHERE item_id <> ? AND status IN ('accepted', 'rejected')
                 AND ((? IS NOT NULL AND url_norm = ?) OR (? IS NOT NULL AND content_hash = ?))
               ORDER BY received_at, item_id LIMIT 1""",
            [item_id, url_norm, url_norm, digest, digest],
        ).fetchone()
    return row[0] if row else None


def save_gate_result(duckdb: DuckDBStore, item_id: str, *, decision: str, parsed_path: Path,
                     verdict: GateVerdict | None, duplicate_of: str | None, overridden: bool,
                     threshold: int) -> None:
    """Write the gate's decision: the status and path in `sources`, the
    verdict in `gate_results` (a duplicate has no verdict: the gate was not
    called). `threshold`: the threshold to record when there is no verdict."""
    now = utc_now()
    with duckdb.transaction() as conn:
        conn.execute(
            "UPDATE sources SET status = ?, duplicate_of = ?, parsed_path = ?, error = NULL, updated_at = ? WHERE item_id = ?",
            [decision, duplicate_of, str(parsed_path), now, item_id],
        )
        conn.execute("DELETE FROM gate_results WHERE item_id = ?", [item_id])
        conn.execute(
            """INSERT INTO gate_results (item_id, score, topics, reason, gate, model, attempts, threshold,
                   decision, overridden, gated_at, raw_answer, errors)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [item_id,
             verdict.score if verdict else None,
             json.dumps(verdict.topics if verdict else []),
             verdict.reason if verdict else f"duplicate of {duplicate_of}",
             verdict.gate if verdict else "not-called",
             verdict.model if verdict else None,
             verdict.attempts if verdict else 0,
             verdict.threshold if verdict else threshold,
             decision, overridden, now, verdict.raw_answer if verdict else None,
             json.dumps(verdict.errors if verdict else [])],
        )


# --- the readers after the gate ---------------------------------------------------------


class IndexRow(NamedTuple):
    """What the search index needs of a source."""

    status: str
    title: str | None
    url: str | None
    type: str | None
    parsed_path: str | None
    received_at: datetime | str | None


def read_index_row(duckdb: DuckDBStore, item_id: str) -> IndexRow:
    """The source's row; status `unknown` (and no values) when it has none."""
    with duckdb.connect() as conn:
        row = conn.execute(
            "SELECT status, title, url, type, parsed_path, received_at FROM sources WHERE item_id = ?",
            [item_id],
        ).fetchone()
    return IndexRow(*row) if row else IndexRow("unknown", None, None, None, None, None)


def read_gate_decision(duckdb: DuckDBStore, source_id: str) -> GateDecision | None:
    """The gate's decision for one source, or None when the gate has not run.

    The wiki ingests a source whose decision is `accepted`; an /override
    also writes `accepted`.
    """
    with duckdb.connect() as conn:
        row = conn.execute(
            """SELECT g.decision, s.parsed_path, g.topics, s.title, s.type, s.url, g.score
               FROM sources s JOIN gate_results g ON g.item_id = s.item_id
               WHERE s.item_id = ?""",
            [source_id],
        ).fetchone()
    if row is None:
        return None
    decision, parsed_path, topics, title, source_type, url, score = row
    if isinstance(topics, str):
        topics = json.loads(topics or "[]")
    return GateDecision(source_id=source_id, approved=decision == "accepted", parsed_path=parsed_path or "",
                        topics=tuple(topics or ()), decision=str(decision), title=title or "",
                        source_type=source_type or "", url=url or "",
                        score=int(score) if score is not None else None)
