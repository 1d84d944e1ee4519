"""Bookmarks, media and chunks rows written straight into the real DuckDB
file of a test, for the enrichment stages (captions, transcripts,
translations). The normalize stage is tested on real captures elsewhere;
here the rows only need the columns that the enrichments read."""

from __future__ import annotations

from datetime import datetime, timezone

import dagster as dg

from kb.index.chunk_sources import chunk_rows, SourceText
from kb_assets.partitions import sync_batches
from kb.store.duckdb_store import DuckDBStore, insert_rows

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)


def bookmark(tweet_id: str, batch: str, *, handle: str = "alice", text: str = "a post", lang: str | None = "en",
             quoted_tweet_id: str | None = None, quoted_author_handle: str | None = None,
             removed: bool = False) -> dict:
    return {
        "tweet_id": tweet_id, "batch": batch, "sort_index": tweet_id, "url": f"https://x.com/{handle}/status/{tweet_id}",
        "author_id": f"u-{handle}", "author_handle": handle, "created_at": NOW, "text": text, "lang": lang,
        "is_long": False, "quoted_tweet_id": quoted_tweet_id, "quoted_author_handle": quoted_author_handle,
        "quoted_text": "quoted" if quoted_tweet_id else None, "raw_file": f"{batch}/page-0001.json",
        "captured_at": NOW, "removed_at": NOW if removed else None,
    }


def media(tweet_id: str, key: str, position: int, kind: str, url: str, batch: str, *,
          smallest_mp4: str | None = None, from_quote: bool = False) -> dict:
    return {"tweet_id": tweet_id, "media_key": key, "position": position, "kind": kind, "from_quote": from_quote,
            "url": url, "smallest_mp4": smallest_mp4, "best_mp4": smallest_mp4, "batch": batch}


def write(bookmarks: list[dict], media_rows: list[dict] = (), texts: list[SourceText] = (), batch: str = "") -> None:
    with DuckDBStore.from_settings().transaction() as conn:
        insert_rows(conn, "bookmarks", bookmarks)
        insert_rows(conn, "media", list(media_rows))
        if texts:
            insert_rows(conn, "chunks", chunk_rows(list(texts), batch))


def add_batches(instance: dg.DagsterInstance, *batches: str) -> None:
    instance.add_dynamic_partitions(sync_batches.name, list(batches))


def rows(sql: str, params: list | None = None) -> list[tuple]:
    with DuckDBStore.from_settings().connect() as conn:
        return conn.execute(sql, params or []).fetchall()
