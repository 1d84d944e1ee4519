"""Normalize: raw X Bookmarks pages of one sync batch -> DuckDB tables
`bookmarks`, `authors`, `media`, `links`.

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
from kb.x_graphql import PageShapeError, ParsedPage, load_page, parse_page
from kb.duckdb_store import DUCKDB_POOL
from kb.raw_store import CaptureManifest, RawStore
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

    def add(self, page: ParsedPage) -> None:
        # X can repeat a post on the next page of one capture; its first row
        # stays, with the media and links of that same page.
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
    if not paths and manifest is None:
        raise dg.Failure(
            description=f"Batch {batch} has no raw pages and no capture.json in {raw_store.batch_dir(batch)}. "
                        "Materialize x_raw_pages for this batch first.")
    rows = BatchRows(batch=batch, manifest=manifest, pages=len(paths))
    for path in paths:
        try:
            page = read_page_file(path, batch=batch, manifest=manifest)
        except PageShapeError as exc:
            name = raw_file_name(batch, path)
            rows.bad_pages[name] = str(exc).removeprefix(f"{name}: ")
            if log:
                log.warning(f"Raw page kept but not normalized: {exc}")
            continue
        rows.add(page)
        if log and page.unknown_entries:
            log.warning(f"{page.raw_file}: skipped unknown entry kinds {dict(page.unknown_entries)}")
    return rows


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


def _insert(conn: duckdb.DuckDBPyConnection, table: str, rows: list[dict], *, replace: bool = False) -> None:
    if not rows:
        return
    conn.register("incoming_rows", pa.Table.from_pylist(rows))
    try:
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        conn.execute(f"{verb} INTO {table} BY NAME SELECT * FROM incoming_rows")
    finally:
        conn.unregister("incoming_rows")


def write_batch(conn: duckdb.DuckDBPyConnection, rows: BatchRows, *, now: datetime) -> WriteStats:
    """Replace the rows of one batch. The caller holds the transaction."""
    batch = rows.batch
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
    for table in ("media", "links", "bookmarks"):
        conn.execute(f"DELETE FROM {table} WHERE batch = ? OR list_contains(?, tweet_id)", [batch, tweet_ids])
    bookmarks = sorted(rows.bookmarks.values(), key=lambda r: sort_key(r["sort_index"]), reverse=True)
    _insert(conn, "bookmarks", bookmarks)
    _insert(conn, "media", list(rows.media.values()))
    _insert(conn, "links", list(rows.links.values()))
    _insert(conn, "authors", list(rows.authors.values()), replace=True)

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
    ],
    partitions_def=sync_batches,
    pool=DUCKDB_POOL,
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
