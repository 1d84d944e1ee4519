"""The chunks table of DuckDB: paragraph-aligned passages of every
bookmark's texts, and the one function that makes the chunks of a sync batch
(chunk_batch(); the asset `chunks` calls it).

Each chunk source is one function that reads one normalized or enriched
table and yields texts. A new enrichment adds one function to CHUNK_SOURCES:
it only adds rows, and no other source changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import duckdb

from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.index.chunking import chunk_text, word_count
from kb.queries import owned_documents, partition_bookmarks


@dataclass(frozen=True)
class SourceText:
    """One text behind a bookmark, before it is cut into chunks."""

    tweet_id: str
    source: str  # post, thread, quote, article, link, image, video, ...
    ref: str  # the URL the text came from
    text: str
    lang: str | None = None


ChunkSource = Callable[[duckdb.DuckDBPyConnection, list[str]], Iterable[SourceText]]


# The normalize stage already put real URLs in place of t.co links.
def post_texts(conn, tweet_ids):
    rows = conn.execute(
        "SELECT tweet_id, url, text, lang FROM bookmarks WHERE tweet_id IN (SELECT unnest(?))", [tweet_ids]
    ).fetchall()
    for tweet_id, url, text, lang in rows:
        yield SourceText(tweet_id, "post", url, text or "", lang)


def thread_texts(conn, tweet_ids):
    """The author's own replies under the post (asset `bookmarks`, table
    thread_posts), one text per reply: the ref is the reply's address, so a
    hit shows which reply matched. Replies of other people are never here."""
    rows = conn.execute(
        """SELECT tweet_id, url, text, lang FROM thread_posts
           WHERE tweet_id IN (SELECT unnest(?)) AND text <> '' ORDER BY tweet_id, position""",
        [tweet_ids],
    ).fetchall()
    for tweet_id, url, text, lang in rows:
        yield SourceText(tweet_id, "thread", url, text, lang)


def quote_texts(conn, tweet_ids):
    rows = conn.execute(
        """SELECT tweet_id, quoted_tweet_id, quoted_author_handle, quoted_text, lang FROM bookmarks
           WHERE tweet_id IN (SELECT unnest(?)) AND quoted_text IS NOT NULL AND quoted_text <> ''""",
        [tweet_ids],
    ).fetchall()
    for tweet_id, quoted_id, handle, text, lang in rows:
        ref = f"https://x.com/{handle or 'i'}/status/{quoted_id}"
        yield SourceText(tweet_id, "quote", ref, text, None)


def article_texts(conn, tweet_ids):
    """X Articles from the GraphQL content_state: the authoritative copy.
    Without content_state, the preview text still says what the article is
    about; the documents stage may fetch the whole article later."""
    rows = conn.execute(
        """SELECT b.tweet_id, coalesce(b.article_url, b.url), b.article_title,
                  coalesce(nullif(b.article_text, ''), b.article_preview) FROM bookmarks b
           WHERE b.tweet_id IN (SELECT unnest(?)) AND coalesce(b.article_text, b.article_preview, '') <> ''
             -- a rendered article (documents stage) replaces the preview
             AND (coalesce(b.article_text, '') <> '' OR NOT EXISTS (
                  SELECT 1 FROM links l JOIN documents d ON d.url_norm = l.url_norm
                  WHERE l.tweet_id = b.tweet_id AND l.kind = 'article' AND d.status = 'ok'))""",
        [tweet_ids],
    ).fetchall()
    for tweet_id, ref, title, text in rows:
        body = f"{title}\n\n{text}" if title else text
        yield SourceText(tweet_id, "article", ref, body, None)


def document_texts(conn, tweet_ids):
    """Pages behind links, and X Articles the browser rendered. A page that
    many bookmarks link to is yielded once per bookmark, so each of them
    finds it and can read it."""
    for doc in owned_documents(conn, tweet_ids):
        source = "article" if doc.kind == "article" else "link"
        body = f"{doc.title}\n\n{doc.text}" if doc.title and not doc.text.startswith(doc.title) else doc.text
        yield SourceText(doc.tweet_id, source, doc.url_norm, body, None)


def image_texts(conn, tweet_ids):
    """Photo captions and the text in each photo (asset `captions`). The
    ref is the photo URL."""
    rows = conn.execute(
        """SELECT m.tweet_id, m.url, c.caption, c.ocr_text FROM media m JOIN captions c ON c.url = m.url
           WHERE m.tweet_id IN (SELECT unnest(?)) AND m.kind = 'photo' AND c.status = 'ok'
           ORDER BY m.tweet_id, m.position""",
        [tweet_ids],
    ).fetchall()
    for tweet_id, url, caption, ocr_text in rows:
        text = "\n\n".join(part for part in (caption, ocr_text) if part and part.strip())
        yield SourceText(tweet_id, "image", url, text, None)


def video_texts(conn, tweet_ids):
    """Video transcripts (asset `transcripts`). The ref is the video's
    address on X. A transcript with no speech (word_count 0) is never served."""
    rows = conn.execute(
        """SELECT DISTINCT ON (m.tweet_id, t.url) m.tweet_id, t.url, t.text, t.language, m.position
           FROM media m JOIN transcripts t ON t.media_key = m.media_key
           WHERE m.tweet_id IN (SELECT unnest(?)) AND m.kind = 'video' AND t.status = 'ok' AND t.word_count > 0
           ORDER BY m.tweet_id, t.url, m.position""",
        [tweet_ids],
    ).fetchall()
    for tweet_id, url, text, language, _position in rows:
        yield SourceText(tweet_id, "video", url, text, language)


CHUNK_SOURCES: dict[str, ChunkSource] = {
    "post": post_texts,
    "thread": thread_texts,
    "quote": quote_texts,
    "article": article_texts,
    "link": document_texts,
    "image": image_texts,
    "video": video_texts,
}


def chunk_id(tweet_id: str, source: str, ref: str, position: int) -> str:
    key = f"{tweet_id}\x1f{source}\x1f{ref}\x1f{position}"
    return hashlib.sha1(key.encode()).hexdigest()[:24]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def chunk_rows(texts: Iterable[SourceText], batch: str,
               failures: dict[str, tuple[str, str]] | None = None) -> list[dict]:
    """The chunk rows of the texts. With `failures`: a text that cannot be
    cut is named there ({tweet_id: (item, "<error type>: <message>")}), and
    every row of its bookmark is left out, so the bookmark keeps its stored
    chunks. One bad text must not stop the index of its whole batch."""
    rows = []
    for item in texts:
        try:
            rows += _item_rows(item, batch)
        except Exception as exc:
            if failures is None:
                raise
            failures.setdefault(item.tweet_id, (f"{item.source} {item.ref or item.tweet_id}",
                                                f"{type(exc).__name__}: {exc}"))
    if failures:
        rows = [row for row in rows if row["tweet_id"] not in failures]
    return rows


def _item_rows(item: SourceText, batch: str) -> list[dict]:
    return [{
        "chunk_id": chunk_id(item.tweet_id, item.source, item.ref, position),
        "tweet_id": item.tweet_id,
        "source": item.source,
        "ref": item.ref,
        "position": position,
        "text": passage,
        "text_hash": text_hash(passage),
        "word_count": word_count(passage),
        "lang": item.lang,
        "batch": batch,
    } for position, passage in enumerate(chunk_text(item.text))]


@dataclass
class ChunkedBatch:
    """What chunk_batch() did for one sync batch."""

    live: list[str]  # the bookmarks of the batch whose chunks were made
    removed: list[str]  # the bookmarks that a full capture marked removed
    rows: list[dict]  # the chunk rows written
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # {tweet_id: (item, error)}


def chunk_batch(store: DuckDBStore, batch: str) -> ChunkedBatch:
    """Cut the texts of a sync batch's bookmarks into chunks and replace
    their rows in the chunks table.

    Every source is cut, also an excluded one: the chunks keep it, and the
    index (chunk_index) leaves it out. So a source that one run skips
    (`--no-image`), or that the owner takes out of `exclude`, comes back
    at the next run from these rows, with no fetch and no model again."""
    with store.connect() as conn:
        # The batch's own bookmarks only: the new results of another batch
        # go into its chunks in a run of its own partition.
        live, removed = partition_bookmarks(conn, batch)
        texts = [t for source in CHUNK_SOURCES.values() for t in source(conn, live)]
    # The cut runs with no connection open: the writer lock is for the write only.
    failures: dict[str, tuple[str, str]] = {}
    rows = chunk_rows(texts, batch, failures)
    with store.transaction() as conn:
        # Replace the partition's rows: re-materializing never duplicates. A
        # bookmark whose text failed keeps its stored chunks.
        conn.execute("DELETE FROM chunks WHERE tweet_id IN (SELECT unnest(?))",
                     [[t for t in live + removed if t not in failures]])
        insert_rows(conn, "chunks", rows)
    return ChunkedBatch(live=live, removed=removed, rows=rows, failures=failures)
