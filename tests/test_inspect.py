"""`kb inspect`: the report on captured data, from raw files only.

The report over KB_HOME must agree with what the normalize assets store in
DuckDB for the same raw batches: both use one parser and one removal rule.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from kb.apps.capture_report import format_report, inspect_report
from kb.settings import get_settings
from tests.test_normalize import GONE, normalize, query, write_raw_batch
from tests.x_fixtures import all_tweet_entries, bookmarks_page, paged_bookmarks

B1, B2 = "20261101T000000000Z", "20261102T000000000Z"


@pytest.mark.slow
def test_report_over_kb_home_agrees_with_the_normalized_tables():
    entries = all_tweet_entries()
    kept = [e for e in entries if e["entryId"].removeprefix("tweet-") not in GONE]
    write_raw_batch(B1, paged_bookmarks(entries, page_size=60), full=True)
    write_raw_batch(B2, paged_bookmarks(kept, page_size=60), full=True)

    report = inspect_report(None, get_settings())
    assert report["source"] == str(get_settings().x_raw_dir)
    assert report["batches"] == 2 and report["pages"] == 6 and report["bad_pages"] == {}
    assert report["bookmarks"] == len(entries)
    assert report["removed"] == len(GONE)
    assert report["gifs"] == 0  # the only GIF of the captures is in a conversation module

    with dg.DagsterInstance.ephemeral() as instance:
        normalize(instance, B1)
        normalize(instance, B2)

    def one(sql: str) -> int:
        return query(sql)[0][0]

    assert report["removed"] == one("SELECT count(*) FROM bookmarks WHERE removed_at IS NOT NULL")
    assert report["authors"] == one("SELECT count(*) FROM authors")
    assert report["long_posts"] == one("SELECT count(*) FROM bookmarks WHERE is_long")
    assert report["quoted_posts"] == one("SELECT count(*) FROM bookmarks WHERE quoted_tweet_id IS NOT NULL")
    assert report["articles"] == one("SELECT count(*) FROM bookmarks WHERE article_id IS NOT NULL")
    assert report["photos"] == one("SELECT count(*) FROM media WHERE kind = 'photo'")
    assert report["videos"] == one("SELECT count(*) FROM media WHERE kind = 'video'")
    assert report["cards"] == one("SELECT count(*) FROM links WHERE kind = 'card'")
    assert report["links"] == one("SELECT count(*) FROM links")
    assert report["links_by_host"] == dict(query(
        "SELECT host, count(*) AS n FROM links GROUP BY host ORDER BY n DESC, host"))
    # Values read in the captures: 24 note_tweet posts, 2 article posts (one
    # of them quoted in a retweet), docs.x.com linked by 5 posts.
    assert (report["long_posts"], report["articles"], report["links_by_host"]["docs.x.com"]) == (24, 2, 5)

    text = format_report(report)
    assert f"bookmarks        {len(entries)}" in text
    assert f"removed          {len(GONE)}" in text
    assert "1 cards have no target in their post's links (not stored)" in text


def test_report_on_page_files_names_the_bad_ones(tmp_path):
    entries = all_tweet_entries()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(bookmarks_page(entries[:25], bottom_cursor="x")))
    also_good = tmp_path / "also_good.json"  # overlaps the first file by 5 posts
    also_good.write_text(json.dumps(bookmarks_page(entries[20:30], bottom_cursor="y")))
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": {"user": {}}}')
    missing = tmp_path / "missing.json"

    report = inspect_report([good, also_good, bad, missing], get_settings())
    assert report["source"] == "files"
    assert report["bookmarks"] == 30
    assert report["removed"] is None
    assert report["bad_pages"][str(bad)].startswith("not a Bookmarks page (missing key 'bookmark_timeline_v2')")
    assert report["bad_pages"][str(missing)].startswith("cannot read the file (No such file or directory")

    text = format_report(report)
    assert "removed          n/a (single pages)" in text
    assert f"  {bad}: not a Bookmarks page" in text


def test_report_on_an_empty_kb_home():
    report = inspect_report(None, get_settings())
    assert (report["batches"], report["bookmarks"], report["removed"]) == (0, 0, 0)
    assert "bookmarks        0" in format_report(report)
