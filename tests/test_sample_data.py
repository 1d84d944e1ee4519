"""The sample capture that `kb demo` ships (kb/sample_data).

The pages must read like a real Bookmarks capture: the capture helpers and
the normalizer read them with no special case. The expected values here
come from the posts in generate.py (the plain source), and the parser must
find them in the JSON pages.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from datetime import datetime, timezone
from functools import cache

import pytest

from kb.x import graphql as x_graphql
from kb.x.post_rows import parse_page
from kb.sample_data import DEMO_QUERIES, SAMPLE_DIR, sample_pages
import make_sample_data as generate  # benchmarks/ is on the test path (pyproject)

MAX_TOTAL_BYTES = 200_000


@cache
def _raw_pages() -> tuple[tuple[str, bytes], ...]:
    return tuple((path.name, path.read_bytes()) for path in sample_pages())


def _payloads() -> list[tuple[str, dict]]:
    return [(name, x_graphql.load_page(raw, name=name)) for name, raw in _raw_pages()]


def _tweet_entries() -> list[dict]:
    return [e for _, payload in _payloads() for e in x_graphql.timeline_entries(payload)
            if e["entryId"].startswith("tweet-")]


def _results() -> list[dict]:
    return [e["content"]["itemContent"]["tweet_results"]["result"] for e in _tweet_entries()]


def _all_tweets() -> list[dict]:
    """Every Tweet object: the bookmarked ones and the quoted ones."""
    out = []
    for result in _results():
        tweet = x_graphql.unwrap_tweet(result)
        if tweet is None:
            continue
        out.append(tweet)
        quoted = x_graphql.unwrap_tweet((tweet.get("quoted_status_result") or {}).get("result"))
        if quoted is not None:
            out.append(quoted)
    return out


def _plain_text(key: str) -> str:
    """A post's text as generate.py has it, with each link mark replaced by its URL."""
    return generate.LINK_MARK.sub(lambda m: m["url"], generate.POSTS_BY_KEY[key].text)


def _id(key: str) -> str:
    return generate.tweet_id_of(generate.POSTS_BY_KEY[key])


# --- the files ------------------------------------------------------------


def test_sample_pages_are_json_in_the_bookmarks_envelope():
    pages = sample_pages()
    assert [p.name for p in pages] == [f"page-{n:04d}.json" for n in range(1, len(pages) + 1)]
    for name, raw in _raw_pages():
        payload = json.loads(raw)  # plain JSON, no special reader
        instructions = payload["data"]["bookmark_timeline_v2"]["timeline"]["instructions"]
        assert [i["type"] for i in instructions] == ["TimelineAddEntries"], name
        entries = instructions[0]["entries"]
        kinds = Counter(e["entryId"].split("-")[0] for e in entries)
        assert set(kinds) <= {"tweet", "cursor"}, name
        cursors = {e["content"]["cursorType"]: e for e in entries if e["entryId"].startswith("cursor-")}
        assert set(cursors) == {"Top", "Bottom"}, name
        for kind, entry in cursors.items():
            assert entry["entryId"] == f"cursor-{kind.lower()}-{entry['sortIndex']}"
            assert entry["content"]["entryType"] == "TimelineTimelineCursor"
        for entry in entries:
            if entry["entryId"].startswith("tweet-"):
                content = entry["content"]
                assert content["entryType"] == "TimelineTimelineItem"
                assert content["itemContent"]["itemType"] == "TimelineTweet"
                assert "result" in content["itemContent"]["tweet_results"]


def test_every_page_reads_through_the_capture_helpers():
    summaries = [x_graphql.summarize_page(payload, name=name) for name, payload in _payloads()]
    counts = [len(s.tweets) for s in summaries]
    # About 40 bookmarks on three pages, then the page with cursors only that ends a timeline.
    assert counts[:-1] == list(generate.PAGE_SIZES) and counts[-1] == 0
    assert sum(counts) == 40
    cursors = [s.bottom_cursor for s in summaries]
    assert all(cursors) and len(set(cursors)) == len(cursors)


def test_tweet_ids_are_unique_and_match_the_entry_ids():
    ids = [e["entryId"].removeprefix("tweet-") for e in _tweet_entries()]
    assert len(ids) == len(set(ids))
    for entry in _tweet_entries():
        tweet = x_graphql.unwrap_tweet(entry["content"]["itemContent"]["tweet_results"]["result"])
        if tweet is not None:
            assert entry["entryId"] == f"tweet-{tweet['rest_id']}" == f"tweet-{tweet['legacy']['id_str']}"


def test_sort_index_falls_across_all_pages_and_differs_from_post_order():
    sort_indexes = []
    for _, payload in _payloads():
        entries = x_graphql.timeline_entries(payload)
        tweets = [int(e["sortIndex"]) for e in entries if e["entryId"].startswith("tweet-")]
        top = int(next(e["sortIndex"] for e in entries if e["entryId"].startswith("cursor-top-")))
        bottom = int(next(e["sortIndex"] for e in entries if e["entryId"].startswith("cursor-bottom-")))
        if tweets:
            assert top > tweets[0] and bottom < tweets[-1]
        sort_indexes += tweets
    assert all(a > b for a, b in zip(sort_indexes, sort_indexes[1:])), "sortIndex must fall, newest bookmark first"

    # Bookmark order is not post order: a reader that sorts by post time is wrong here.
    post_times = [datetime.strptime(t["legacy"]["created_at"], generate.TWEET_TIME_FORMAT)
                  for t in (x_graphql.unwrap_tweet(r) for r in _results()) if t is not None]
    assert post_times != sorted(post_times, reverse=True)


def test_pages_are_exactly_what_generate_writes():
    """A hand edit of a page, or a change to generate.py without a re-run, fails here."""
    # Compared as JSON, not as bytes: a checkout that changes line ends must not fail.
    built = [json.loads(generate.page_bytes(page)) for page in generate.build_pages()]
    shipped = [json.loads(raw) for _, raw in _raw_pages()]
    assert len(built) == len(shipped)
    for number, (want, have) in enumerate(zip(built, shipped), start=1):
        assert want == have, f"{generate.page_name(number)} differs: run python benchmarks/make_sample_data.py"


def test_pages_are_small():
    total = sum(len(raw) for _, raw in _raw_pages())
    assert total < MAX_TOTAL_BYTES, f"sample pages are {total} bytes"


# --- the shapes of real X tweet objects -------------------------------------


def test_sample_holds_every_kind_of_post_that_the_normalizer_must_read():
    results = _results()
    tweets = _all_tweets()
    typenames = Counter(r["__typename"] for r in results)
    assert typenames["TweetWithVisibilityResults"] == 1
    assert typenames["TweetTombstone"] == 1
    media = [m for t in tweets for m in t["legacy"].get("extended_entities", {}).get("media", [])]
    kinds = Counter(m["type"] for m in media)
    assert kinds["photo"] >= 5 and kinds["video"] >= 3 and kinds["animated_gif"] == 1
    assert all(m.get("ext_alt_text") for m in media if m["type"] == "photo")
    for video in (m for m in media if m["type"] == "video"):
        variants = video["video_info"]["variants"]
        assert any(v["content_type"] == "application/x-mpegURL" for v in variants)
        assert len({v["bitrate"] for v in variants if v["content_type"] == "video/mp4"}) >= 3
    assert sum("note_tweet" in t for t in tweets) >= 4
    assert sum("quoted_status_result" in t for t in tweets) >= 3
    cards = [t["card"]["legacy"] for t in tweets if "legacy" in t.get("card", {})]
    assert {c["name"] for c in cards} >= {"summary", "summary_large_image", "poll4choice_text_only"}
    articles = [t["article"]["article_results"]["result"] for t in tweets if "article" in t]
    assert len(articles) == 2 and sum("content_state" in a for a in articles) == 1
    langs = Counter(t["legacy"]["lang"] for t in tweets)
    assert {"de", "ru", "ja", "zxx"} <= set(langs)
    users = [t["core"]["user_results"]["result"] for t in tweets]
    assert any("core" in u for u in users) and any("legacy" in u for u in users)
    handles = Counter((u.get("core") or u.get("legacy"))["screen_name"] for u in users)
    assert sum(1 for n in handles.values() if n >= 2) >= 8, "authors must repeat across posts"


def test_entity_indices_select_their_text():
    """As in the captures: indices count characters of the HTML-escaped
    legacy.full_text, and of the unescaped note_tweet text."""
    checked = 0
    for tweet in _all_tweets():
        legacy = tweet["legacy"]
        text = legacy["full_text"]
        start, end = legacy["display_text_range"]
        assert 0 <= start <= end <= len(text)
        assert html.escape(html.unescape(text), quote=False) == text, "full_text must be HTML-escaped"
        note = tweet.get("note_tweet", {}).get("note_tweet_results", {}).get("result")
        sets = [(text, legacy["entities"])]
        if note:
            sets.append((note["text"], note["entity_set"]))
            assert html.unescape(note["text"]).startswith(html.unescape(text[:end]))
        for body, entities in sets:
            for url in entities.get("urls", []):
                assert body[slice(*url["indices"])] == url["url"]
                assert re.fullmatch(r"https://t\.co/\w{10}", url["url"])
                checked += 1
            for mention in entities.get("user_mentions", []):
                assert body[slice(*mention["indices"])] == "@" + mention["screen_name"]
                checked += 1
            for tag in entities.get("hashtags", []):
                assert body[slice(*tag["indices"])] == "#" + tag["text"]
                checked += 1
        for item in legacy.get("extended_entities", {}).get("media", []):
            assert text[slice(*item["indices"])] == item["url"]
            assert item["indices"][0] >= end
    assert checked >= 20


def test_link_cards_name_a_tco_address_that_the_post_entities_hold():
    for tweet in _all_tweets():
        card = tweet.get("card", {}).get("legacy")
        if not card or card["name"].startswith("poll"):
            continue
        card_url = next(b["value"]["string_value"] for b in card["binding_values"] if b["key"] == "card_url")
        note = tweet.get("note_tweet", {}).get("note_tweet_results", {}).get("result", {})
        entity_urls = tweet["legacy"]["entities"].get("urls", []) + note.get("entity_set", {}).get("urls", [])
        assert card_url in {u["url"] for u in entity_urls}, tweet["rest_id"]
        assert card_url == card["url"] == tweet["card"]["rest_id"]


def test_links_point_to_example_domains_only():
    """The demo must not reach out: no link target outside example.com/.org and x.com."""
    for tweet in _all_tweets():
        note = tweet.get("note_tweet", {}).get("note_tweet_results", {}).get("result", {})
        for url in tweet["legacy"]["entities"].get("urls", []) + note.get("entity_set", {}).get("urls", []):
            host = url["expanded_url"].split("/")[2]
            assert host in ("example.com", "example.org", "x.com"), url["expanded_url"]


# --- the demo searches ----------------------------------------------------


def test_rare_keyword_occurs_in_exactly_one_post():
    rare = next(q for q in DEMO_QUERIES if q.query == "Zephyrine-9")
    holders = [t for t in _all_tweets()
               if rare.query.lower() in json.dumps(t, ensure_ascii=False).lower()]
    assert len(holders) == 1
    user = holders[0]["core"]["user_results"]["result"]
    assert (user.get("core") or user.get("legacy"))["screen_name"] == rare.expected_author


def test_each_demo_query_names_an_author_of_the_sample():
    handles = {generate.POSTS_BY_KEY[key].author for key in generate.POSTS_BY_KEY}
    for demo in DEMO_QUERIES:
        assert demo.expected_author in handles, demo
        assert demo.query.strip() and demo.why


def test_sample_pages_names_the_folder_when_it_is_empty(tmp_path, monkeypatch):
    import kb.sample_data as sample_data

    monkeypatch.setattr(sample_data, "SAMPLE_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        sample_data.sample_pages()


# --- the normalizer reads the sample --------------------------------------


@pytest.fixture(scope="module")
def parsed():
    pages = [parse_page(payload, raw_file=name, batch="sample",
                                  captured_at=datetime(2026, 3, 28, tzinfo=timezone.utc))
             for name, payload in _payloads()]
    bookmarks = {b["tweet_id"]: b for page in pages for b in page.bookmarks}
    return pages, bookmarks


def test_parser_reads_every_bookmark_without_problems(parsed):
    pages, bookmarks = parsed
    assert [p for page in pages for p in page.problems] == []
    assert sum(sum(page.unknown_entries.values()) for page in pages) == 0
    assert len(bookmarks) == len(generate.POSTS)
    unavailable = [i for page in pages for i in page.unavailable_tweet_ids]
    assert len(unavailable) == 1 and unavailable[0] not in bookmarks
    # The post wrapped in TweetWithVisibilityResults is read like any other.
    assert bookmarks[_id("vl_rerank")]["text"] == _plain_text("vl_rerank")
    # legacy.full_text is HTML-escaped; the stored text is not.
    assert "2 hits & no warning" in bookmarks[_id("db_filters")]["text"]
    assert "< 5%" in bookmarks[_id("sam_vacuum")]["text"]


def test_parser_reads_the_long_post_from_note_tweet(parsed):
    _, bookmarks = parsed
    row = bookmarks[_id("db_duckdb")]
    assert row["is_long"] is True
    assert row["text"] == _plain_text("db_duckdb")
    assert row["text"].endswith("https://example.org/blog/why-duckdb-is-fast")
    japanese = bookmarks[_id("tanaka_bm25")]
    assert japanese["is_long"] is True and japanese["lang"] == "ja"
    assert japanese["text"] == _plain_text("tanaka_bm25")


def test_parser_reads_the_quoted_post(parsed):
    _, bookmarks = parsed
    row = bookmarks[_id("rome_quote_ru")]
    assert row["quoted_tweet_id"] == _id("ru_tetrarchy")
    assert row["quoted_author_handle"] == "istoriya_rim"
    assert row["quoted_author_name"] == "Алексей Смирнов"
    assert row["quoted_text"] == _plain_text("ru_tetrarchy")
    # The quoted author has the older user format: name in legacy, not core.
    assert bookmarks[_id("bread_quote")]["quoted_author_handle"] == "kitchenphysics"


def test_parser_resolves_card_targets_through_the_entities(parsed):
    pages, _ = parsed
    links = {(l["tweet_id"], l["expanded_url"]): l for page in pages for l in page.links}
    # A long post: its card's t.co is only in the note_tweet entity set.
    duckdb = links[(_id("db_duckdb"), "https://example.org/blog/why-duckdb-is-fast")]
    assert duckdb["kind"] == "card"
    assert duckdb["card_title"] == "Why DuckDB is fast: columnar storage and vectorized execution"
    wal = links[(_id("db_sqlite_wal"), "https://example.com/docs/sqlite/wal")]
    assert wal["kind"] == "card" and wal["card_title"] == "Write-Ahead Logging"
    # A poll names https://twitter.com: no link, and it is reported, not guessed.
    poll_links = [l for (tweet_id, _), l in links.items() if tweet_id == _id("db_poll")]
    assert poll_links == []
    unresolved = [c for page in pages for c in page.unresolved_cards]
    assert len(unresolved) == 1 and _id("db_poll") in unresolved[0]


def test_parser_chooses_video_variants_by_bitrate(parsed):
    pages, _ = parsed
    media = [m for page in pages for m in page.media]
    video = next(m for m in media if m["tweet_id"] == _id("sam_pitr_video"))
    variants = json.loads(video["variants"])
    # The variants of this post are out of order on purpose.
    assert [v.get("bitrate") for v in variants] == [832000, None, 2176000, 256000]
    assert "/480x270/" in video["smallest_mp4"] and "/1280x720/" in video["best_mp4"]
    assert video["duration_ms"] // 1000 == generate.POSTS_BY_KEY["sam_pitr_video"].video.duration_s
    gif = next(m for m in media if m["kind"] == "animated_gif")
    assert gif["smallest_mp4"] == gif["best_mp4"] and gif["smallest_mp4"].endswith(".mp4")
    photos = [m for m in media if m["tweet_id"] == _id("vl_recall_chart")]
    assert [m["alt_text"] for m in photos] == [p.alt for p in generate.POSTS_BY_KEY["vl_recall_chart"].photos]


def test_parser_reads_the_article_body_from_content_state(parsed):
    _, bookmarks = parsed
    article = generate.POSTS_BY_KEY["ml_article"].article
    row = bookmarks[_id("ml_article")]
    assert row["article_title"] == article.title
    assert row["article_text"].splitlines() == [text for _, text, _ in article.blocks]
    preview_only = bookmarks[_id("rome_roads")]
    assert preview_only["article_title"] == "How Roman roads were built"
    assert preview_only["article_text"] is None and preview_only["article_preview"]


def test_parser_drops_the_reply_handles_that_x_hides(parsed):
    """A reply's full_text starts with the @handles it answers; X shows the
    text from display_text_range[0] on, and so does the parser."""
    _, bookmarks = parsed
    replies = [e for e in _tweet_entries()
               if x_graphql.unwrap_tweet(e["content"]["itemContent"]["tweet_results"]["result"]) is not None
               and (x_graphql.unwrap_tweet(e["content"]["itemContent"]["tweet_results"]["result"])["legacy"]
                    .get("display_text_range", [0])[0] > 0)]
    assert replies, "the sample has a reply"
    for entry in replies:
        legacy = x_graphql.unwrap_tweet(entry["content"]["itemContent"]["tweet_results"]["result"])["legacy"]
        assert legacy["full_text"].startswith("@")
        row = bookmarks[entry["entryId"].removeprefix("tweet-")]
        assert not row["text"].startswith("@"), row["text"]
