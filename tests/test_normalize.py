"""The normalize multi-asset, run for real by Dagster on raw pages made from
the real X captures, into a real DuckDB file in the test KB_HOME.

x_raw_pages is another stage: here the raw pages are written with RawStore
directly, and only the normalize assets (and their checks) materialize.
"""

from __future__ import annotations

import copy
import json

import dagster as dg
import duckdb
import pytest

from kb.queries import BOOKMARK_ORDER_SQL
from kb_assets.x.bookmarks import normalized_bookmarks
from kb.x.bookmark_tables import bookmarks_missing_author_or_sort_index, duplicate_keys, links_not_normalized
from kb_assets.partitions import sync_batches
from kb.store.duckdb_store import DuckDBStore
from kb.x.raw_store import CaptureManifest, RawStore
from kb.settings import get_settings
from tests.shared_data import x_fixture
from tests.x_fixtures import _walk_entries, all_tweet_entries, bookmarks_page, paged_bookmarks
from kb_resources.stores import DuckDBResource, RawStoreResource

# Batch keys sort by time, as new_batch_key() makes them.
B1, B2, B3, B4, B5 = (f"2026110{n}T000000000Z" for n in range(1, 6))
GONE = ["2085473570625294744", "1671508600538161153", "2079821023071907954"]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def ids(entries: list[dict]) -> list[str]:
    return [e["entryId"].removeprefix("tweet-") for e in entries]


def write_raw_batch(batch: str, pages: list, *, full: bool, complete: bool = True) -> list:
    """Raw pages as x_raw_pages leaves them: page-NNNN.json, then capture.json."""
    store = RawStore.from_settings()
    paths = []
    for number, page in enumerate(pages, start=1):
        body = page if isinstance(page, bytes) else json.dumps(page).encode()
        paths.append(store.write_page(batch, number, body))
    store.write_manifest(CaptureManifest(batch=batch, mode="files", full=full, complete=complete,
                                         pages=[p.name for p in paths], started_at="2026-11-01T10:00:00+00:00",
                                         finished_at="2026-11-01T10:01:00+00:00"))
    return paths


def normalize(instance, batch: str, **kwargs) -> dg.ExecuteInProcessResult:
    """Materialize the normalize assets for one batch, with their checks
    (they run in the same step)."""
    instance.add_dynamic_partitions(sync_batches.name, [batch])
    return dg.materialize(
        [normalized_bookmarks],
        partition_key=batch,
        resources={"duckdb": DuckDBResource.from_settings(), "raw_store": RawStoreResource.from_settings()},
        instance=instance,
        **kwargs,
    )


def metadata(result, key: str) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path == [key]]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def checks(result) -> dict[str, bool]:
    return {c.check_name: c.passed for c in result.get_asset_check_evaluations()}


def query(sql: str, params=None) -> list[tuple]:
    with duckdb.connect(str(get_settings().duckdb_path), read_only=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def table_counts() -> dict[str, int]:
    return {t: query(f"SELECT count(*) FROM {t}")[0][0] for t in ("bookmarks", "authors", "media", "links")}


@pytest.mark.slow
def test_normalize_the_real_captures(instance):
    entries = all_tweet_entries()
    write_raw_batch(B1, paged_bookmarks(entries, page_size=40), full=True)
    result = normalize(instance, B1)

    assert result.success
    assert checks(result) == {"every_bookmark_has_author_and_sort_index": True, "no_duplicate_ids": True,
                              "every_link_has_normalized_url": True}
    assert table_counts()["bookmarks"] == len(entries)

    # Bookmark order is sortIndex order, which is not post order here.
    by_bookmark = [r[0] for r in query(f"SELECT tweet_id FROM bookmarks ORDER BY {BOOKMARK_ORDER_SQL}")]
    by_post_time = [r[0] for r in query("SELECT tweet_id FROM bookmarks ORDER BY created_at DESC")]
    assert by_bookmark == ids(entries)
    assert by_post_time != by_bookmark

    # A long post's full text (note_tweet), read in raw_list_timeline.json.
    text, is_long, raw_file = query(
        "SELECT text, is_long, raw_file FROM bookmarks WHERE tweet_id = '2085421175648248224'")[0]
    assert is_long and len(text) == 553 and "are never used to develop a nuclear weapon." in text
    assert raw_file == f"{B1}/page-0003.json"

    # A quoted post's author.
    assert query("SELECT quoted_author_handle, quoted_author_name FROM bookmarks "
                 "WHERE tweet_id = '2085447188344197368'") == [("AdamKinzinger", "Adam Kinzinger (Slava Ukraini) 🇺🇸🇺🇦")]
    assert query("SELECT name FROM authors WHERE handle = 'AdamKinzinger'") == [("Adam Kinzinger (Slava Ukraini) 🇺🇸🇺🇦",)]

    # A video's smallest and best MP4, and every variant (manual_tweet_with_video_1.json).
    smallest, best, variants = query(
        "SELECT smallest_mp4, best_mp4, variants FROM media WHERE media_key = '7_1668857866328100864'")[0]
    assert smallest == "https://video.twimg.com/ext_tw_video/1668857866328100864/pu/vid/320x568/pY6q1h6ISkvyHc0F.mp4?tag=12"
    assert best == "https://video.twimg.com/ext_tw_video/1668857866328100864/pu/vid/720x1280/ENfeGwtfyiYvpNy8.mp4?tag=12"
    assert [v.get("bitrate") for v in json.loads(variants)] == [None, 632000, 950000, 2176000]

    # A card's target, resolved through the post's (note_tweet) entities.
    assert query("SELECT kind, url_norm, tco_url FROM links WHERE tweet_id = '2085471763383853110'") == [(
        "card", "https://kyivindependent.com/i-have-no-moral-right-to-engage-in-anything-else-fedorov-hopes-for-"
                "reinstatement-as-defense-minister", "https://t.co/FnojEUDFJI")]

    # The article inside a quoted retweet (raw_user_tweets.json).
    assert query("SELECT article_title, article_from_quote, retweeted_by_handle FROM bookmarks "
                 "WHERE tweet_id = '2079821023071907954'") == [(
                     "Turn your X account into a programmable intelligence system using the X API and Grok Build",
                     True, "XDevelopers")]

    meta = metadata(result, "bookmarks")
    assert meta["bookmarks_in_batch"] == len(entries)
    assert meta["removal_sweep"] == "run" and meta["marked_removed"] == 0
    assert metadata(result, "links")["unresolved_card_list"] == [
        "post 1696922210588410217: card https://twitter.com is not in the post's url entities"]


@pytest.mark.slow
def test_rematerializing_never_duplicates_and_the_later_batch_wins(instance):
    entries = all_tweet_entries()
    write_raw_batch(B1, paged_bookmarks(entries, page_size=50), full=False)
    normalize(instance, B1)
    first = table_counts()
    normalize(instance, B1)
    assert table_counts() == first

    # A second batch holds 30 of the same posts; one post's text was edited.
    again = copy.deepcopy(entries[:30])
    edited = again[6]["content"]["itemContent"]["tweet_results"]["result"]["legacy"]
    edited["full_text"] = "Edited text &amp; more"
    write_raw_batch(B2, [bookmarks_page(again, bottom_cursor="x")], full=False)
    normalize(instance, B2)

    assert table_counts() == first
    assert query("SELECT count(*) FROM bookmarks WHERE batch = ?", [B2]) == [(30,)]
    assert query("SELECT text FROM bookmarks WHERE tweet_id = ?", [ids(entries)[6]]) == [("Edited text & more",)]
    # Media and links follow their bookmark: no row of B1 remains for a post of B2.
    assert query("SELECT count(*) FROM media m JOIN bookmarks b USING (tweet_id) WHERE m.batch <> b.batch") == [(0,)]
    assert query("SELECT count(*) FROM links l JOIN bookmarks b USING (tweet_id) WHERE l.batch <> b.batch") == [(0,)]


@pytest.mark.slow
def test_soft_delete_and_restore_with_full_captures(instance):
    entries = all_tweet_entries()
    kept = [e for e in entries if e["entryId"].removeprefix("tweet-") not in GONE]
    write_raw_batch(B1, paged_bookmarks(entries, page_size=60), full=True)
    normalize(instance, B1)

    # A complete --full capture without three bookmarks marks them; nothing is deleted.
    write_raw_batch(B2, paged_bookmarks(kept, page_size=60), full=True)
    result = normalize(instance, B2)
    assert metadata(result, "bookmarks")["marked_removed"] == 3
    assert table_counts()["bookmarks"] == len(entries)
    assert sorted(r[0] for r in query("SELECT tweet_id FROM bookmarks WHERE removed_at IS NOT NULL")) == sorted(GONE)

    # An incremental capture that sees one of them again clears its removed_at.
    back = [e for e in entries if e["entryId"] == f"tweet-{GONE[0]}"]
    write_raw_batch(B3, [bookmarks_page(back, bottom_cursor="x")], full=False)
    result = normalize(instance, B3)
    assert metadata(result, "bookmarks")["restored"] == 1
    assert sorted(r[0] for r in query("SELECT tweet_id FROM bookmarks WHERE removed_at IS NOT NULL")) == sorted(GONE[1:])

    # A --full capture that was cut off says nothing about what is gone.
    write_raw_batch(B4, [bookmarks_page(kept[:10], bottom_cursor="x")], full=True, complete=False)
    result = normalize(instance, B4)
    assert metadata(result, "bookmarks")["removal_sweep"] == "not run: the --full capture did not reach the end"
    assert query("SELECT count(*) FROM bookmarks WHERE removed_at IS NOT NULL") == [(2,)]

    # A complete --full capture that sees all of them restores all.
    write_raw_batch(B5, paged_bookmarks(entries, page_size=60), full=True)
    normalize(instance, B5)
    assert query("SELECT count(*) FROM bookmarks WHERE removed_at IS NOT NULL") == [(0,)]

    # Re-running the older --full batch B2 does not mark bookmarks that the
    # newer batch B5 stored.
    result = normalize(instance, B2)
    assert metadata(result, "bookmarks")["marked_removed"] == 0
    assert query("SELECT count(*) FROM bookmarks WHERE removed_at IS NOT NULL") == [(0,)]
    assert table_counts()["bookmarks"] == len(entries)


@pytest.mark.slow
def test_a_bad_page_is_kept_and_named_and_the_rest_normalizes(instance):
    entries = all_tweet_entries()
    write_raw_batch(B1, paged_bookmarks(entries, page_size=60), full=True)
    normalize(instance, B1)

    not_json = b"<html><body>Something went wrong</body></html>"
    wrong_shape = json.dumps({"errors": [{"message": "Rate limit exceeded", "code": 88}]}).encode()
    pages = [bookmarks_page(entries[:20], bottom_cursor="a"), not_json, wrong_shape,
             bookmarks_page(entries[20:40], bottom_cursor="b")]
    paths = write_raw_batch(B2, pages, full=True)
    result = normalize(instance, B2)

    assert result.success
    meta = metadata(result, "bookmarks")
    assert meta["bad_pages"] == 2
    assert f"{B2}/page-0002.json | not JSON" in meta["bad_page_list"]
    assert f"{B2}/page-0003.json | not a Bookmarks page (X returned errors:" in meta["bad_page_list"]
    assert "Rate limit exceeded" in meta["bad_page_list"]
    problems = query("SELECT raw_file, reason FROM capture_problems WHERE batch = ? ORDER BY raw_file", [B2])
    assert [p[0] for p in problems] == [f"{B2}/page-0002.json", f"{B2}/page-0003.json"]
    assert problems[0][1].startswith("not JSON")

    # The bad pages stay on disk byte for byte.
    assert paths[1].read_bytes() == not_json and paths[2].read_bytes() == wrong_shape
    # The good pages normalized.
    assert query("SELECT count(*) FROM bookmarks WHERE batch = ?", [B2]) == [(40,)]
    # The bookmarks of the unreadable pages are unknown, so nothing is marked removed.
    assert meta["removal_sweep"] == "not run: 2 raw page(s) could not be read"
    assert query("SELECT count(*) FROM bookmarks WHERE removed_at IS NOT NULL") == [(0,)]

    # Re-running replaces the problem rows too.
    normalize(instance, B2)
    assert len(query("SELECT * FROM capture_problems WHERE batch = ?", [B2])) == 2


@pytest.mark.slow
def test_unknown_entry_kinds_are_counted_in_the_metadata(instance):
    payload = json.loads(x_fixture("raw_user_tweets.json").read_text())
    modules = [e for e in _walk_entries(payload) if not e["entryId"].startswith(("tweet-", "cursor-"))]
    write_raw_batch(B1, [bookmarks_page(all_tweet_entries()[:5] + modules, bottom_cursor="x")], full=False)
    result = normalize(instance, B1)
    assert result.success
    assert metadata(result, "bookmarks")["unknown_entries"] == {"who-to-follow": 1, "profile-conversation": 1}
    assert table_counts()["bookmarks"] == 5


@pytest.mark.slow
def test_checks_fail_on_rows_that_break_the_rules(instance):
    entries = all_tweet_entries()
    write_raw_batch(B1, [bookmarks_page(entries[:10], bottom_cursor="x")], full=False)
    normalize(instance, B1)
    with DuckDBStore.from_settings().transaction() as conn:
        conn.execute("""INSERT INTO bookmarks (tweet_id, batch, sort_index, url, author_id, text, is_long,
                        raw_file, captured_at) VALUES ('999', 'old', '5', 'https://x.com/i/status/999', 'nobody',
                        'orphan', false, 'old/page-0001.json', now())""")
        conn.execute("""INSERT INTO links (tweet_id, url_norm, position, expanded_url, host, kind, from_quote, batch)
                        VALUES ('999', 'https://Example.com/A/', 0, 'https://Example.com/A/', 'example.com',
                        'link', false, 'old')""")
    write_raw_batch(B2, [bookmarks_page(entries[10:12], bottom_cursor="x")], full=False)
    result = normalize(instance, B2)
    assert checks(result) == {"every_bookmark_has_author_and_sort_index": False, "no_duplicate_ids": True,
                              "every_link_has_normalized_url": False}
    with DuckDBStore.from_settings().connect() as conn:
        assert bookmarks_missing_author_or_sort_index(conn) == ["999"]
        assert links_not_normalized(conn) == [
            "999: https://Example.com/A/ -> 'https://Example.com/A/' (expected 'https://example.com/A')"]


def test_duplicate_keys_are_found_where_no_primary_key_stops_them():
    # The real tables have primary keys; the check guards against losing them.
    with duckdb.connect() as conn:
        conn.execute("CREATE TABLE bookmarks (tweet_id VARCHAR)")
        conn.execute("CREATE TABLE media (tweet_id VARCHAR, media_key VARCHAR)")
        conn.execute("CREATE TABLE links (tweet_id VARCHAR, url_norm VARCHAR)")
        conn.execute("INSERT INTO bookmarks VALUES ('1'), ('1'), ('2')")
        conn.execute("INSERT INTO links VALUES ('2', 'https://a.example'), ('2', 'https://a.example')")
        assert duplicate_keys(conn) == {"bookmarks": ["1"], "links": ["2 https://a.example"]}


def test_a_batch_without_raw_pages_fails_with_a_clear_reason(instance):
    result = normalize(instance, B1, raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message
    assert f"Batch {B1} has no raw pages and no capture.json" in message
