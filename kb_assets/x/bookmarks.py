"""Normalize, X: the assets `normalized_bookmarks` (bookmarks, authors,
media, links, bookmark_folders, author_threads) of one sync batch.

The rules of the tables (replace, removal sweep, folders, threads) and
their SQL are in the core: kb/x/bookmark_tables.py. This module reads the
resources, calls normalize_batch(), and turns its outcome into Dagster
metadata and check results.
"""

# No `from __future__ import annotations` here: Dagster 1.13 reads the
# annotations of asset functions (context, resources) as objects, and string
# annotations make it reject the definition.
from collections import Counter

import dagster as dg

from kb_assets.keys import X_RAW_PAGES
from kb_assets.partitions import sync_batches
from kb.x.batch_rows import BatchRows, EmptyBatchError, folders_read_whole
from kb.x.bookmark_tables import CheckFindings, WriteStats, normalize_batch
from kb_resources.stores import DuckDBResource, RawStoreResource

METADATA_LIST_LIMIT = 20  # keep the run metadata readable in the UI


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
    batch = context.partition_key
    try:
        outcome = normalize_batch(duckdb.get_client(), raw_store.get_client(), batch, log=context.log)
    except EmptyBatchError as exc:
        raise dg.Failure(description=str(exc)) from exc
    for key, metadata in batch_metadata(outcome.rows, outcome.stats).items():
        yield dg.MaterializeResult(asset_key=key, metadata=metadata)
    yield from normalization_checks(outcome.findings)


def normalization_checks(findings: CheckFindings) -> list[dg.AssetCheckResult]:
    """The results of CHECK_SPECS from what the checks found."""
    missing, duplicates = findings.missing_author_or_sort_index, findings.duplicates
    not_normalized = findings.links_not_normalized
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
