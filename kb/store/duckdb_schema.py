"""The DuckDB schema, in one module, with its versioned migrations.

Hard-won rule: a schema change must never drop data that costs time or money
to make again. Captions (paid GPU time), transcripts, documents (hours of
fetching), translations, and the Telegram sources and gate results live only
here. An earlier design dropped every table on a version change; that lost
them all. So a change of SCHEMA_VERSION comes with one entry in MIGRATIONS,
and DuckDBStore.ensure_schema applies the entries in order, in one
transaction. A migration may drop and rebuild only a DERIVED table (one that
the normalize stage fills again from the raw files), never a KEPT table.
"""

SCHEMA_VERSION = 5

# version -> the statements that take a file from version - 1 to version.
# Write each statement so that it can run on a file where the table already
# has the change (IF NOT EXISTS): a file made by CREATE TABLE of a later
# release can carry a lower version number.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (  # bookmarks gained article_preview, article_from_quote, retweet_of_id, retweeted_by_handle
        "ALTER TABLE bookmarks ADD COLUMN IF NOT EXISTS article_preview VARCHAR",
        "ALTER TABLE bookmarks ADD COLUMN IF NOT EXISTS article_from_quote BOOLEAN",
        "ALTER TABLE bookmarks ADD COLUMN IF NOT EXISTS retweet_of_id VARCHAR",
        "ALTER TABLE bookmarks ADD COLUMN IF NOT EXISTS retweeted_by_handle VARCHAR",
    ),
    3: (  # the quality gate's answer as it came, kept for audit
        "ALTER TABLE gate_results ADD COLUMN IF NOT EXISTS raw_answer VARCHAR",
    ),
    4: (  # media and links of the author's thread under a bookmark; the new tables
          # folders, folder_bookmarks and thread_posts come from TABLES
        "ALTER TABLE media ADD COLUMN IF NOT EXISTS from_thread BOOLEAN",
        "ALTER TABLE links ADD COLUMN IF NOT EXISTS from_thread BOOLEAN",
    ),
    5: (  # each failed try of the quality gate, with its error
        "ALTER TABLE gate_results ADD COLUMN IF NOT EXISTS errors JSON",
    ),
}

# The tables that nothing can make again for free. A migration must keep their rows.
KEPT_TABLES = ("documents", "captions", "transcripts", "translations", "sources", "gate_results")
# The tables that the normalize and chunks stages fill again from the raw files.
DERIVED_TABLES = ("bookmarks", "authors", "media", "links", "capture_problems", "chunks",
                  "folders", "folder_bookmarks", "thread_posts")

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
            article_preview VARCHAR,            -- X's preview_text of the article
            article_from_quote BOOLEAN,         -- the article is the quoted post's
            retweet_of_id   VARCHAR,            -- the entry is a retweet: content is this post's
            retweeted_by_handle VARCHAR,
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
            from_thread   BOOLEAN,              -- in the author's thread under the post (thread_posts)
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
            from_thread   BOOLEAN,              -- in the author's thread under the post (thread_posts)
            PRIMARY KEY (tweet_id, url_norm)
        )""",
    "capture_problems": """
        CREATE TABLE IF NOT EXISTS capture_problems (
            batch         VARCHAR NOT NULL,
            raw_file      VARCHAR NOT NULL,
            reason        VARCHAR NOT NULL,
            PRIMARY KEY (batch, raw_file, reason)
        )""",
    # Bookmark folders (X Premium), keyed by X's id: a folder that the owner
    # renames keeps its bookmarks, and shows its new name.
    "folders": """
        CREATE TABLE IF NOT EXISTS folders (
            folder_id     VARCHAR PRIMARY KEY,  -- the bookmark_collection id
            name          VARCHAR,              -- as the latest folder list names it
            batch         VARCHAR NOT NULL,
            raw_file      VARCHAR NOT NULL
        )""",
    "folder_bookmarks": """
        CREATE TABLE IF NOT EXISTS folder_bookmarks (
            folder_id     VARCHAR NOT NULL,
            tweet_id      VARCHAR NOT NULL,
            batch         VARCHAR NOT NULL,     -- the batch whose read of the folder holds it
            PRIMARY KEY (folder_id, tweet_id)
        )""",
    # The author's own chain of replies under a bookmarked post (TweetDetail).
    # Replies of other people are never stored.
    "thread_posts": """
        CREATE TABLE IF NOT EXISTS thread_posts (
            tweet_id      VARCHAR NOT NULL,     -- the bookmark
            position      INTEGER NOT NULL,     -- 0: the author's first reply under it
            post_id       VARCHAR NOT NULL,
            url           VARCHAR NOT NULL,
            created_at    TIMESTAMPTZ,
            text          VARCHAR NOT NULL,
            lang          VARCHAR,
            batch         VARCHAR NOT NULL,     -- the batch that holds the TweetDetail answer
            raw_file      VARCHAR NOT NULL,
            PRIMARY KEY (tweet_id, position)
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
        source      VARCHAR NOT NULL,      -- post, thread, quote, article, link, image, video, ...
        ref         VARCHAR NOT NULL,      -- the URL the passage came from
        position    INTEGER NOT NULL,      -- order within (tweet_id, source, ref)
        text        VARCHAR NOT NULL,
        text_hash   VARCHAR NOT NULL,      -- the translation and vector caches key on it
        word_count  INTEGER NOT NULL,
        lang        VARCHAR,
        batch       VARCHAR NOT NULL
    )"""

# One row per web address behind the bookmarks: its main content, or why
# there is none. The owners of a document are not copied here: they are the
# bookmarks whose `links` rows have the same url_norm.
TABLES["documents"] = """
    CREATE TABLE IF NOT EXISTS documents (
        url_norm    VARCHAR PRIMARY KEY,   -- normalize_url(): the key that links.url_norm points to
        url         VARCHAR NOT NULL,      -- the address fetched (after the arXiv /pdf/ -> /abs/ rewrite)
        final_url   VARCHAR,               -- where redirects ended
        kind        VARCHAR NOT NULL,      -- link, article, pdf (video: transcripts)
        source      VARCHAR NOT NULL,      -- content_state, browser, file
        title       VARCHAR,
        html        VARCHAR,               -- the main content as HTML: links kept, images left out
        text        VARCHAR,               -- html_to_text(html): what the chunker reads
        word_count  INTEGER NOT NULL,
        status      VARCHAR NOT NULL,      -- ok, failed
        reason      VARCHAR,               -- failed only: http_<status>, timeout, thin, binary, blocked, error
        detail      VARCHAR,               -- failed only: the error message, for the owner
        batch       VARCHAR NOT NULL,      -- the sync batch that fetched it last
        fetched_at  TIMESTAMPTZ NOT NULL,
        attempts    INTEGER NOT NULL       -- fetches so far; a failure is tried again only on request
    )"""

# One row per Telegram/inbox source (one `sources` partition): what the
# parser made of it and where it stands. Re-materializing a partition
# replaces its row. url_norm and content_hash find duplicates.
TABLES["sources"] = """
    CREATE TABLE IF NOT EXISTS sources (
        item_id       VARCHAR PRIMARY KEY,   -- the inbox item id = the partition key
        type          VARCHAR NOT NULL,      -- web, youtube, pdf, md, text, voice
        origin        VARCHAR NOT NULL,      -- telegram or drop
        chat_id       BIGINT,
        message_id    BIGINT,
        url           VARCHAR,
        url_norm      VARCHAR,               -- normalize_url(url)
        content_hash  VARCHAR,               -- sha256 of the parsed words
        title         VARCHAR,
        parsed_path   VARCHAR,               -- the Markdown file, relative to the wiki folder
        char_count    INTEGER,
        parser        VARCHAR,
        received_at   TIMESTAMPTZ NOT NULL,
        fetched_at    TIMESTAMPTZ,
        status        VARCHAR NOT NULL,      -- retrying, parsed, accepted, rejected, duplicate, failed
        error         VARCHAR,               -- failed only: why, for the owner
        duplicate_of  VARCHAR,               -- duplicate only: the earlier item
        transient_failures INTEGER NOT NULL DEFAULT 0,  -- over the item's whole life; 3 is the limit
        updated_at    TIMESTAMPTZ NOT NULL
    )"""

# The quality gate's verdict on each source (one row per item, replaced on re-run).
TABLES["gate_results"] = """
    CREATE TABLE IF NOT EXISTS gate_results (
        item_id     VARCHAR PRIMARY KEY,
        score       INTEGER,                 -- 0..100; NULL when the gate had no key
        topics      JSON,                    -- up to 6 kebab-case topics
        reason      VARCHAR,
        gate        VARCHAR NOT NULL,        -- scored, skipped-no-key, skipped-errors
        model       VARCHAR,
        attempts    INTEGER NOT NULL,
        threshold   INTEGER NOT NULL,
        decision    VARCHAR NOT NULL,        -- accepted, rejected, duplicate
        overridden  BOOLEAN NOT NULL,        -- /override: accepted whatever the gate said
        gated_at    TIMESTAMPTZ NOT NULL,
        raw_answer  VARCHAR,                 -- the model's answer as it came, for audit
        errors      JSON                     -- each failed try: [{"try": 1, "error": "..."}]
    )"""


# One row per photo (keyed by its URL): a caption and the text in the image,
# or why there is none. A failure is tried again only on request (--retry).
TABLES["captions"] = """
    CREATE TABLE IF NOT EXISTS captions (
        url          VARCHAR PRIMARY KEY,   -- media.url of a photo
        caption      VARCHAR,               -- English, one to three sentences
        ocr_text     VARCHAR,               -- the text in the image, as written; '' when none
        status       VARCHAR NOT NULL,      -- ok, failed
        reason       VARCHAR,               -- failed only: http_<status>, truncated, too_large, not_image, bad_answer, error
        detail       VARCHAR,               -- failed only: the error message, for the owner
        model        VARCHAR,
        batch        VARCHAR NOT NULL,      -- the sync batch of the run that captioned it
        captioned_at TIMESTAMPTZ NOT NULL,
        attempts     INTEGER NOT NULL
    )"""

# One row per video: a document of kind video, keyed by the post's video
# address. One transcript per media_key: a video that several posts show is
# transcribed once. word_count 0 with status ok: no speech (done, never served).
TABLES["transcripts"] = """
    CREATE TABLE IF NOT EXISTS transcripts (
        url           VARCHAR PRIMARY KEY,  -- https://x.com/<handle>/status/<id>/video/<n>
        media_key     VARCHAR NOT NULL,     -- media.media_key
        kind          VARCHAR NOT NULL,     -- video
        video_url     VARCHAR NOT NULL,     -- the MP4 that was read (media.smallest_mp4)
        language      VARCHAR,              -- detected by the model
        language_probability DOUBLE,
        duration_s    DOUBLE,
        text          VARCHAR,              -- one paragraph per minute, each led by [m:ss]
        word_count    INTEGER NOT NULL,
        status        VARCHAR NOT NULL,     -- ok, failed
        reason        VARCHAR,              -- failed only: http_<status>, truncated, too_large, no_language, not_media, error
        detail        VARCHAR,
        model         VARCHAR,
        batch         VARCHAR NOT NULL,
        transcribed_at TIMESTAMPTZ NOT NULL,
        attempts      INTEGER NOT NULL
    )"""

# The translation cache: one row per chunk text. english is NULL when the
# model found the text already English, so it is never asked again.
TABLES["translations"] = """
    CREATE TABLE IF NOT EXISTS translations (
        text_hash     VARCHAR PRIMARY KEY,  -- chunks.text_hash
        english       VARCHAR,              -- NULL: the text is already English
        model         VARCHAR NOT NULL,
        translated_at TIMESTAMPTZ NOT NULL
    )"""
