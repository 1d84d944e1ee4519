"""DuckDB read queries that more than one asset group uses. One copy each:
the chunks, the translations and the index read the same rows."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

# sortIndex is a decimal string with no leading zeros, so length first, then
# text, is numeric order. It orders by bookmark time; created_at is post time.
BOOKMARK_ORDER_SQL = "length(sort_index) DESC, sort_index DESC"


@dataclass(frozen=True)
class OwnedDocument:
    tweet_id: str
    url_norm: str
    kind: str
    source: str
    title: str | None
    text: str


def owned_documents(
    conn: duckdb.DuckDBPyConnection, tweet_ids: list[str], *, include_content_state: bool = False
) -> list[OwnedDocument]:
    """The usable documents of the given bookmarks, one row per (bookmark,
    document). A document that many bookmarks link to is owned by each.

    Articles from content_state are left out by default: the chunker reads
    them from `bookmarks.article_text` already."""
    rows = conn.execute(
        """SELECT DISTINCT l.tweet_id, d.url_norm, d.kind, d.source, d.title, d.text
           FROM links l JOIN documents d ON d.url_norm = l.url_norm
           WHERE l.tweet_id IN (SELECT unnest(?)) AND d.status = 'ok'
             AND (? OR d.source <> 'content_state')
           ORDER BY l.tweet_id, d.url_norm""",
        [tweet_ids, include_content_state],
    ).fetchall()
    return [OwnedDocument(*row) for row in rows]


def partition_bookmarks(conn, batch: str) -> tuple[list[str], list[str]]:
    """(live tweet ids of this batch, ids that a full capture marked removed).
    A bookmark of an earlier batch whose thread this batch read is live here
    too: the stages of this batch carry its thread into the index."""
    live = [r[0] for r in conn.execute(
        "SELECT tweet_id FROM bookmarks WHERE removed_at IS NULL AND (batch = ? OR tweet_id IN "
        "(SELECT tweet_id FROM thread_posts WHERE batch = ?)) ORDER BY " + BOOKMARK_ORDER_SQL, [batch, batch]
    ).fetchall()]
    removed = [r[0] for r in conn.execute("SELECT tweet_id FROM bookmarks WHERE removed_at IS NOT NULL").fetchall()]
    return live, removed
