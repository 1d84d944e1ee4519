"""`kb inspect`: what the captured X data holds.

With no files, the report covers every sync batch under KB_HOME/raw/x. With
files, it covers just those raw Bookmarks pages. Both read the pages with the
same parser as the normalize assets (kb.x.post_rows.parse_page), so the
report shows what the assets would store.

The report reads raw files only, never DuckDB: it works while a sync holds
the DuckDB file, and it shows what a rebuild from the raw files would give.
"removed" replays the batches in order with the rule of the normalize stage
(a complete --full capture with no bad page marks the bookmarks it did not
see; a later capture that sees one clears it).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from kb.x.batch_rows import BatchRows, read_batch, removal_sweep_allowed
from kb.x.graphql import PageShapeError, load_page
from kb.x.post_rows import parse_page
from kb.x.raw_store import RawStore
from kb.settings import Settings

FILES_BATCH = "<files>"
TOP_HOSTS_IN_TEXT = 15


def read_files(paths: list[Path]) -> BatchRows:
    """Raw pages given by path, as one batch. A missing or bad file is
    named in bad_pages with the reason; the other files are still read."""
    rows = BatchRows(batch=FILES_BATCH, manifest=None, pages=len(paths))
    for path in paths:
        name = str(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            rows.bad_pages[name] = f"cannot read the file ({exc.strerror or exc})"
            continue
        try:
            payload = load_page(raw, name=name)
            captured_at = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
            rows.add(parse_page(payload, raw_file=name, batch=FILES_BATCH, captured_at=captured_at))
        except PageShapeError as exc:
            rows.bad_pages[name] = str(exc).removeprefix(f"{name}: ")
    return rows


def replay(batches: list[BatchRows]) -> tuple[dict[str, dict], dict[str, list[dict]], dict[str, list[dict]],
                                               dict[str, dict], set[str]]:
    """The state that normalizing the batches in this order gives:
    (bookmarks, media by tweet, links by tweet, authors, removed tweet ids)."""
    bookmarks: dict[str, dict] = {}
    media: dict[str, list[dict]] = {}
    links: dict[str, list[dict]] = {}
    authors: dict[str, dict] = {}
    removed: set[str] = set()
    for rows in batches:
        batch_media: dict[str, list[dict]] = {}
        for row in rows.media.values():
            batch_media.setdefault(row["tweet_id"], []).append(row)
        batch_links: dict[str, list[dict]] = {}
        for row in rows.links.values():
            batch_links.setdefault(row["tweet_id"], []).append(row)
        for tweet_id, row in rows.bookmarks.items():  # the later batch wins
            bookmarks[tweet_id] = row
            media[tweet_id] = batch_media.get(tweet_id, [])
            links[tweet_id] = batch_links.get(tweet_id, [])
        authors.update(rows.authors)
        removed -= rows.seen_tweet_ids
        if removal_sweep_allowed(rows)[0]:
            removed |= {tid for tid, row in bookmarks.items()
                        if row["batch"] <= rows.batch and tid not in rows.seen_tweet_ids}
    return bookmarks, media, links, authors, removed


def inspect_report(paths: list[Path] | None, settings: Settings) -> dict:
    """Counts of what the captured data holds. paths=None: every batch in
    KB_HOME; else just those raw pages."""
    if paths:
        batches = [read_files(list(paths))]
        source = "files"
    else:
        store = RawStore.from_settings(root=str(settings.x_raw_dir))
        batches = []
        for batch in store.batches():
            if store.pages(batch) or store.manifest(batch):
                batches.append(read_batch(store, batch, max_posts=settings.kb_thread_max_posts))
        source = str(settings.x_raw_dir)

    bookmarks, media, links, authors, removed = replay(batches)
    all_media = [m for rows in media.values() for m in rows]
    all_links = [link for rows in links.values() for link in rows]
    hosts = Counter(link["host"] for link in all_links)
    unknown = Counter()
    for rows in batches:
        unknown.update(rows.unknown_entries)
    return {
        "source": source,
        "batches": 0 if paths else len(batches),
        "pages": sum(rows.pages for rows in batches),
        "bad_pages": {name: reason for rows in batches for name, reason in rows.bad_pages.items()},
        "bookmarks": len(bookmarks),
        "authors": len(authors),
        "long_posts": sum(1 for b in bookmarks.values() if b["is_long"]),
        "quoted_posts": sum(1 for b in bookmarks.values() if b["quoted_tweet_id"]),
        "articles": sum(1 for b in bookmarks.values() if b["article_id"]),
        "retweets": sum(1 for b in bookmarks.values() if b["retweet_of_id"]),
        "photos": sum(1 for m in all_media if m["kind"] == "photo"),
        "videos": sum(1 for m in all_media if m["kind"] == "video"),
        "gifs": sum(1 for m in all_media if m["kind"] == "animated_gif"),
        "cards": sum(1 for link in all_links if link["kind"] == "card"),
        "links": len(all_links),
        "links_by_host": dict(sorted(hosts.items(), key=lambda kv: (-kv[1], kv[0]))),
        # Single pages cannot say what was removed: that needs the batches in order.
        "removed": None if paths else len(removed),
        "unavailable_posts": len({t for rows in batches for t in rows.unavailable_tweet_ids}),
        "unresolved_cards": len({card for rows in batches for card in rows.unresolved_cards}),
        "unknown_entries": dict(unknown),
        "entry_problems": sum(len(p) for rows in batches for p in rows.entry_problems.values()),
    }


def format_report(report: dict) -> str:
    """The report as text for a person."""
    removed = "n/a (single pages)" if report["removed"] is None else report["removed"]
    where = "files given" if report["source"] == "files" else f"{report['source']} ({report['batches']} batches)"
    pages = f"{report['pages']} raw page" + ("" if report["pages"] == 1 else "s")
    lines = [
        f"Captured X data: {where}, {pages}",
        "",
        f"  bookmarks        {report['bookmarks']}",
        f"  removed          {removed}",
        f"  authors          {report['authors']}",
        f"  long posts       {report['long_posts']}",
        f"  quoted posts     {report['quoted_posts']}",
        f"  articles         {report['articles']}",
        f"  retweets         {report['retweets']}",
        f"  photos           {report['photos']}",
        f"  videos           {report['videos']}",
        f"  GIFs             {report['gifs']}",
        f"  cards            {report['cards']}",
        f"  links            {report['links']}",
    ]
    hosts = list(report["links_by_host"].items())
    if hosts:
        lines += ["", "Links by host:"]
        lines += [f"  {count:5d}  {host}" for host, count in hosts[:TOP_HOSTS_IN_TEXT]]
        if len(hosts) > TOP_HOSTS_IN_TEXT:
            lines.append(f"         ... and {len(hosts) - TOP_HOSTS_IN_TEXT} more hosts")
    notes = []
    if report["unavailable_posts"]:
        notes.append(f"  {report['unavailable_posts']} bookmarked posts are unavailable (deleted or hidden by X)")
    if report["unresolved_cards"]:
        notes.append(f"  {report['unresolved_cards']} cards have no target in their post's links (not stored)")
    if report["unknown_entries"]:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(report["unknown_entries"].items()))
        notes.append(f"  skipped entries of unknown kind: {kinds}")
    if report["entry_problems"]:
        notes.append(f"  {report['entry_problems']} entries could not be read fully")
    if notes:
        lines += ["", "Notes:", *notes]
    if report["bad_pages"]:
        lines += ["", "Pages that could not be read (kept on disk as they came):"]
        lines += [f"  {name}: {reason}" for name, reason in report["bad_pages"].items()]
    return "\n".join(lines)
