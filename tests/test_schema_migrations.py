"""A schema change keeps the data that costs time or money to make again:
captions, transcripts, documents, translations, sources and gate results."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pytest

from kb.store.duckdb_schema import DERIVED_TABLES, KEPT_TABLES, MIGRATIONS, SCHEMA_VERSION, TABLES
from kb.store.duckdb_store import DuckDBStore, SchemaError, ensure_schema, insert_rows

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

ROWS = {
    "documents": {"url_norm": "https://a.example/x", "url": "https://a.example/x", "kind": "link",
                  "source": "browser", "title": "A", "html": "<p>hours of fetching</p>",
                  "text": "hours of fetching", "word_count": 3, "status": "ok", "batch": "b1",
                  "fetched_at": NOW, "attempts": 1},
    "captions": {"url": "https://pbs.example/1.jpg", "caption": "A cat on a desk.", "ocr_text": "",
                 "status": "ok", "model": "qwen", "batch": "b1", "captioned_at": NOW, "attempts": 1},
    "transcripts": {"url": "https://x.com/a/status/1/video/1", "media_key": "7_1", "kind": "video",
                    "video_url": "https://video.example/1.mp4", "language": "en", "text": "[0:00] hello",
                    "word_count": 1, "status": "ok", "batch": "b1", "transcribed_at": NOW, "attempts": 1},
    "translations": {"text_hash": "h1", "english": "Hello.", "model": "llama", "translated_at": NOW},
    "sources": {"item_id": "i1", "type": "web", "origin": "telegram", "received_at": NOW,
                "status": "accepted", "updated_at": NOW},
    "gate_results": {"item_id": "i1", "score": 80, "topics": '["rag"]', "reason": "good", "gate": "scored",
                     "attempts": 1, "threshold": 60, "decision": "accepted", "overridden": False,
                     "gated_at": NOW},
    "bookmarks": {"tweet_id": "1", "batch": "b1", "sort_index": "9", "url": "https://x.com/a/status/1",
                  "text": "a post", "is_long": False, "raw_file": "raw/x/b1/page-0001.json",
                  "captured_at": NOW},
}
V2_BOOKMARK_COLUMNS = ("article_preview", "article_from_quote", "retweet_of_id", "retweeted_by_handle")


def _dump(conn: duckdb.DuckDBPyConnection, table: str, skip: tuple[str, ...] = ()) -> list[tuple]:
    columns = [row[0] for row in conn.execute(f"DESCRIBE {table}").fetchall() if row[0] not in skip]
    return conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY ALL").fetchall()


def test_every_table_is_kept_or_derived():
    assert set(KEPT_TABLES) | set(DERIVED_TABLES) | {"schema_info"} == set(TABLES)
    assert not set(KEPT_TABLES) & set(DERIVED_TABLES)
    # Each version after the first has its migration.
    assert set(MIGRATIONS) == set(range(2, SCHEMA_VERSION + 1))


def test_a_version_bump_keeps_every_row(tmp_path):
    store = DuckDBStore(path=str(tmp_path / "kb.duckdb"))
    with store.transaction() as conn:
        for table, row in ROWS.items():
            insert_rows(conn, table, [row])
        before = {table: _dump(conn, table, V2_BOOKMARK_COLUMNS) for table in ROWS}
        # Make the file a version-1 file, as an owner's older store is.
        for column in V2_BOOKMARK_COLUMNS:
            conn.execute(f"ALTER TABLE bookmarks DROP COLUMN {column}")
        conn.execute("UPDATE schema_info SET version = 1")

    # The real migrations bring it to the current version.
    with store.connect() as conn:
        assert conn.execute("SELECT version FROM schema_info").fetchall() == [(SCHEMA_VERSION,)]
        assert {table: _dump(conn, table, V2_BOOKMARK_COLUMNS) for table in ROWS} == before
        columns = {row[0] for row in conn.execute("DESCRIBE bookmarks").fetchall()}
        assert set(V2_BOOKMARK_COLUMNS) <= columns

        # A next version: a new column on a kept table and a rebuilt derived table.
        bump = SCHEMA_VERSION + 1
        migrations = {**MIGRATIONS, bump: ("ALTER TABLE captions ADD COLUMN IF NOT EXISTS width INTEGER",
                                           "DROP TABLE chunks", TABLES["chunks"])}
        assert ensure_schema(conn, version=bump, migrations=migrations) == [bump]
        assert {table: _dump(conn, table, V2_BOOKMARK_COLUMNS + ("width",)) for table in ROWS} == before
        assert conn.execute("SELECT version FROM schema_info").fetchall() == [(bump,)]

        # A migration that fails leaves the version and every row as they were.
        broken = {**migrations, bump + 1: ("ALTER TABLE captions ADD COLUMN height INTEGER",
                                           "ALTER TABLE no_such_table ADD COLUMN x INTEGER")}
        with pytest.raises(SchemaError, match=f"(?s)version {bump + 1} failed .*no_such_table.*keeps version {bump}"):
            ensure_schema(conn, version=bump + 1, migrations=broken)
        assert conn.execute("SELECT version FROM schema_info").fetchall() == [(bump,)]
        assert "height" not in {row[0] for row in conn.execute("DESCRIBE captions").fetchall()}
        assert {table: _dump(conn, table, V2_BOOKMARK_COLUMNS + ("width",)) for table in ROWS} == before

    # This kb's version is older than the file's: a clear error, nothing touched.
    with pytest.raises(SchemaError, match=f"schema version {bump}, but this kb knows version {SCHEMA_VERSION}"):
        with store.connect():
            pass
