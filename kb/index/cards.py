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

CARD_COLUMNS = ("tweet_id", "url", "author", "author_name", "created_at", "text", "lang", "payload", "last_sync")


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


def pack_card(row: dict, index: int) -> dict:
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
    payload = json.loads(row.pop("payload") or "{}")
    for key, value in payload.items():
        row.setdefault(key, value)
    for key in ("created_at", "last_sync"):
        if isinstance(row.get(key), datetime):
            row[key] = row[key].astimezone(timezone.utc).isoformat()
    return row
