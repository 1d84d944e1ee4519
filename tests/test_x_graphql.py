"""The Bookmarks page parser and normalize_url, on the real X captures.

Every expected value below was read in ../shared/fixtures/x/*.json (the
tweet id names the post), not taken from the parser's output.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone

import pytest

from kb.urls import normalize_url, url_host
from kb.x.graphql import PageShapeError, article_plain_text, load_page
from kb.x.post_rows import entry_kind, parse_page, video_variant_choice
from tests.shared_data import x_fixture
from tests.x_fixtures import _walk_entries, all_tweet_entries, bookmarks_page

CAPTURED_AT = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def parse(entries: list[dict], raw_file: str = "page-0001.json"):
    return parse_page(bookmarks_page(entries, bottom_cursor="next"), raw_file=raw_file, batch="b1",
                      captured_at=CAPTURED_AT)


@functools.cache
def _entries_by_id() -> dict[str, str]:
    return {item["entryId"]: json.dumps(item) for item in all_tweet_entries()}


def entry(tweet_id: str) -> dict:
    """A fresh copy of one real tweet entry; a test may change it."""
    raw = _entries_by_id().get(f"tweet-{tweet_id}")
    assert raw is not None, f"tweet {tweet_id} is not in the captures"
    return json.loads(raw)


@pytest.fixture(scope="module")
def all_parsed():
    return parse(all_tweet_entries())


def bookmark(page, tweet_id: str) -> dict:
    (row,) = [b for b in page.bookmarks if b["tweet_id"] == tweet_id]
    return row


# --- normalize_url ------------------------------------------------------------


@pytest.mark.parametrize("url, key", [
    # rule 2: scheme and host lowercase, the path keeps its case
    ("HTTPS://Example.COM/Some/Path", "https://example.com/Some/Path"),
    # rule 3: trailing dot of the host
    ("https://example.com./a", "https://example.com/a"),
    # rule 4: default ports go, other ports stay
    ("http://example.com:80/a", "http://example.com/a"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("https://example.com:8443/a", "https://example.com:8443/a"),
    # rule 5: every X host is https://x.com (both spellings occur in the captures)
    ("http://x.com/i/article/2079162061142335488", "https://x.com/i/article/2079162061142335488"),
    ("https://twitter.com/i/broadcasts/1BRJjPqnBqaKw", "https://x.com/i/broadcasts/1BRJjPqnBqaKw"),
    ("https://mobile.twitter.com/a/status/1", "https://x.com/a/status/1"),
    # rule 6: fragment
    ("https://example.com/a#section-2", "https://example.com/a"),
    # rule 7: tracking parameters (a real link from the captures, then the named ones)
    ("https://www.theatlantic.com/national-security/2026/08/shortage-weapons-shaping-war-iran/688201/"
     "?gift=otEsSHbRYKNfFYMngVFweFDaSg0M2M_69LDM6UxpeFc&utm_source=copy-link&utm_medium=social&utm_campaign=share",
     "https://www.theatlantic.com/national-security/2026/08/shortage-weapons-shaping-war-iran/688201"
     "?gift=otEsSHbRYKNfFYMngVFweFDaSg0M2M_69LDM6UxpeFc"),
    ("https://example.com/a?fbclid=1&gclid=2&ref_src=twsrc%5Etfw&UTM_Term=x&id=7", "https://example.com/a?id=7"),
    # rule 8: query order
    ("https://example.com/a?b=2&a=1", "https://example.com/a?a=1&b=2"),
    # rule 9: trailing slashes; "/" and "" are one key (both occur in one post of the captures)
    ("https://www.americanexperiment.app/", "https://www.americanexperiment.app"),
    ("https://www.americanexperiment.app", "https://www.americanexperiment.app"),
    ("https://example.com/a/b//", "https://example.com/a/b"),
    # rule 1: spaces around
    ("  https://example.com/a  ", "https://example.com/a"),
])
def test_normalize_url_rules(url, key):
    assert normalize_url(url) == key


@pytest.mark.parametrize("url", ["example.com/a", "/relative/path", "mailto:", ""])
def test_normalize_url_rejects_addresses_without_scheme_or_host(url):
    with pytest.raises(ValueError, match="not an absolute web address"):
        normalize_url(url)


def test_url_host_is_the_normalized_host():
    assert url_host("https://WWW.Twitter.com/i/spaces/1vOxwjaWEbdJB") == "x.com"
    assert url_host("http://dlvr.it:80/TTv115") == "dlvr.it"


# --- page shape ---------------------------------------------------------------


def test_a_page_that_is_not_json_names_the_file():
    with pytest.raises(PageShapeError, match=r"page-0007\.json: not JSON"):
        load_page(b"<html>rate limited</html>", name="page-0007.json")


def test_a_page_of_another_shape_names_the_file_and_the_errors():
    payload = {"errors": [{"message": "Could not authenticate you", "code": 32}]}
    with pytest.raises(PageShapeError, match=r"page-0002\.json: not a Bookmarks page .*Could not authenticate"):
        parse_page(payload, raw_file="page-0002.json", batch="b1", captured_at=CAPTURED_AT)


def test_a_list_at_the_top_is_not_a_page():
    with pytest.raises(PageShapeError, match="top level is list"):
        load_page(b"[1, 2]", name="p.json")


# --- every real capture -------------------------------------------------------


def test_every_real_tweet_entry_becomes_a_bookmark(all_parsed):
    entries = all_tweet_entries()
    assert [b["tweet_id"] for b in all_parsed.bookmarks] == [e["entryId"].removeprefix("tweet-") for e in entries]
    assert all_parsed.problems == []
    assert all_parsed.unknown_entries == {}
    # Author ids, sort indexes and link keys are never empty.
    assert all(b["author_id"] and b["author_handle"] and b["sort_index"] for b in all_parsed.bookmarks)
    assert {b["author_id"] for b in all_parsed.bookmarks} <= {a["author_id"] for a in all_parsed.authors}
    assert all(link["url_norm"] == normalize_url(link["expanded_url"]) for link in all_parsed.links)
    assert all(b["sort_index"] == e["sortIndex"] for b, e in zip(all_parsed.bookmarks, entries))


def test_long_post_text_comes_from_note_tweet(all_parsed):
    row = bookmark(all_parsed, "2085421175648248224")
    assert row["is_long"] is True
    assert row["text"].startswith("The top Dem on the Senate Foreign Relations Committee says")
    # Past the 273 characters of legacy.full_text:
    assert "are never used to develop a nuclear weapon." in row["text"]
    assert len(row["text"]) == 553


def test_legacy_text_is_unescaped_and_note_text_is_not(all_parsed):
    # legacy.full_text of 2082642229944778990 (a retweet) holds "&amp;"; the retweeted post is read.
    row = bookmark(all_parsed, "2082642229944778990")
    assert row["text"].startswith("ladies & gentlemen, we have officially launched our X Chat API & Chat XDK.")
    assert "&amp;" not in row["text"]
    # The note_tweet text of 2075716337603907695 holds a raw ">": it stays.
    quoting = bookmark(all_parsed, "2075724225273323678")
    assert quoting["quoted_tweet_id"] == "2075716337603907695"
    assert ">" in quoting["quoted_text"] and "&gt;" not in quoting["quoted_text"]


def test_tco_links_in_text_are_expanded_and_media_links_removed(all_parsed):
    # full_text ends in the photo's t.co link https://t.co/9zIidhrEIW.
    row = bookmark(all_parsed, "2085472697924890822")
    assert row["text"].endswith("At least we have something in common! President DONALD J. TRUMP")
    assert "t.co" not in row["text"]
    broadcast = bookmark(all_parsed, "1790441814857826439")
    assert broadcast["text"] == "Migrating developer apps to the X API 2 https://twitter.com/i/broadcasts/1BRJjPqnBqaKw"


def test_quoted_post_with_author_text_and_media(all_parsed):
    row = bookmark(all_parsed, "2085447188344197368")
    assert row["quoted_tweet_id"] == "2085381798939296027"
    assert row["quoted_author_handle"] == "AdamKinzinger"
    assert row["quoted_author_name"] == "Adam Kinzinger (Slava Ukraini) 🇺🇸🇺🇦"
    assert row["quoted_text"].startswith("We blew all our air defense in a stupid war that we lost.")
    assert "AdamKinzinger" in {a["handle"] for a in all_parsed.authors}


def test_quoted_post_inside_tweet_with_visibility_results(all_parsed):
    # The quote of 2085438033092923507 is a TweetWithVisibilityResults.
    row = bookmark(all_parsed, "2085438033092923507")
    assert row["quoted_author_handle"] == "CSPC_DC"
    assert row["quoted_text"].startswith("CSPC is launching a new research project")
    media = [m for m in all_parsed.media if m["tweet_id"] == "2085438033092923507"]
    assert [(m["kind"], m["media_key"], m["from_quote"]) for m in media] == [("photo", "3_2085086360361213952", True)]
    assert media[0]["url"] == "https://pbs.twimg.com/media/HO-2_1tXoAAIW7o.jpg"


def test_video_keeps_every_variant_and_smallest_and_best_mp4(all_parsed):
    (video,) = [m for m in all_parsed.media if m["tweet_id"] == "1671508600538161153"]
    assert video["kind"] == "video"
    assert video["media_key"] == "7_1668857866328100864"
    assert video["duration_ms"] == 5434
    assert video["smallest_mp4"] == \
        "https://video.twimg.com/ext_tw_video/1668857866328100864/pu/vid/320x568/pY6q1h6ISkvyHc0F.mp4?tag=12"
    assert video["best_mp4"] == \
        "https://video.twimg.com/ext_tw_video/1668857866328100864/pu/vid/720x1280/ENfeGwtfyiYvpNy8.mp4?tag=12"
    variants = json.loads(video["variants"])
    assert len(variants) == 4  # the HLS playlist and three MP4s
    assert variants[0]["content_type"] == "application/x-mpegURL"


def test_retweeted_video_comes_from_the_retweeted_post(all_parsed):
    (video,) = [m for m in all_parsed.media if m["tweet_id"] == "2085473570625294744"]
    assert video["smallest_mp4"].endswith("/vid/avc1/480x270/Mol8y7h67N0PneUc.mp4?tag=14")
    assert video["best_mp4"].endswith("/vid/avc1/1280x720/pJEKHkdpGXRs8EBg.mp4?tag=14")


def test_animated_gif_from_the_conversation_capture():
    payload = json.loads(x_fixture("raw_tweet_details.json").read_text())
    gif_items = [e for e in _walk_entries(payload) if "animated_gif" in json.dumps(e)]
    item_content = gif_items[0]["content"]["items"][0]["item"]["itemContent"]
    tweet_id = item_content["tweet_results"]["result"]["rest_id"]
    page = parse([{"entryId": f"tweet-{tweet_id}", "sortIndex": "1800000000000000000",
                   "content": {"entryType": "TimelineTimelineItem", "itemContent": item_content}}])
    (gif,) = page.media
    assert gif["kind"] == "animated_gif"
    assert gif["alt_text"] == "James Franco Omg GIF"
    assert gif["smallest_mp4"] == gif["best_mp4"] == "https://video.twimg.com/tweet_video/FuNcOVrXoAIGi0f.mp4"


def test_card_target_comes_from_the_note_tweet_entities(all_parsed):
    # 2085471763383853110 is a long post: its legacy entities are empty, and
    # the card's t.co (FnojEUDFJI) is only in the note_tweet entity set.
    (link,) = [x for x in all_parsed.links if x["tweet_id"] == "2085471763383853110"]
    assert link["kind"] == "card"
    assert link["tco_url"] == "https://t.co/FnojEUDFJI"
    assert link["expanded_url"] == ("https://kyivindependent.com/i-have-no-moral-right-to-engage-in-anything-else-"
                                    "fedorov-hopes-for-reinstatement-as-defense-minister/")
    assert link["card_title"].startswith("'I have no moral right to engage in anything else'")


def test_broadcast_and_space_cards_resolve_through_entities(all_parsed):
    (broadcast,) = [x for x in all_parsed.links if x["tweet_id"] == "1790441814857826439"]
    assert (broadcast["kind"], broadcast["url_norm"]) == ("card", "https://x.com/i/broadcasts/1BRJjPqnBqaKw")
    assert broadcast["card_title"] == "Migrating developer apps to the X API 2"
    (space,) = [x for x in all_parsed.links if x["tweet_id"] == "1789054061729173804"]
    assert space["expanded_url"] == "https://twitter.com/i/spaces/1vOxwjaWEbdJB"


def test_card_that_entities_cannot_resolve_is_not_stored(all_parsed):
    # The unified_card of 1696922210588410217 has card_url "https://twitter.com", no t.co.
    assert not [x for x in all_parsed.links if x["tweet_id"] == "1696922210588410217"]
    assert all_parsed.unresolved_cards == [
        "post 1696922210588410217: card https://twitter.com is not in the post's url entities"]


def test_card_with_a_t_co_that_is_not_in_the_entities_is_not_guessed():
    item = entry("2085471123257368829")  # a card and its link in legacy entities
    item["content"]["itemContent"]["tweet_results"]["result"]["legacy"]["entities"]["urls"] = []
    page = parse([item])
    assert page.links == []
    assert page.unresolved_cards == ["post 2085471123257368829: card https://t.co/pnBaROCBNy is not in the "
                                     "post's url entities"]


def test_article_inside_a_quoted_retweet(all_parsed):
    # raw_user_tweets.json: XDevelopers retweets chrisparkX, who quotes XFreeze's article.
    row = bookmark(all_parsed, "2079821023071907954")
    assert row["retweet_of_id"] == "2079814480427442556"
    assert row["retweeted_by_handle"] == "XDevelopers"
    assert row["author_handle"] == "chrisparkX"
    assert row["text"].startswith("Great guide on using the X API via our new XMCP and Grok Build")
    assert row["quoted_author_handle"] == "XFreeze"
    assert row["article_id"] == "2079162061142335488"
    assert row["article_title"] == ("Turn your X account into a programmable intelligence system using the "
                                    "X API and Grok Build")
    assert row["article_preview"].startswith("Your X account can now become a programmable intelligence system.")
    assert row["article_from_quote"] is True
    assert row["article_text"] is None  # the capture holds no content_state
    (link,) = [x for x in all_parsed.links if x["tweet_id"] == "2079821023071907954"]
    assert (link["kind"], link["url_norm"], link["from_quote"]) == (
        "article", "https://x.com/i/article/2079162061142335488", True)


def test_article_content_state_becomes_plain_text():
    item = entry("2079814622639469025")  # a retweet of XFreeze's article post
    rt = item["content"]["itemContent"]["tweet_results"]["result"]["legacy"]["retweeted_status_result"]["result"]
    rt["article"]["article_results"]["result"]["content_state"] = {
        "blocks": [
            {"key": "a1", "type": "header-two", "text": "Why bookmarks fail", "entityRanges": []},
            {"key": "a2", "type": "atomic", "text": " ", "entityRanges": [{"key": 0}]},
            {"key": "a3", "type": "unstyled", "text": "Most people use X bookmarks as a graveyard.",
             "entityRanges": []},
        ],
        "entityMap": {"0": {"type": "MEDIA"}},
    }
    (row,) = parse([item]).bookmarks
    assert row["article_text"] == "Why bookmarks fail\nMost people use X bookmarks as a graveyard."
    assert row["article_from_quote"] is False


def test_article_plain_text_reads_a_json_string_too():
    state = json.dumps({"blocks": [{"text": "one"}, {"text": ""}, {"text": "two"}]})
    assert article_plain_text(state) == "one\ntwo"
    assert article_plain_text("not json") is None
    assert article_plain_text({"blocks": "x"}) is None


def test_link_to_the_quoted_post_is_not_a_link():
    item = entry("2085447188344197368")  # quotes AdamKinzinger/status/2085381798939296027
    legacy = item["content"]["itemContent"]["tweet_results"]["result"]["legacy"]
    legacy["entities"]["urls"] = [
        {"url": "https://t.co/gi8bJGb6av", "expanded_url": "https://twitter.com/adamkinzinger/status/2085381798939296027"},
        {"url": "https://t.co/other", "expanded_url": "https://example.org/report?utm_source=x"},
    ]
    page = parse([item])
    assert [(x["url_norm"], x["kind"]) for x in page.links] == [("https://example.org/report", "link")]


def test_user_in_old_and_new_format(all_parsed):
    authors = {a["handle"]: a for a in all_parsed.authors}
    # Old format: name, screen_name and description in `legacy`.
    assert authors["TheFigen_"]["name"] == "Figen"
    assert authors["TheFigen_"]["description"].startswith("PhD musicology /Teacher/ Turkish woman/")
    # New format: `core` and `profile_bio`.
    assert authors["IlvesToomas"]["name"] == "toomas hendrik ilves"
    assert authors["IlvesToomas"]["description"].startswith("Toomas Hendrik Ilves From Estonia.")


def test_tweet_with_visibility_results_at_the_top_is_unwrapped():
    item = entry("1671508600538161153")
    content = item["content"]["itemContent"]["tweet_results"]
    content["result"] = {"__typename": "TweetWithVisibilityResults", "tweet": content["result"],
                         "limitedActionResults": {"limited_actions": []}}
    page = parse([item])
    assert [b["author_handle"] for b in page.bookmarks] == ["TheFigen_"]
    assert page.media[0]["smallest_mp4"].endswith("/320x568/pY6q1h6ISkvyHc0F.mp4?tag=12")


def test_tombstones_give_no_row_but_count_as_seen():
    tombstone = {"entryId": "tweet-1111", "sortIndex": "1850000000000000000", "content": {
        "entryType": "TimelineTimelineItem", "itemContent": {"tweet_results": {"result": {
            "__typename": "TweetTombstone", "tombstone": {"text": {"text": "This Post was deleted by the Post author."}}}}}}}
    empty = {"entryId": "tweet-2222", "sortIndex": "1849999999999999000",
             "content": {"entryType": "TimelineTimelineItem", "itemContent": {"tweet_results": {}}}}
    page = parse([entry("1671508600538161153"), tombstone, empty])
    assert [b["tweet_id"] for b in page.bookmarks] == ["1671508600538161153"]
    assert page.unavailable_tweet_ids == ["1111", "2222"]
    assert page.seen_tweet_ids == ["1671508600538161153", "1111", "2222"]
    assert page.problems == []


def test_unknown_entry_kinds_are_counted_and_skipped():
    modules = []
    for name in ("raw_user_tweets.json", "raw_list_timeline.json"):
        payload = json.loads(x_fixture(name).read_text())
        modules += [e for e in _walk_entries(payload)
                    if not e["entryId"].startswith(("tweet-", "cursor-"))]
    page = parse([entry("1671508600538161153"), *modules])
    assert page.unknown_entries == {"who-to-follow": 1, "profile-conversation": 1, "list-conversation": 2}
    assert [b["tweet_id"] for b in page.bookmarks] == ["1671508600538161153"]


def test_a_bad_tweet_entry_is_named_and_the_page_goes_on():
    no_author = entry("2085472697924890822")
    no_author["content"]["itemContent"]["tweet_results"]["result"]["core"] = {"user_results": {}}
    no_sort = entry("2085464240828076379")
    del no_sort["sortIndex"]
    page = parse([no_author, no_sort, entry("1671508600538161153")])
    assert [b["tweet_id"] for b in page.bookmarks] == ["1671508600538161153"]
    assert page.problems == [
        "entry tweet-2085472697924890822: no readable author (user_results); skipped",
        "entry tweet-2085464240828076379: no sortIndex; skipped",
    ]
    assert set(page.seen_tweet_ids) == {"2085472697924890822", "2085464240828076379", "1671508600538161153"}


def test_entry_kind_drops_trailing_ids():
    assert entry_kind("who-to-follow-2085474396218064901") == "who-to-follow"
    assert entry_kind("promoted-tweet-123-abc") == "promoted-tweet"
    assert entry_kind("") == "<no entryId>"


def test_video_variant_choice_ignores_the_playlist():
    variants = [
        {"content_type": "application/x-mpegURL", "url": "https://v/pl.m3u8"},
        {"bitrate": 2176000, "content_type": "video/mp4", "url": "https://v/720.mp4"},
        {"bitrate": 256000, "content_type": "video/mp4", "url": "https://v/270.mp4"},
    ]
    assert video_variant_choice(variants) == ("https://v/270.mp4", "https://v/720.mp4")
    assert video_variant_choice(variants[:1]) == (None, None)


# --- folders and threads -------------------------------------------------------------

def test_the_folder_list_reads_ids_and_names_and_refuses_odd_ids():
    from kb.x.folder_list import parse_folder_list
    from kb.x.graphql import FOLDER_LIST, answer_kind
    from tests.x_fixtures import TWILLOT_FOLDERS, folder_list_answer

    answer = folder_list_answer()
    assert answer_kind(answer) == FOLDER_LIST
    folders, problems = parse_folder_list(answer)
    assert [(f["folder_id"], f["name"]) for f in folders] == list(TWILLOT_FOLDERS) and problems == []
    # An id goes into a file name and an X address: only letters and digits pass.
    hostile = folder_list_answer((("../../etc", "x"), ("12 34", "y"), ("", "z"), ("55", "  Kept  ")))
    folders, problems = parse_folder_list(hostile)
    assert folders == [{"folder_id": "55", "name": "Kept"}] and len(problems) == 3
    with pytest.raises(PageShapeError, match="not a BookmarkFoldersSlice answer"):
        parse_folder_list({"data": {"viewer": {}}}, name="folders-0001.json")


def test_a_folder_timeline_is_read_under_the_documented_key_and_under_another():
    from kb.x.graphql import FOLDER_TIMELINE, answer_kind
    from tests.x_fixtures import folder_page

    documented = folder_page([entry("1649191520250245121")])
    assert answer_kind(documented) == FOLDER_TIMELINE
    # The capture wins: a later X deploy may name the key otherwise.
    renamed = {"data": {"bookmark_collection_timeline_v2": documented["data"]["bookmark_collection_timeline"]}}
    for payload in (documented, renamed):
        page = parse_page(payload, raw_file="folder-1-0001.json", batch="b1", captured_at=CAPTURED_AT,
                          operation=FOLDER_TIMELINE)
        assert [row["tweet_id"] for row in page.bookmarks] == ["1649191520250245121"]
    with pytest.raises(PageShapeError, match="not a Bookmarks page"):
        parse_page(documented, raw_file="page-0001.json", batch="b1", captured_at=CAPTURED_AT)


def test_the_authors_thread_is_the_chain_of_their_own_replies():
    from kb.x.graphql import TWEET_DETAIL, answer_kind
    from kb.x.thread_rows import author_thread, focal_post_id, parse_thread

    payload = json.loads(x_fixture("raw_tweet_details.json").read_text())
    assert answer_kind(payload) == TWEET_DETAIL and focal_post_id(payload) == "1649191520250245121"
    chain = author_thread(payload, head_id="1649191520250245121", max_posts=25)
    assert [t["rest_id"] for t in chain] == ["1649191521323995138", "1649191522485817345", "1649191523697979392"]
    assert [t["rest_id"] for t in author_thread(payload, head_id="1649191520250245121", max_posts=2)] == \
        ["1649191521323995138", "1649191522485817345"]
    # Under a reply of someone else there is no chain of the bookmark's author.
    assert author_thread(payload, head_id="1649263296434806785", max_posts=25) == []
    with pytest.raises(PageShapeError, match="post 42 is not in this TweetDetail answer"):
        author_thread(payload, head_id="42", max_posts=25)

    thread = parse_thread(payload, tweet_id="1649191520250245121", raw_file="b1/thread-1649191520250245121.json",
                          batch="b1", captured_at=CAPTURED_AT, max_posts=25)
    assert [p["url"] for p in thread.posts][-1] == "https://x.com/XDevelopers/status/1649191523697979392"
    assert thread.posts[2]["text"].startswith("Thank you to those who have already migrated")
    # The replies' links are links of the bookmark, after its own (position 1000 on).
    assert {(link["url_norm"], link["from_thread"]) for link in thread.links} == {
        ("https://shorturl.at/uwAKZ", True), ("https://developer.twitter.com", True)}
    assert min(link["position"] for link in thread.links) >= 1000
    assert {a["handle"] for a in thread.authors} == {"XDevelopers"}


@pytest.mark.parametrize("hostile_id", ["", "wiki:index.md", "../../etc/passwd", "123 OR 1=1"])
def test_an_entry_whose_post_id_is_not_a_number_is_named_and_skipped(hostile_id):
    """A post id goes into addresses, file names and the index, where a
    bookmark shares one id space with the wiki ("wiki:<path>"). The red team
    stopped the index of a batch with "tweet-" and took the passages of the
    owner's wiki page with "tweet-wiki:index.md". Such an entry is named
    in the page's problems; the good posts of the page stay."""
    from kb.x.graphql import summarize_page

    good = all_tweet_entries()[0]
    hostile = json.loads(json.dumps(good).replace(good["entryId"], f"tweet-{hostile_id}"))
    page = parse([good, hostile])
    assert page.seen_tweet_ids == [good["entryId"].removeprefix("tweet-")]
    assert [row["tweet_id"] for row in page.bookmarks] == page.seen_tweet_ids
    assert page.problems == [f"entry {'tweet-' + hostile_id!r}: the post id is not a number; skipped"]
    summary = summarize_page(bookmarks_page([good, hostile], bottom_cursor="next"))
    assert [tweet_id for tweet_id, _ in summary.tweets] == page.seen_tweet_ids
