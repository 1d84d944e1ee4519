"""Normalize: raw X Bookmarks pages of one sync batch -> DuckDB tables
`bookmarks`, `authors`, `media`, `links`; the batch's folder answers ->
`folders`, `folder_bookmarks`; its TweetDetail answers -> `thread_posts`.

The raw pages are the truth; these tables are rebuilt from them at any time.
One materialization of a partition (one sync batch):
 1. reads and parses every raw page of the batch, with no DuckDB connection
    open (parsing can take seconds; the DuckDB file allows one writer);
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

# No `from __future__ import annotations` here: Dagster 1.13 reads the
# annotations of asset functions (context, resources) as objects, and string
# annotations make it reject the definition.
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa

from kb_assets.keys import X_RAW_PAGES
from kb_assets.partitions import sync_batches
from kb.urls import normalize_url
from kb.x.graphql import (FOLDER_TIMELINE, PageShapeError, ParsedPage, ParsedThread, load_page, parse_folder_list,
                          parse_page, parse_thread)
from kb.x.raw_store import CaptureManifest, RawAnswer, RawStore
from kb.settings import get_settings
from kb_resources.stores import DuckDBResource, RawStoreResource

NORMALIZED_TABLES = ("bookmarks", "authors", "media", "links")

METADATA_LIST_LIMIT = 20  # keep the run metadata readable in the UI


def sort_key(sort_index: str) -> tuple[int, str]:
    """The Python twin of BOOKMARK_ORDER_SQL (use with reverse=True)."""
    return len(sort_index), sort_index


# ---------------------------------------------------------------------------
# Reading a batch (no DuckDB here)
# ---------------------------------------------------------------------------


@dataclass
class BatchRows:
    """Every row of one batch, merged over its pages."""

    batch: str
    manifest: CaptureManifest | None
    pages: int = 0
    bookmarks: dict[str, dict] = field(default_factory=dict)
    authors: dict[str, dict] = field(default_factory=dict)
    media: dict[tuple[str, str], dict] = field(default_factory=dict)
    links: dict[tuple[str, str], dict] = field(default_factory=dict)
    seen_tweet_ids: set[str] = field(default_factory=set)
    unavailable_tweet_ids: set[str] = field(default_factory=set)
    unknown_entries: Counter = field(default_factory=Counter)
    unresolved_cards: list[str] = field(default_factory=list)
    bad_pages: dict[str, str] = field(default_factory=dict)       # raw_file -> reason
    entry_problems: dict[str, list[str]] = field(default_factory=dict)  # raw_file -> reasons
    folder_list: dict[str, dict] | None = None  # folder id -> folders row; None: no list in the batch
    folder_members: dict[str, set[str]] = field(default_factory=dict)  # folder id -> tweet ids
    folder_only: set[str] = field(default_factory=set)  # rows that only a folder page gave
    threads: dict[str, ParsedThread] = field(default_factory=dict)  # bookmark id -> its thread

    def add(self, page: ParsedPage, *, folder_id: str | None = None) -> None:
        # X can repeat a post on the next page of one capture; its first row
        # stays, with the media and links of that same page. Folder pages
        # come after the Bookmarks pages: a Bookmarks page's row wins.
        if folder_id is not None:
            self.folder_members.setdefault(folder_id, set()).update(page.seen_tweet_ids)
            self.folder_only.update(row["tweet_id"] for row in page.bookmarks if row["tweet_id"] not in self.bookmarks)
        for row in page.bookmarks:
            self.bookmarks.setdefault(row["tweet_id"], row)
        kept = set(self.bookmarks)
        for row in page.media:
            if row["tweet_id"] in kept and self.bookmarks[row["tweet_id"]]["raw_file"] == page.raw_file:
                self.media.setdefault((row["tweet_id"], row["media_key"]), row)
        for row in page.links:
            if row["tweet_id"] in kept and self.bookmarks[row["tweet_id"]]["raw_file"] == page.raw_file:
                self.links.setdefault((row["tweet_id"], row["url_norm"]), row)
        for row in page.authors:
            self.authors[row["author_id"]] = row
        self.seen_tweet_ids.update(page.seen_tweet_ids)
        self.unavailable_tweet_ids.update(page.unavailable_tweet_ids)
        self.unknown_entries.update(page.unknown_entries)
        self.unresolved_cards.extend(page.unresolved_cards)
        if page.problems:
            self.entry_problems[page.raw_file] = list(page.problems)

    def problem_rows(self) -> list[dict]:
        rows = [{"batch": self.batch, "raw_file": f, "reason": r} for f, r in self.bad_pages.items()]
        for raw_file, reasons in self.entry_problems.items():
            rows.extend({"batch": self.batch, "raw_file": raw_file, "reason": r} for r in dict.fromkeys(reasons))
        return rows


def raw_file_name(batch: str, path: Path) -> str:
    """How rows name their raw page: relative to the X raw folder, so the
    name stays right when KB_HOME moves."""
    return f"{batch}/{path.name}"


def capture_time(manifest: CaptureManifest | None, path: Path) -> datetime:
    """When the page was captured: the manifest's start, else the file time
    (raw files are never edited, so their time is the capture time)."""
    if manifest and manifest.started_at:
        try:
            moment = datetime.fromisoformat(manifest.started_at)
            return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    return datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)


def read_page_file(path: Path, *, batch: str, manifest: CaptureManifest | None) -> ParsedPage:
    """Parse one raw page file; PageShapeError names the file and the reason."""
    name = raw_file_name(batch, path)
    payload = load_page(path.read_bytes(), name=name)
    return parse_page(payload, raw_file=name, batch=batch, captured_at=capture_time(manifest, path))


def read_batch(raw_store: RawStore, batch: str, log=None) -> BatchRows:
    manifest = raw_store.manifest(batch)
    paths = raw_store.pages(batch)
    answers = raw_store.answers(batch)
    if not paths and not answers and manifest is None:
        raise dg.Failure(
            description=f"Batch {batch} has no raw pages and no capture.json in {raw_store.batch_dir(batch)}. "
                        "Materialize x_raw_pages for this batch first.")
    rows = BatchRows(batch=batch, manifest=manifest, pages=len(paths) + len(answers))
    for path in paths:
        _read_into(rows, path, log, lambda: rows.add(read_page_file(path, batch=batch, manifest=manifest)))
    max_posts = get_settings().kb_thread_max_posts
    for answer in answers:  # after the Bookmarks pages: their rows win
        _read_into(rows, answer.path, log, lambda: _add_answer(rows, answer, max_posts))
    return rows


def _read_into(rows: BatchRows, path: Path, log, read) -> None:
    """Run `read`; a file that it cannot read is named with the reason, and kept."""
    try:
        read()
    except PageShapeError as exc:
        name = raw_file_name(rows.batch, path)
        rows.bad_pages[name] = str(exc).removeprefix(f"{name}: ")
        if log:
            log.warning(f"Raw page kept but not normalized: {exc}")


def _add_answer(rows: BatchRows, answer: RawAnswer, max_posts: int) -> None:
    """One folder list, folder page or thread answer of the batch."""
    name = raw_file_name(rows.batch, answer.path)
    if answer.kind == "unsorted":
        raise PageShapeError(f"{name}: an imported answer that names no folder or post; kept as it came")
    payload = load_page(answer.path.read_bytes(), name=name)
    captured_at = capture_time(rows.manifest, answer.path)
    if answer.kind == "folders":
        folders, problems = parse_folder_list(payload, name=name)
        listed = rows.folder_list if rows.folder_list is not None else {}
        for folder in folders:
            listed[folder["folder_id"]] = {**folder, "batch": rows.batch, "raw_file": name}
        rows.folder_list = listed
        if problems:
            rows.entry_problems.setdefault(name, []).extend(problems)
    elif answer.kind == "folder":
        rows.add(parse_page(payload, raw_file=name, batch=rows.batch, captured_at=captured_at,
                            operation=FOLDER_TIMELINE), folder_id=answer.key)
    else:
        thread = parse_thread(payload, tweet_id=answer.key, raw_file=name, batch=rows.batch,
                              captured_at=captured_at, max_posts=max_posts)
        rows.threads[answer.key] = thread  # a later answer of the same post wins
        if thread.problems:
            rows.entry_problems.setdefault(name, []).extend(thread.problems)


def folders_read_whole(rows: BatchRows) -> set[str]:
    """The folders whose pages in this batch reach the folder's end. An
    import is what the owner gave: whole."""
    manifest = rows.manifest
    if manifest is None or manifest.mode == "files":
        return set(rows.folder_members)
    return set(manifest.folders_done) & set(rows.folder_members)


# ---------------------------------------------------------------------------
# Writing a batch (one short transaction)
# ---------------------------------------------------------------------------


@dataclass
class WriteStats:
    removal_sweep: str
    marked_removed: int = 0
    restored: int = 0
    new: int = 0  # bookmarks that the table did not hold
    updated: int = 0  # bookmarks that it held: their rows are replaced
    table_rows: dict[str, int] = field(default_factory=dict)


def removal_sweep_allowed(rows: BatchRows) -> tuple[bool, str]:
    """Only a capture that saw the whole bookmark list can say what is gone."""
    m = rows.manifest
    if m is None or not m.full:
        return False, "not run: the capture was not --full"
    if not m.complete:
        return False, "not run: the --full capture did not reach the end"
    if m.resumed_from:
        # This batch holds only the tail of the list; the rest is in earlier batches.
        return False, f"not run: the --full capture went on from batch {m.resumed_from}; run `kb sync --full` again"
    if rows.bad_pages:
        # The bookmarks on an unreadable page are unknown; they must not be marked removed.
        return False, f"not run: {len(rows.bad_pages)} raw page(s) could not be read"
    if not rows.seen_tweet_ids:
        # A full list with no bookmark at all is much more likely a broken
        # capture (for example, a logged-out page) than a true empty list.
        return False, "not run: the --full capture saw no bookmark at all"
    return True, "run"


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
# Metadata
# ---------------------------------------------------------------------------


def _capped(items: list[str]) -> list[str]:
    extra = len(items) - METADATA_LIST_LIMIT
    return items[:METADATA_LIST_LIMIT] + ([f"... and {extra} more"] if extra > 0 else [])


def bad_pages_markdown(bad_pages: dict[str, str]) -> str:
    lines = ["| raw page | reason |", "|---|---|"]
    lines += [f"| {name} | {reason.replace('|', '/')} |" for name, reason in bad_pages.items()]
    return "\n".join(lines)


def batch_metadata(rows: BatchRows, stats: WriteStats) -> dict[str, dict]:
    bookmarks = list(rows.bookmarks.values())
    media = list(rows.media.values())
    links = list(rows.links.values())
    problems = [f"{f}: {r}" for f, reasons in rows.entry_problems.items() for r in reasons]
    common = {"batch": rows.batch, "raw_pages": rows.pages, "bad_pages": len(rows.bad_pages),
              # "<raw file>: <reason>": `kb normalize` names them.
              "unreadable_pages": _capped([f"{name}: {reason}" for name, reason in rows.bad_pages.items()])}
    if rows.bad_pages:
        common["bad_page_list"] = dg.MetadataValue.md(bad_pages_markdown(rows.bad_pages))
    hosts = Counter(link["host"] for link in links)
    return {
        "bookmarks": {
            **common,
            "bookmarks_in_batch": len(bookmarks),
            "new_bookmarks": stats.new,
            "updated_bookmarks": stats.updated,
            "long_posts": sum(1 for b in bookmarks if b["is_long"]),
            "quoted_posts": sum(1 for b in bookmarks if b["quoted_tweet_id"]),
            "articles": sum(1 for b in bookmarks if b["article_id"]),
            "retweets": sum(1 for b in bookmarks if b["retweet_of_id"]),
            "unavailable_posts": len(rows.unavailable_tweet_ids),
            "unknown_entries": dict(rows.unknown_entries),
            "entry_problems": len(problems),
            "entry_problem_list": _capped(problems),
            "removal_sweep": stats.removal_sweep,
            "marked_removed": stats.marked_removed,
            "restored": stats.restored,
            "rows_in_table": stats.table_rows["bookmarks"],
        },
        "authors": {**common, "authors_in_batch": len(rows.authors), "rows_in_table": stats.table_rows["authors"]},
        "bookmark_folders": {
            **common,
            "folders_listed": len(rows.folder_list or {}),
            "folder_pages_read": sorted(rows.folder_members),
            "folder_bookmarks": sum(len(members) for members in rows.folder_members.values()),
            "folders_read_whole": len(folders_read_whole(rows)),
        },
        "author_threads": {
            **common,
            "threads": len(rows.threads),
            "thread_posts": sum(len(thread.posts) for thread in rows.threads.values()),
        },
        "media": {
            **common,
            "photos": sum(1 for m in media if m["kind"] == "photo"),
            "videos": sum(1 for m in media if m["kind"] == "video"),
            "gifs": sum(1 for m in media if m["kind"] == "animated_gif"),
            "from_quotes": sum(1 for m in media if m["from_quote"]),
            "rows_in_table": stats.table_rows["media"],
        },
        "links": {
            **common,
            "links_in_batch": len(links),
            "cards": sum(1 for link in links if link["kind"] == "card"),
            "article_links": sum(1 for link in links if link["kind"] == "article"),
            "unresolved_cards": len(rows.unresolved_cards),
            "unresolved_card_list": _capped(rows.unresolved_cards),
            "top_hosts": dict(hosts.most_common(10)),
            "rows_in_table": stats.table_rows["links"],
        },
    }


# ---------------------------------------------------------------------------
# The assets
# ---------------------------------------------------------------------------


CHECK_SPECS = [
    dg.AssetCheckSpec("every_bookmark_has_author_and_sort_index", asset="bookmarks",
                      description="Every bookmark has an author row and a sortIndex."),
    dg.AssetCheckSpec("no_duplicate_ids", asset="bookmarks",
                      description="No tweet id twice in bookmarks; no duplicate media or link keys."),
    dg.AssetCheckSpec("every_link_has_normalized_url", asset="links",
                      description="Every link's url_norm is normalize_url(expanded_url)."),
]


@dg.multi_asset(
    specs=[
        dg.AssetSpec("bookmarks", deps=[X_RAW_PAGES], group_name="x", kinds={"duckdb"},
                     description="One row per bookmarked post: full text (note_tweet for long posts), the quoted "
                                 "post, the X Article, sortIndex (bookmark time) and removed_at."),
        dg.AssetSpec("authors", deps=[X_RAW_PAGES], group_name="x", kinds={"duckdb"},
                     description="Authors of bookmarked, quoted and retweeted posts (the latest capture wins)."),
        dg.AssetSpec("media", deps=[X_RAW_PAGES], group_name="x", kinds={"duckdb"},
                     description="Photos, videos and GIFs of bookmarks and their quotes. Videos keep every "
                                 "variant, the smallest MP4 (for transcripts) and the best MP4."),
        dg.AssetSpec("links", deps=[X_RAW_PAGES], group_name="x", kinds={"duckdb"},
                     description="Links, cards and X Articles of bookmarks, t.co expanded, keyed by "
                                 "normalize_url(). A card's target comes only from the post's url entities."),
        dg.AssetSpec("bookmark_folders", deps=[X_RAW_PAGES], group_name="x", kinds={"duckdb"},
                     description="Bookmark folders (tables folders, folder_bookmarks), keyed by X's id: a rename "
                                 "keeps the folder's bookmarks. A folder read to its end replaces its bookmarks."),
        dg.AssetSpec("author_threads", deps=[X_RAW_PAGES], group_name="x", kinds={"duckdb"},
                     description="The author's own chain of replies under a bookmarked post (table thread_posts), "
                                 "from its TweetDetail answer. Replies of other people are never stored."),
    ],
    partitions_def=sync_batches,
    # The checks run in this step, on its connection: a step of their own
    # cost each sync Dagster events and one more DuckDB connection.
    check_specs=CHECK_SPECS,
)
def normalized_bookmarks(context: dg.AssetExecutionContext, duckdb: DuckDBResource, raw_store: RawStoreResource):
    duckdb, raw_store = duckdb.get_client(), raw_store.get_client()
    batch = context.partition_key
    rows = read_batch(raw_store, batch, log=context.log)  # all parsing before the connection opens
    now = datetime.now(timezone.utc)
    with duckdb.transaction() as conn:
        stats = write_batch(conn, rows, now=now)
        checks = normalization_checks(conn)
    for key, metadata in batch_metadata(rows, stats).items():
        yield dg.MaterializeResult(asset_key=key, metadata=metadata)
    yield from checks


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



def normalization_checks(conn: duckdb.DuckDBPyConnection) -> list[dg.AssetCheckResult]:
    """The results of CHECK_SPECS on the rows that `conn` sees."""
    missing = bookmarks_missing_author_or_sort_index(conn)
    duplicates = duplicate_keys(conn)
    not_normalized = links_not_normalized(conn)
    return [
        dg.AssetCheckResult(
            check_name="every_bookmark_has_author_and_sort_index", asset_key="bookmarks",
            passed=not missing, metadata={"failing": len(missing), "tweet_ids": _capped(missing)}),
        dg.AssetCheckResult(
            check_name="no_duplicate_ids", asset_key="bookmarks",
            passed=not duplicates, metadata={"duplicates": {t: _capped(k) for t, k in duplicates.items()}}),
        dg.AssetCheckResult(
            check_name="every_link_has_normalized_url", asset_key="links",
            passed=not not_normalized, metadata={"failing": len(not_normalized), "links": _capped(not_normalized)}),
    ]
