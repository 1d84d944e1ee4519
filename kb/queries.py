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


# Live bookmarks with an enrichment result that their chunks do not hold
# yet: a document, a caption or a transcript that came after the last
# chunks run of the bookmark's batch. The catch-up (kb/index/waiting_work.py)
# starts a run of that batch for them. The refs are the ones that the chunk
# sources of kb/index/chunk_sources.py give.
UNCHUNKED_SQL = """
    WITH results AS (
        SELECT DISTINCT l.tweet_id, d.url_norm AS ref FROM links l JOIN documents d ON d.url_norm = l.url_norm
        WHERE d.status = 'ok' AND d.source <> 'content_state' AND coalesce(d.text, '') <> ''
        UNION
        SELECT m.tweet_id, m.url FROM media m JOIN captions c ON c.url = m.url
        WHERE m.kind = 'photo' AND c.status = 'ok'
          AND coalesce(c.caption, '') || coalesce(c.ocr_text, '') <> ''
        UNION
        SELECT m.tweet_id, t.url FROM media m JOIN transcripts t ON t.media_key = m.media_key
        WHERE m.kind = 'video' AND t.status = 'ok' AND t.word_count > 0
    )
    SELECT DISTINCT b.tweet_id, b.batch FROM results r JOIN bookmarks b ON b.tweet_id = r.tweet_id
    WHERE b.removed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.tweet_id = r.tweet_id AND c.ref = r.ref)
    UNION
    -- a bookmark with no chunk at all: `kb capture` stored it, and no run
    -- of its batch cut it. A post with no text has no chunk after a cut
    -- too: it is not counted, else it would start a run at every sync.
    SELECT b.tweet_id, b.batch FROM bookmarks b
    WHERE b.removed_at IS NULL AND trim(coalesce(b.text, '')) <> ''
      AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.tweet_id = b.tweet_id)
    ORDER BY 2, 1
"""


def unchunked_bookmarks(conn) -> list[tuple[str, str]]:
    """(tweet id, batch) of each live bookmark whose chunks miss one of its
    enrichment results, oldest batch first."""
    return [(tweet_id, batch) for tweet_id, batch in conn.execute(UNCHUNKED_SQL).fetchall()]
