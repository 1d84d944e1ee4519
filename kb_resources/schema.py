"""The DuckDB schema, in one module.

There are no migrations. When SCHEMA_VERSION changes, the store drops every
table and the normalize stage rebuilds them from the raw files, which are
never edited (see DuckDBStore.ensure_schema).
"""

SCHEMA_VERSION = 1

TABLES: dict[str, str] = {
    "bookmarks": """
        CREATE TABLE IF NOT EXISTS bookmarks (
            tweet_id        VARCHAR PRIMARY KEY,
            batch           VARCHAR NOT NULL,   -- the sync batch that last captured it
            sort_index      VARCHAR NOT NULL,   -- X orders bookmarks by this (bookmark time)
            url             VARCHAR NOT NULL,
            author_id       VARCHAR,
            author_handle   VARCHAR,
            created_at      TIMESTAMPTZ,
            text            VARCHAR NOT NULL,   -- note_tweet text when present
            lang            VARCHAR,
            is_long         BOOLEAN NOT NULL,
            quoted_tweet_id VARCHAR,
            quoted_author_handle VARCHAR,
            quoted_author_name   VARCHAR,
            quoted_text     VARCHAR,
            quoted_created_at TIMESTAMPTZ,
            article_id      VARCHAR,
            article_title   VARCHAR,
            article_text    VARCHAR,            -- from content_state when present
            article_url     VARCHAR,
            raw_file        VARCHAR NOT NULL,   -- the raw page it came from
            captured_at     TIMESTAMPTZ NOT NULL,
            removed_at      TIMESTAMPTZ         -- set by a --full capture that no longer sees it
        )""",
    "authors": """
        CREATE TABLE IF NOT EXISTS authors (
            author_id     VARCHAR PRIMARY KEY,
            handle        VARCHAR NOT NULL,
            name          VARCHAR,
            description   VARCHAR,
            batch         VARCHAR NOT NULL
        )""",
    "media": """
        CREATE TABLE IF NOT EXISTS media (
            tweet_id      VARCHAR NOT NULL,     -- the bookmark that shows it
            media_key     VARCHAR NOT NULL,
            position      INTEGER NOT NULL,
            kind          VARCHAR NOT NULL,     -- photo, video, animated_gif
            from_quote    BOOLEAN NOT NULL,
            url           VARCHAR NOT NULL,     -- photo URL or poster image
            alt_text      VARCHAR,
            duration_ms   BIGINT,
            variants      JSON,                 -- every variant X offers
            smallest_mp4  VARCHAR,              -- for transcripts: less to download
            best_mp4      VARCHAR,              -- for viewing
            batch         VARCHAR NOT NULL,
            PRIMARY KEY (tweet_id, media_key)
        )""",
    "links": """
        CREATE TABLE IF NOT EXISTS links (
            tweet_id      VARCHAR NOT NULL,
            url_norm      VARCHAR NOT NULL,     -- normalize_url(expanded_url): the key of a document
            position      INTEGER NOT NULL,
            expanded_url  VARCHAR NOT NULL,
            tco_url       VARCHAR,
            host          VARCHAR NOT NULL,
            kind          VARCHAR NOT NULL,     -- link, card, article
            from_quote    BOOLEAN NOT NULL,
            card_title    VARCHAR,
            card_description VARCHAR,
            batch         VARCHAR NOT NULL,
            PRIMARY KEY (tweet_id, url_norm)
        )""",
    "capture_problems": """
        CREATE TABLE IF NOT EXISTS capture_problems (
            batch         VARCHAR NOT NULL,
            raw_file      VARCHAR NOT NULL,
            reason        VARCHAR NOT NULL,
            PRIMARY KEY (batch, raw_file, reason)
        )""",
    "schema_info": """
        CREATE TABLE IF NOT EXISTS schema_info (
            version INTEGER NOT NULL
        )""",
}

TABLES["chunks"] = """
    CREATE TABLE IF NOT EXISTS chunks (
        chunk_id    VARCHAR PRIMARY KEY,   -- stable: hash of tweet_id, source, ref, position
        tweet_id    VARCHAR NOT NULL,      -- the bookmark that owns it
        source      VARCHAR NOT NULL,      -- post, quote, article, link, image, video, ...
        ref         VARCHAR NOT NULL,      -- the URL the passage came from
        position    INTEGER NOT NULL,      -- order within (tweet_id, source, ref)
        text        VARCHAR NOT NULL,
        text_hash   VARCHAR NOT NULL,      -- the translation and vector caches key on it
        word_count  INTEGER NOT NULL,
        lang        VARCHAR,
        batch       VARCHAR NOT NULL
    )"""
