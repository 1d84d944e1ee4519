"""Asset `chunk_index`: the LanceDB serving index of one sync batch.

It reads the chunks and bookmark facts from DuckDB in one short connection,
then embeds and writes LanceDB with no DuckDB connection open: embedding is
slow, and an open connection would lock the file for every other process.
"""


import json
from datetime import datetime, timezone

import dagster as dg

from kb.index.folders import folder_rows, replace_folders
from kb.index.chunking import word_count
from kb.queries import partition_bookmarks
from kb_assets.run_choices import excluded_in_run
from kb_assets.partitions import sync_batches
from kb.index.store import CHUNKS, IndexModelMismatch
from kb.settings import get_settings
from kb_assets.enrich.enrichment import failure_line, failure_list, from_batches
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource

# A translated chunk is indexed in English (the full-text index stems
# English, and the owner searches in English); the original stays in
# source_text. english is NULL when the text was English already.
CHUNK_QUERY = """
    SELECT c.chunk_id, c.tweet_id, b.url, b.author_handle AS author, b.created_at, c.source, c.ref,
           c.position, coalesce(t.english, c.text) AS text,
           CASE WHEN t.english IS NULL THEN '' ELSE c.text END AS source_text,
           c.word_count, coalesce(c.lang, b.lang) AS lang
    FROM chunks c JOIN bookmarks b USING (tweet_id)
    LEFT JOIN translations t ON t.text_hash = c.text_hash AND ?
    WHERE c.tweet_id IN (SELECT unnest(?)) AND b.removed_at IS NULL
    ORDER BY c.tweet_id, c.source, c.ref, c.position
"""


def use_translations() -> bool:
    """False when the owner set `translate = false`: then the index shows
    the original texts, also where a translation was made before."""
    return get_settings().owner_config().get("translate", True) is not False


def _chunk_rows(conn, tweet_ids: list[str], skip: set[str]) -> list[dict]:
    cursor = conn.execute(CHUNK_QUERY, [use_translations(), tweet_ids])
    names = [d[0] for d in cursor.description]
    rows = []
    for values in cursor.fetchall():
        row = dict(zip(names, values))
        if row["source"] in skip:
            continue
        row["author"] = row["author"] or ""
        row["lang"] = row["lang"] or ""
        if row["source_text"]:
            row["word_count"] = word_count(row["text"])  # the words of the English text
        rows.append(row)
    return rows


# Each live bookmark's passages as the index must hold them: the chunk ids
# of the sources that the run keeps, each marked "+" when the index shows
# its translation.
EXPECTED_PASSAGES_SQL = """
    SELECT c.tweet_id, any_value(b.batch),
           list(c.chunk_id || CASE WHEN ? AND t.english IS NOT NULL THEN '+' ELSE '' END ORDER BY c.chunk_id)
    FROM chunks c JOIN bookmarks b USING (tweet_id)
    LEFT JOIN translations t ON t.text_hash = c.text_hash
    WHERE b.removed_at IS NULL AND NOT list_contains(?, c.source)
    GROUP BY c.tweet_id
"""


def indexed_passages(lance, skip: set[str]) -> dict[str, list[str]]:
    """Each bookmark's passages in the index: chunk ids, each marked "+"
    when the index holds its translation. A projection of ids and a flag,
    not the texts; read before the DuckDB connection opens (an open
    connection locks the file for every other process)."""
    dataset = lance.dataset(CHUNKS)
    stored: dict[str, list[str]] = {}
    if dataset is None:
        return stored
    table = dataset.to_table(columns={"tweet_id": "tweet_id", "chunk_id": "chunk_id", "source": "source",
                                      "translated": "source_text <> ''"})
    for tweet_id, chunk, source, translated in zip(*(table.column(n).to_pylist() for n in table.column_names)):
        # The passages of a skipped source leave in this run (remove_sources): not a difference.
        if source not in skip:
            stored.setdefault(tweet_id, []).append(chunk + ("+" if translated else ""))
    return stored


def unindexed_bookmarks(conn, stored: dict[str, list[str]], skip: set[str]) -> list[tuple[str, str]]:
    """(tweet id, batch) of each live bookmark whose passages in the index
    (`stored`, indexed_passages) are not its chunks of today, of any batch:
    a bookmark of an earlier batch that got a document, a caption, a
    transcript or a translation in this run; a source that the last run
    skipped (`--no-image`) or that the owner took out of `exclude`; a
    bookmark that could not be embedded."""
    expected = conn.execute(EXPECTED_PASSAGES_SQL, [use_translations(), sorted(skip)]).fetchall()
    return [(tweet_id, batch) for tweet_id, batch, ids in sorted(expected, key=lambda row: (row[1], row[0]))
            if sorted(stored.get(tweet_id, [])) != ids]


def _bookmark_cards(conn, tweet_ids: list[str], synced_at: datetime) -> list[dict]:
    """What get_bookmark answers with: cheap and bounded, no document bodies."""
    cards = []
    bookmarks = conn.execute(
        """SELECT b.tweet_id, b.url, b.author_handle, a.name, b.created_at, b.text, b.lang,
                  b.quoted_tweet_id, b.quoted_author_handle, b.quoted_author_name, b.quoted_text,
                  b.article_title, b.article_url
           FROM bookmarks b LEFT JOIN authors a ON a.author_id = b.author_id
           WHERE b.tweet_id IN (SELECT unnest(?)) AND b.removed_at IS NULL""",
        [tweet_ids],
    ).fetchall()
    links = _grouped(conn, "SELECT tweet_id, expanded_url, kind, from_quote, card_title FROM links "
                     "WHERE tweet_id IN (SELECT unnest(?)) ORDER BY position", tweet_ids)
    thread = _grouped(conn, "SELECT tweet_id, url, text, created_at FROM thread_posts "
                      "WHERE tweet_id IN (SELECT unnest(?)) ORDER BY position", tweet_ids)
    media = _grouped(conn, "SELECT tweet_id, kind, url, alt_text, best_mp4, from_quote FROM media "
                     "WHERE tweet_id IN (SELECT unnest(?)) ORDER BY position", tweet_ids)
    for (tweet_id, url, handle, name, created_at, text, lang, q_id, q_handle, q_name, q_text,
         article_title, article_url) in bookmarks:
        quoted = {"tweet_id": q_id, "author": q_handle, "author_name": q_name, "text": q_text} if q_id else None
        article = {"title": article_title, "url": article_url} if article_title else None
        cards.append({
            "tweet_id": tweet_id, "url": url, "author": handle or "", "author_name": name or "",
            "created_at": created_at, "text": text or "", "lang": lang or "",
            "payload": json.dumps({
                "quoted": quoted, "article": article,
                "links": [dict(zip(("url", "kind", "from_quote", "title"), row)) for row in links.get(tweet_id, [])],
                "media": [dict(zip(("kind", "url", "alt_text", "video_url", "from_quote"), row))
                          for row in media.get(tweet_id, [])],
                # The author's own replies under the post, in order.
                "thread": [dict(zip(("url", "text", "created_at"), row)) for row in thread.get(tweet_id, [])],
            }, default=str),
            "last_sync": synced_at,
        })
    return cards


def _folders(conn) -> list[dict]:
    """Every folder and its live bookmarks, for the whole folders table of the index."""
    folders = conn.execute("SELECT folder_id, name FROM folders").fetchall()
    members = conn.execute("""SELECT fb.folder_id, fb.tweet_id FROM folder_bookmarks fb
                              JOIN bookmarks b USING (tweet_id) WHERE b.removed_at IS NULL""").fetchall()
    return folder_rows(folders, members)


def _grouped(conn, sql: str, tweet_ids: list[str]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for row in conn.execute(sql, [tweet_ids]).fetchall():
        out.setdefault(row[0], []).append(row[1:])
    return out


@dg.asset(
    partitions_def=sync_batches,
    deps=["chunks", "translations", "bookmark_folders"],
    group_name="index",
    description="LanceDB index of the batch's chunks: vectors and a full-text index, plus bookmark cards and "
                "the bookmarks of each folder.",
)
def chunk_index(
    context: dg.AssetExecutionContext, duckdb: DuckDBResource, embedder: EmbedderResource, lance: ChunkIndexResource
) -> dg.MaterializeResult:
    duckdb, embedder, lance = duckdb.get_client(), embedder.get_client(), lance.get_client()
    batch = context.partition_key
    skip = excluded_in_run(context)
    synced_at = datetime.now(timezone.utc)
    stored = indexed_passages(lance, skip)
    with duckdb.connect() as conn:
        live, removed = partition_bookmarks(conn, batch)
        own = set(live)
        others = [(tweet_id, origin) for tweet_id, origin in unindexed_bookmarks(conn, stored, skip)
                  if tweet_id not in own]
        live = live + [tweet_id for tweet_id, _ in others]
        rows = _chunk_rows(conn, live, skip)
        cards = _bookmark_cards(conn, live, synced_at)
        folders = _folders(conn)
    # No DuckDB connection is open from here on.
    deleted = lance.remove_bookmarks(removed)
    if skip:
        deleted += lance.remove_sources(sorted(skip))
    # Bookmarks whose passages are stored already are not written again
    # (most of a sync's top page): see ChunkIndex.replace_chunks.
    written, failures = replace_each_alone_on_failure(context, lance, live, rows, embedder)
    lance.upsert_bookmark_cards(cards)
    folders_written = replace_folders(lance, folders)
    # With nothing deleted and every row indexed, optimize() has nothing to
    # do, and its compaction would rewrite the whole table.
    maintained = lance.maintain(skip_if_current=not (deleted or written["deleted"]))
    counts = lance.counts()
    return dg.MaterializeResult(metadata={
        "bookmarks": len(live),
        "from_batches": from_batches([batch] * (len(live) - len(others)) + [origin for _, origin in others]),
        "chunks": len(rows),
        "chunks_written": written["written"],
        "chunks_embedded": written["embedded"],
        "unchanged_bookmarks": written["unchanged_bookmarks"],
        "optimize": maintained.get("optimize", "done"),
        "removed_bookmarks": len(removed),
        "folders_written": folders_written,
        "index_chunks": counts.get("chunks", 0),
        "model": str(counts.get("model", "")),
        "failures": failure_list(failures),
    })


# When this many bookmarks fail one after the other, the fault is not one
# bookmark's (the embedder is down): the step fails, as it did before.
FAILURES_IN_A_ROW = 3


class IndexStopped(RuntimeError):
    """The index stage stopped: a service that every bookmark needs failed."""


def replace_each_alone_on_failure(context, lance, live: list[str], rows: list[dict],
                                  embedder) -> tuple[dict, list[str]]:
    """lance.replace_chunks of the batch; when it fails, each bookmark alone,
    so that one bookmark that cannot be embedded or written keeps only itself
    out of the index (with its stored passages). Returns the counts and the
    failed bookmarks ("<tweet id>: <reason>"); `kb index` tries them again."""
    try:
        return lance.replace_chunks(live, rows, embedder), []
    except IndexModelMismatch:
        raise  # the model of the whole index: no bookmark alone can fix it
    except Exception as exc:
        context.log.warning(f"chunk_index: the batch failed ({type(exc).__name__}: {exc}); each bookmark alone now")
    by_bookmark: dict[str, list[dict]] = {tweet_id: [] for tweet_id in live}
    for row in rows:
        by_bookmark[row["tweet_id"]].append(row)
    totals = {"written": 0, "embedded": 0, "unchanged_bookmarks": 0, "deleted": 0}
    failures: list[str] = []
    in_a_row = 0
    for tweet_id, own_rows in by_bookmark.items():
        try:
            counts = lance.replace_chunks([tweet_id], own_rows, embedder)
        except IndexModelMismatch:
            raise
        except Exception as exc:
            failures.append(failure_line(tweet_id, "error", f"{type(exc).__name__}: {exc}"))
            context.log.warning(f"chunk_index: bookmark {failures[-1]}")
            in_a_row += 1
            if in_a_row >= FAILURES_IN_A_ROW and in_a_row == len(failures):
                # The first ones all failed: the fault is not one bookmark's
                # (the embedder, for example Ollama, or the index store is
                # down). The stage fails, and its error names how many wait.
                raise IndexStopped(f"{len(live)} bookmarks wait for the index: the first {in_a_row} failed "
                                   f"alike ({type(exc).__name__}: {exc}). The next sync or `kb index` "
                                   "indexes them.") from exc
            continue
        in_a_row = 0
        for key in totals:
            totals[key] += counts.get(key, 0)
    return totals, failures
