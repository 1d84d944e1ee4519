"""Normalize, the tables' rules: raw X Bookmarks pages of one sync batch -> DuckDB tables
`bookmarks`, `authors`, `media`, `links`; the batch's folder answers ->
`folders`, `folder_bookmarks`; its TweetDetail answers -> `thread_posts`.

The raw pages are the truth; these tables are rebuilt from them at any time.
One normalize of a sync batch (normalize_batch(); the assets
`normalized_bookmarks` in kb_assets/x/bookmarks.py call it):
 1. reads and parses every raw page of the batch, with no DuckDB connection
    open (parsing can take seconds; the DuckDB file allows one writer;
    kb/x/batch_rows.py);
 2. in ONE transaction, replaces the rows of the batch and the rows of every
    post that the batch holds. So a re-run never makes duplicates, and a post
    that several batches hold has one row: the later materialization wins;
 3. after a capture with full=True and complete=True, sets removed_at on each
    bookmark that the capture did not see. Nothing is deleted, and a bookmark
    that a capture sees again gets removed_at cleared.

A page that is not JSON or not of the Bookmarks shape stays on disk as it
came. It is recorded in `capture_problems` and named in the metadata, and
the other pages of the batch still normalize.

Folders and threads, with the reason for each rule:
- A folder is keyed by X's id, so a rename keeps its bookmarks. The latest
  folder list gives the names; a folder that it no longer names is gone,
  with its bookmarks' folder rows.
- A folder read to its end (manifest.folders_done) replaces the folder's
  bookmarks; a read that was cut off only adds. Only a whole folder shows
  which posts left it.
- A post of a folder page that no bookmark row holds (an import of folder
  pages alone) gets its row from the folder page. A post that the table
  holds keeps its row: a folder page's sortIndex is not the bookmark time.
- The author's thread is kept apart from the post's rows (thread_posts, and
  media and links with from_thread): a later capture of the post replaces
  the post's rows, never the thread that an earlier batch read once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone

import duckdb
import pyarrow as pa

from kb.store.duckdb_store import DuckDBStore
from kb.urls import normalize_url
from kb.x.batch_rows import BatchRows, folders_read_whole, read_batch, removal_sweep_allowed
from kb.x.raw_store import RawStore

NORMALIZED_TABLES = ("bookmarks", "authors", "media", "links")


def sort_key(sort_index: str) -> tuple[int, str]:
    """The Python twin of BOOKMARK_ORDER_SQL (use with reverse=True)."""
    return len(sort_index), sort_index


@dataclass
class WriteStats:
    removal_sweep: str
    marked_removed: int = 0
    restored: int = 0
    new: int = 0  # bookmarks that the table did not hold
    updated: int = 0  # bookmarks that it held: their rows are replaced
    table_rows: dict[str, int] = field(default_factory=dict)


def _insert(conn: duckdb.DuckDBPyConnection, table: str, rows: list[dict], *, replace: bool = False,
            ignore: bool = False) -> None:
    if not rows:
        return
    conn.register("incoming_rows", pa.Table.from_pylist(rows))
    try:
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE" if ignore else "INSERT"
        conn.execute(f"{verb} INTO {table} BY NAME SELECT * FROM incoming_rows")
    finally:
        conn.unregister("incoming_rows")


def write_batch(conn: duckdb.DuckDBPyConnection, rows: BatchRows, *, now: datetime) -> WriteStats:
    """Replace the rows of one batch. The caller holds the transaction."""
    batch = rows.batch
    _keep_known_rows(conn, rows)
    tweet_ids = sorted(rows.bookmarks)
    seen = sorted(rows.seen_tweet_ids)

    # A post seen again is bookmarked: clear removed_at. This comes first, so
    # that the count is right; it also covers a post that X now shows as a
    # tombstone (its older row stays as it was).
    restored = conn.execute(
        "UPDATE bookmarks SET removed_at = NULL WHERE removed_at IS NOT NULL AND list_contains(?, tweet_id)",
        [seen]).fetchone()[0]

    # Counted before the rows go: the end report of a sync names new and updated bookmarks.
    known = conn.execute("SELECT count(*) FROM bookmarks WHERE list_contains(?, tweet_id)", [tweet_ids]).fetchone()[0]

    # Rows of this batch (a re-run) and rows of the same posts from other
    # batches (the later materialization wins) go; then the new rows come.
    # A thread's rows stay: only a thread answer replaces them (_write_threads).
    conn.execute("DELETE FROM bookmarks WHERE batch = ? OR list_contains(?, tweet_id)", [batch, tweet_ids])
    for table in ("media", "links"):
        conn.execute(f"""DELETE FROM {table} WHERE batch = ?
                         OR (list_contains(?, tweet_id) AND NOT coalesce(from_thread, false))""", [batch, tweet_ids])
    bookmarks = sorted(rows.bookmarks.values(), key=lambda r: sort_key(r["sort_index"]), reverse=True)
    _insert(conn, "bookmarks", bookmarks)
    # The post's own media and links win over a thread row with the same key.
    _insert(conn, "media", list(rows.media.values()), replace=True)
    _insert(conn, "links", list(rows.links.values()), replace=True)
    _insert(conn, "authors", list(rows.authors.values()), replace=True)
    _write_threads(conn, rows)
    _write_folders(conn, rows)

    conn.execute("DELETE FROM capture_problems WHERE batch = ? AND starts_with(raw_file, ?)", [batch, f"{batch}/"])
    _insert(conn, "capture_problems", rows.problem_rows())

    allowed, sweep = removal_sweep_allowed(rows)
    marked = 0
    if allowed:
        # Only rows of this batch or older: re-running an old --full batch
        # must not mark bookmarks that a newer capture stored.
        marked = conn.execute(
            """UPDATE bookmarks SET removed_at = ?
               WHERE removed_at IS NULL AND batch <= ? AND NOT list_contains(?, tweet_id)""",
            [now, batch, seen]).fetchone()[0]
    stats = WriteStats(removal_sweep=sweep, marked_removed=marked, restored=restored,
                       new=len(tweet_ids) - known, updated=known)
    for table in NORMALIZED_TABLES:
        stats.table_rows[table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return stats


def _keep_known_rows(conn: duckdb.DuckDBPyConnection, rows: BatchRows) -> None:
    """Drop the rows that only a folder page gave for posts that the table
    holds already: their own rows stay (a folder's sortIndex is no bookmark time)."""
    if not rows.folder_only:
        return
    known = {r[0] for r in conn.execute("SELECT tweet_id FROM bookmarks WHERE list_contains(?, tweet_id)",
                                        [sorted(rows.folder_only)]).fetchall()}
    for tweet_id in known:
        del rows.bookmarks[tweet_id]
    rows.media = {key: row for key, row in rows.media.items() if row["tweet_id"] not in known}
    rows.links = {key: row for key, row in rows.links.items() if row["tweet_id"] not in known}
    rows.folder_only -= known


def _write_threads(conn: duckdb.DuckDBPyConnection, rows: BatchRows) -> None:
    """The author's thread of each bookmark whose TweetDetail the batch holds
    replaces that bookmark's thread rows. A thread of a post that is not a
    bookmark is named, and left out."""
    conn.execute("DELETE FROM thread_posts WHERE batch = ?", [rows.batch])
    if not rows.threads:
        return
    ids = sorted(rows.threads)
    known = {r[0] for r in conn.execute("SELECT tweet_id FROM bookmarks WHERE list_contains(?, tweet_id)",
                                        [ids]).fetchall()}
    for tweet_id in sorted(set(ids) - known):
        thread = rows.threads.pop(tweet_id)
        rows.entry_problems.setdefault(thread.raw_file, []).append(
            f"post {tweet_id} is not a bookmark: its thread is kept as it came and not used")
    ids = sorted(rows.threads)
    conn.execute("DELETE FROM thread_posts WHERE list_contains(?, tweet_id)", [ids])
    for table in ("media", "links"):
        conn.execute(f"DELETE FROM {table} WHERE coalesce(from_thread, false) AND list_contains(?, tweet_id)", [ids])
    threads = rows.threads.values()
    _insert(conn, "thread_posts", [post for thread in threads for post in thread.posts])
    # A photo or link that the post itself has stays the post's.
    _insert(conn, "media", [row for thread in threads for row in thread.media], ignore=True)
    _insert(conn, "links", [row for thread in threads for row in thread.links], ignore=True)
    _insert(conn, "authors", [row for thread in threads for row in thread.authors], replace=True)


def _write_folders(conn: duckdb.DuckDBPyConnection, rows: BatchRows) -> None:
    """The folder list and the folders' bookmarks that the batch holds (the
    module text gives the rules)."""
    if rows.folder_list is not None:
        listed = sorted(rows.folder_list)
        conn.execute("DELETE FROM folder_bookmarks WHERE NOT list_contains(?, folder_id)", [listed])
        conn.execute("DELETE FROM folders WHERE NOT list_contains(?, folder_id)", [listed])
        _insert(conn, "folders", list(rows.folder_list.values()), replace=True)
    whole = folders_read_whole(rows)
    for folder_id, members in sorted(rows.folder_members.items()):
        if rows.folder_list is not None and folder_id not in rows.folder_list:
            continue  # the list of the same batch no longer names it
        conn.execute("INSERT OR IGNORE INTO folders VALUES (?, NULL, ?, ?)",
                     [folder_id, rows.batch, f"{rows.batch}/folder-{folder_id}"])
        if folder_id in whole:
            conn.execute("DELETE FROM folder_bookmarks WHERE folder_id = ?", [folder_id])
        _insert(conn, "folder_bookmarks", [{"folder_id": folder_id, "tweet_id": tweet_id, "batch": rows.batch}
                                           for tweet_id in sorted(members)], ignore=True)


# ---------------------------------------------------------------------------
# Checks: what "normalized" means
# ---------------------------------------------------------------------------


def bookmarks_missing_author_or_sort_index(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Bookmarks with no author row, or no sortIndex."""
    return [r[0] for r in conn.execute(
        """SELECT b.tweet_id FROM bookmarks b LEFT JOIN authors a ON a.author_id = b.author_id
           WHERE b.author_id IS NULL OR a.author_id IS NULL OR coalesce(b.sort_index, '') = ''
           ORDER BY b.tweet_id""").fetchall()]


def duplicate_keys(conn: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Keys that occur more than once. The primary keys forbid this; the
    check still looks, because a schema change can drop a key by mistake."""
    queries = {
        "bookmarks": "SELECT tweet_id FROM bookmarks GROUP BY tweet_id HAVING count(*) > 1",
        "media": "SELECT tweet_id || ' ' || media_key FROM media GROUP BY tweet_id, media_key HAVING count(*) > 1",
        "links": "SELECT tweet_id || ' ' || url_norm FROM links GROUP BY tweet_id, url_norm HAVING count(*) > 1",
    }
    found = {table: [r[0] for r in conn.execute(sql).fetchall()] for table, sql in queries.items()}
    return {table: keys for table, keys in found.items() if keys}


def links_not_normalized(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Links whose url_norm is empty or is not normalize_url(expanded_url).
    Rows written under older normalization rules show up here: re-materialize
    their batches to fix them."""
    bad = []
    for tweet_id, expanded, url_norm in conn.execute(
            "SELECT tweet_id, expanded_url, url_norm FROM links ORDER BY tweet_id, position").fetchall():
        try:
            expected = normalize_url(expanded)
        except ValueError:
            expected = None
        if not url_norm or url_norm != expected:
            bad.append(f"{tweet_id}: {expanded} -> {url_norm!r} (expected {expected!r})")
    return bad


@dataclass
class CheckFindings:
    """What the checks of the normalized tables found (empty: all pass)."""

    missing_author_or_sort_index: list[str]
    duplicates: dict[str, list[str]]
    links_not_normalized: list[str]


def check_tables(conn: duckdb.DuckDBPyConnection) -> CheckFindings:
    """The checks on the rows that `conn` sees."""
    return CheckFindings(bookmarks_missing_author_or_sort_index(conn), duplicate_keys(conn),
                         links_not_normalized(conn))


@dataclass
class NormalizeOutcome:
    rows: BatchRows
    stats: WriteStats
    findings: CheckFindings


def normalize_batch(store: DuckDBStore, raw_store: RawStore, batch: str, *,
                    log: logging.Logger | None = None, max_posts: int | None = None) -> NormalizeOutcome:
    """Read the batch (no connection open), then write it and check the
    tables in ONE transaction. EmptyBatchError when the batch holds nothing."""
    rows = read_batch(raw_store, batch, log=log, max_posts=max_posts)  # all parsing before the connection opens
    now = datetime.now(timezone.utc)
    with store.transaction() as conn:
        stats = write_batch(conn, rows, now=now)
        findings = check_tables(conn)
    return NormalizeOutcome(rows, stats, findings)
