"""What a bookmark card holds: one definition for the three places that
handle it. The chunk_index asset builds cards from DuckDB (bookmark_cards()),
the index packs them into the `bookmarks` table (pack_card()), and the
serving side unpacks and serves them (unpack_card(), served_card()).
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime, timezone

import pyarrow as pa

from kb.index.store import to_utc

# The columns of a card in the `bookmarks` table. Every other field goes
# into `payload` (JSON), and unpack_card() puts it back at the top level.
CARD_COLUMNS = ("tweet_id", "url", "author", "author_name", "created_at", "text", "lang", "payload", "last_sync")
# The payload of a bookmark's card: the quoted post, the X Article, the
# links, the media and the author's own replies under the post (`thread`).
# No document bodies: get_bookmark must stay cheap and bounded.
QUOTED_FIELDS = ("tweet_id", "author", "author_name", "text")
ARTICLE_FIELDS = ("title", "url")
LINK_FIELDS = ("url", "kind", "from_quote", "title")
MEDIA_FIELDS = ("kind", "url", "alt_text", "video_url", "from_quote")
THREAD_FIELDS = ("url", "text", "created_at")
# The fields of a card that get_bookmark serves as they are, in this order.
SERVED_FIELDS = ("tweet_id", "url", "author", "author_name", "created_at", "lang", "text", "quoted", "article",
                 "links")


BOOKMARKS_SCHEMA = pa.schema([
    ("tweet_id", pa.string()),
    ("url", pa.string()),
    ("author", pa.string()),
    ("author_name", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("text", pa.string()),
    ("lang", pa.string()),
    ("payload", pa.string()),  # JSON: quoted post, links, media, article, and any other field
    ("last_sync", pa.timestamp("us", tz="UTC")),
])


# The SQL of one bookmark's card: the post and its author's name, the quoted
# post and the X Article. The lists come from LIST_QUERIES, in order.
CARD_QUERY = """
    SELECT b.tweet_id, b.url, b.author_handle, a.name, b.created_at, b.text, b.lang,
           b.quoted_tweet_id, b.quoted_author_handle, b.quoted_author_name, b.quoted_text,
           b.article_title, b.article_url
    FROM bookmarks b LEFT JOIN authors a ON a.author_id = b.author_id
    WHERE b.tweet_id IN (SELECT unnest(?)) AND b.removed_at IS NULL
"""
# The columns of each list of the payload, in the order of its *_FIELDS.
LIST_QUERIES = {
    "links": ("SELECT tweet_id, expanded_url, kind, from_quote, card_title FROM links "
              "WHERE tweet_id IN (SELECT unnest(?)) ORDER BY position", LINK_FIELDS),
    "media": ("SELECT tweet_id, kind, url, alt_text, best_mp4, from_quote FROM media "
              "WHERE tweet_id IN (SELECT unnest(?)) ORDER BY position", MEDIA_FIELDS),
    "thread": ("SELECT tweet_id, url, text, created_at FROM thread_posts "
               "WHERE tweet_id IN (SELECT unnest(?)) ORDER BY position", THREAD_FIELDS),
}


def bookmark_cards(conn, tweet_ids: list[str], synced_at: datetime) -> list[dict]:
    """The cards of these live bookmarks, read from DuckDB: what get_bookmark
    answers with. Cheap and bounded, no document bodies."""
    bookmarks = conn.execute(CARD_QUERY, [tweet_ids]).fetchall()
    lists = {name: _grouped(conn, sql, tweet_ids) for name, (sql, _fields) in LIST_QUERIES.items()}
    cards = []
    for (tweet_id, url, handle, name, created_at, text, lang, q_id, q_handle, q_name, q_text,
         article_title, article_url) in bookmarks:
        quoted = dict(zip(QUOTED_FIELDS, (q_id, q_handle, q_name, q_text))) if q_id else None
        article = dict(zip(ARTICLE_FIELDS, (article_title, article_url))) if article_title else None
        payload = {"quoted": quoted, "article": article}
        for list_name, (_sql, fields) in LIST_QUERIES.items():
            payload[list_name] = [dict(zip(fields, row)) for row in lists[list_name].get(tweet_id, [])]
        cards.append({
            "tweet_id": tweet_id, "url": url, "author": handle or "", "author_name": name or "",
            "created_at": created_at, "text": text or "", "lang": lang or "",
            "payload": json.dumps(payload, default=str),
            "last_sync": synced_at,
        })
    return cards


def _grouped(conn, sql: str, tweet_ids: list[str]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for row in conn.execute(sql, [tweet_ids]).fetchall():
        out.setdefault(row[0], []).append(row[1:])
    return out


def served_card(card: dict) -> dict:
    """The fields of an unpacked card (unpack_card()) that get_bookmark
    serves as they are: the missing ones empty, `links` a list."""
    served = {name: card.get(name, "") for name in SERVED_FIELDS}
    served["tweet_id"] = card["tweet_id"]
    served["created_at"] = card.get("created_at")
    served["quoted"], served["article"] = card.get("quoted"), card.get("article")
    served["links"] = card.get("links") or []
    return served


def pack_card(row: dict, index: int) -> dict:
    """One card as a row of the `bookmarks` table: the CARD_COLUMNS, and
    every other field in the JSON payload. A card without a tweet_id or with
    a payload that is not JSON is refused with its index or id."""
    tweet_id = row.get("tweet_id")
    if not tweet_id:
        raise ValueError(f"bookmark card {index} has no tweet_id")
    payload: dict = {}
    if row.get("payload"):
        raw = row["payload"]
        try:
            payload = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bookmark card {tweet_id}: payload is not JSON ({exc})") from exc
    for key, value in row.items():
        if key not in CARD_COLUMNS:
            payload[key] = value
    return {
        "tweet_id": str(tweet_id),
        "url": row.get("url") or "",
        "author": (row.get("author") or "").lstrip("@"),
        "author_name": row.get("author_name") or "",
        "created_at": to_utc(row.get("created_at"), name=f"created_at of bookmark {tweet_id}"),
        "text": row.get("text") or "",
        "lang": row.get("lang") or "",
        "payload": json.dumps(payload, default=_json_default, ensure_ascii=False),
        "last_sync": to_utc(row.get("last_sync"), name=f"last_sync of bookmark {tweet_id}"),
    }


def _json_default(value):
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def unpack_card(row: dict) -> dict:
    """A row of the `bookmarks` table as a card: the payload fields at the
    top level, the times as ISO text."""
    payload = json.loads(row.pop("payload") or "{}")
    for key, value in payload.items():
        row.setdefault(key, value)
    for key in ("created_at", "last_sync"):
        if isinstance(row.get(key), datetime):
            row[key] = row[key].astimezone(timezone.utc).isoformat()
    return row
