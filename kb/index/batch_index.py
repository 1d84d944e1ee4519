"""Index one sync batch: read its chunks and bookmark cards from DuckDB,
then embed and write them to LanceDB (index_batch(); the asset
`chunk_index` calls it).

It reads DuckDB in one short connection, then embeds and writes LanceDB
with no DuckDB connection open: embedding is slow, and an open connection
would lock the file for every other process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from kb.store.duckdb_store import DuckDBStore
from kb.index.cards import bookmark_cards
from kb.index.chunking import word_count
from kb.index.client import ChunkIndex
from kb.index.folders import replace_folders, stored_folders
from kb.index.store import CHUNKS, IndexModelMismatch
from kb.queries import partition_bookmarks
from kb.settings import get_settings

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


def chunk_index_rows(conn, tweet_ids: list[str], skip: set[str]) -> list[dict]:
    """The rows of the passages of these bookmarks for ChunkIndex.replace_chunks,
    without the sources in `skip`: the English text of a translated chunk."""
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


def indexed_passages(lance: ChunkIndex, skip: set[str]) -> dict[str, list[str]]:
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


@dataclass
class IndexedBatch:
    """What index_batch() did for one sync batch."""

    live: list[str]  # the bookmarks of the batch that were indexed
    removed: list[str]  # the bookmarks that a full capture marked removed
    rows: int  # the passages of `live`
    written: dict  # the counts of replace_chunks
    folders_written: bool
    maintained: dict  # the report of maintain()
    counts: dict  # the index after the write (ChunkIndex.counts())
    failures: list[tuple[str, str]] = field(default_factory=list)  # (tweet id, error)


def index_batch(store: DuckDBStore, lance: ChunkIndex, embedder, batch: str, skip: set[str],
                warn: Callable[[str], None]) -> IndexedBatch:
    """Write the passages, the cards and the folders of a sync batch to the
    index, and leave out the sources in `skip`. `warn` gets the lines of a
    failed batch and of each failed bookmark."""
    synced_at = datetime.now(timezone.utc)
    with store.connect() as conn:
        # The batch's own bookmarks only: a bookmark of another batch whose
        # passages changed is indexed in a run of its own partition.
        live, removed = partition_bookmarks(conn, batch)
        rows = chunk_index_rows(conn, live, skip)
        cards = bookmark_cards(conn, live, synced_at)
        folders = stored_folders(conn)
    # No DuckDB connection is open from here on.
    deleted = lance.remove_bookmarks(removed)
    if skip:
        deleted += lance.remove_sources(sorted(skip))
    # Bookmarks whose passages are stored already are not written again
    # (most of a sync's top page): see ChunkIndex.replace_chunks.
    written, failures = replace_each_alone_on_failure(lance, live, rows, embedder, warn)
    lance.upsert_bookmark_cards(cards)
    folders_written = replace_folders(lance, folders)
    # With nothing deleted and every row indexed, optimize() has nothing to
    # do, and its compaction would rewrite the whole table.
    maintained = lance.maintain(skip_if_current=not (deleted or written["deleted"]))
    return IndexedBatch(live=live, removed=removed, rows=len(rows), written=written,
                        folders_written=folders_written, maintained=maintained, counts=lance.counts(),
                        failures=failures)


# When this many bookmarks fail one after the other, the fault is not one
# bookmark's (the embedder is down): the step fails, as it did before.
FAILURES_IN_A_ROW = 3


class IndexStopped(RuntimeError):
    """The index stage stopped: a service that every bookmark needs failed."""


def replace_each_alone_on_failure(lance: ChunkIndex, live: list[str], rows: list[dict], embedder,
                                  warn: Callable[[str], None]) -> tuple[dict, list[tuple[str, str]]]:
    """lance.replace_chunks of the batch; when it fails, each bookmark alone,
    so that one bookmark that cannot be embedded or written keeps only itself
    out of the index (with its stored passages). Returns the counts and the
    failed bookmarks as (tweet id, error); `kb index` tries them again."""
    try:
        return lance.replace_chunks(live, rows, embedder), []
    except IndexModelMismatch:
        raise  # the model of the whole index: no bookmark alone can fix it
    except Exception as exc:
        warn(f"chunk_index: the batch failed ({type(exc).__name__}: {exc}); each bookmark alone now")
    by_bookmark: dict[str, list[dict]] = {tweet_id: [] for tweet_id in live}
    for row in rows:
        by_bookmark[row["tweet_id"]].append(row)
    totals = {"written": 0, "embedded": 0, "unchanged_bookmarks": 0, "deleted": 0}
    failures: list[tuple[str, str]] = []
    in_a_row = 0
    for tweet_id, own_rows in by_bookmark.items():
        try:
            counts = lance.replace_chunks([tweet_id], own_rows, embedder)
        except IndexModelMismatch:
            raise
        except Exception as exc:
            failures.append((tweet_id, f"{type(exc).__name__}: {exc}"))
            warn(f"chunk_index: bookmark {tweet_id}: error ({' '.join(failures[-1][1].split())[:200]})")
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
