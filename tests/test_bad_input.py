"""Bad input: each input gets a clear error that names it, or is handled.
Nothing else fails, the raw input stays on disk, and the rest of the work
goes on.

- X Bookmarks pages made by hypothesis (keys missing, values of the wrong
  type, huge strings, deep nesting, bytes that are not JSON) through
  `parse_page` and through the real normalize asset into a real DuckDB file.
- Telegram updates that the Bot API could never send, through the real bot
  (aiogram long polling) against the loopback Bot API.
- PDFs made here with PyMuPDF (truncated, garbage, encrypted, empty, 300
  pages), HTML nested 40,000 levels deep or megabytes large, text that is
  not UTF-8 and a voice note that is not audio: through the extraction
  functions, the `documents` asset on a loopback site, and the real
  `source_intake` job on a real Dagster instance.

A source that tells the wiki agent to delete or push the wiki:
tests/test_wiki_agent.py::test_source_that_says_delete_the_wiki and
::test_rm_curl_and_push_are_denied (not repeated here).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from datetime import datetime, timezone

import dagster as dg
import duckdb
import pymupdf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kb_assets.documents.documents import DocumentsConfig, documents
from kb.enrich.extract import MAX_LAYOUT_PAGES, extract_file, extract_html, extract_pdf, html_to_text
from kb_assets.x.bookmarks import normalized_bookmarks
from kb_assets.partitions import sync_batches
from kb.telegram.source_parsers import PermanentParseError, parse_pdf, parse_web
from kb.urls import normalize_url
from kb.x.graphql import PageShapeError, load_page, summarize_page
from kb.x.post_rows import parse_page
from kb.x.browser import Browser
from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.x.raw_store import CaptureManifest, RawStore
from kb.store.duckdb_schema import TABLES
from kb.settings import get_settings
from kb.telegram.inbox import Inbox, telegram_item_id
from tests import fake_telegram as tg
from tests import source_helpers as h
from tests.fake_telegram import FakeTelegram, converse
from tests.loopback_site import LoopbackSite, page
from kb_resources.services import BrowserResource
from kb_resources.stores import DuckDBResource, RawStoreResource

# The loopback sites stand in for the web: let the fetch guard reach them.
pytestmark = pytest.mark.usefixtures("loopback_fetches")

CAPTURED = datetime(2026, 11, 1, 10, 0, tzinfo=timezone.utc)
# Keep the generated cases few: the whole file runs in well under 30 s.
FEW = settings(max_examples=60, deadline=None, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                      HealthCheck.data_too_large])


# --- a Bookmarks page that uses every part of the parser ------------------------------

def user(user_id: str, handle: str) -> dict:
    return {"__typename": "User", "rest_id": user_id,
            "core": {"screen_name": handle, "name": handle.title()},
            "legacy": {"description": f"bio of {handle}"}}


def tweet(tweet_id: str, handle: str, text: str, **extra) -> dict:
    return {"__typename": "Tweet", "rest_id": tweet_id,
            "core": {"user_results": {"result": user(f"u{tweet_id}", handle)}},
            "legacy": {"full_text": text, "created_at": "Wed Jul 22 06:49:07 +0000 2026", "lang": "en",
                       "display_text_range": [0, len(text)], "entities": {"urls": []}, **extra.pop("legacy", {})},
            **extra}


def entry(tweet_id: str, result: dict | None, sort_index: str) -> dict:
    return {"entryId": f"tweet-{tweet_id}", "sortIndex": sort_index,
            "content": {"entryType": "TimelineTimelineItem",
                        "itemContent": {"itemType": "TimelineTweet", "tweet_results": {"result": result}}}}


def template_page() -> dict:
    link = {"url": "https://t.co/link1", "expanded_url": "https://example.com/post?utm_source=x"}
    card_link = {"url": "https://t.co/card1", "expanded_url": "https://blog.example.org/a"}
    video = {"media_key": "7_1", "type": "video", "media_url_https": "https://pbs.twimg.com/v.jpg",
             "url": "https://t.co/media1", "ext_alt_text": "a clip",
             "video_info": {"duration_millis": 4000, "variants": [
                 {"content_type": "application/x-mpegURL", "url": "https://video.twimg.com/pl.m3u8"},
                 {"content_type": "video/mp4", "bitrate": 256000, "url": "https://video.twimg.com/270.mp4"},
                 {"content_type": "video/mp4", "bitrate": 2176000, "url": "https://video.twimg.com/720.mp4"}]}}
    photo = {"media_key": "3_1", "type": "photo", "media_url_https": "https://pbs.twimg.com/p.jpg"}
    quoted = tweet("300", "quoted", "the quoted post https://t.co/link1",
                   legacy={"entities": {"urls": [link]}, "extended_entities": {"media": [photo]}})
    entries = [
        entry("101", tweet("101", "alice", "plain post https://t.co/link1 https://t.co/media1",
                           legacy={"entities": {"urls": [link]}, "extended_entities": {"media": [video]}}), "1900"),
        entry("102", tweet("102", "bob", "cut short", note_tweet={"note_tweet_results": {"result": {
            "text": "the long text https://t.co/card1",
            "entity_set": {"urls": [card_link]}}}},
            card={"rest_id": "card://1", "legacy": {"binding_values": [
                {"key": "card_url", "value": {"string_value": "https://t.co/card1"}},
                {"key": "title", "value": {"string_value": "A blog post"}}]}}), "1899"),
        entry("103", {"__typename": "TweetWithVisibilityResults", "tweet": tweet(
            "103", "carol", "a quote", legacy={"quoted_status_id_str": "300"},
            quoted_status_result={"result": quoted})}, "1898"),
        entry("104", tweet("104", "dave", "RT @erin: an article", legacy={"retweeted_status_result": {"result": tweet(
            "400", "erin", "my article", article={"article_results": {"result": {
                "rest_id": "555", "title": "An article", "preview_text": "preview",
                "content_state": {"blocks": [{"text": "First block."}, {"text": "Second block."}]}}}})}}), "1897"),
        entry("105", {"__typename": "TweetTombstone"}, "1896"),
        {"entryId": "who-to-follow-1", "sortIndex": "1895", "content": {"items": []}},
        {"entryId": "cursor-bottom-1", "sortIndex": "0", "content": {"value": "next-page", "cursorType": "Bottom"}},
    ]
    return {"data": {"bookmark_timeline_v2": {"timeline": {
        "instructions": [{"type": "TimelineAddEntries", "entries": entries}]}}}}


TEMPLATE = template_page()


def _paths(node, prefix=()):
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


PATHS = list(_paths(TEMPLATE))
KEYS = ["tweet", "legacy", "result", "entries", "text", "url", "expanded_url", "__typename", "rest_id", "core",
        "variants", "bitrate", "content_type", "media", "entities", "urls", "blocks", "entryId", "sortIndex"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63), st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["tweet-1", "cursor-bottom-2", "TweetWithVisibilityResults", "Tweet", "User", "video/mp4",
                     "https://t.co/link1", "http://[::1", "javascript:alert(1)", "x" * 100_000]),
)
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                      st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)


def nested(depth: int, leaf) -> object:
    value = leaf
    for _ in range(depth):
        value = {"__typename": "TweetWithVisibilityResults", "tweet": value}
    return value


@st.composite
def mutated_pages(draw) -> dict:
    """The template with a few parts removed, or replaced by values of any
    type, by huge strings, or by deep nesting."""
    page = copy.deepcopy(TEMPLATE)
    for _ in range(draw(st.integers(1, 6))):
        path = draw(st.sampled_from(PATHS))
        parent = page
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["delete", "replace", "replace", "nest"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "nest":
                parent[path[-1]] = nested(draw(st.sampled_from([2, 50, 900])), parent[path[-1]])
            else:
                parent[path[-1]] = draw(values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change removed this path
    return page


def raw_bytes(page: object) -> bytes:
    return json.dumps(page).encode()


# The types that the DuckDB columns take, read from the schema itself.
_PY_TYPES = {"VARCHAR": (str,), "JSON": (str,), "BOOLEAN": (bool,), "INTEGER": (int,), "BIGINT": (int,),
             "TIMESTAMPTZ": (datetime,)}


def column_types(table: str) -> dict[str, tuple]:
    found = re.findall(r"^\s*(\w+)\s+(VARCHAR|JSON|BOOLEAN|INTEGER|BIGINT|TIMESTAMPTZ)\b(.*)$", TABLES[table], re.M)
    return {name: (_PY_TYPES[kind], "NOT NULL" in rest) for name, kind, rest in found}


def assert_rows_fit_the_schema(table: str, rows: list[dict]) -> None:
    types = column_types(table)
    for row in rows:
        for name, value in row.items():
            allowed, required = types[name]
            assert value is not None or not required, f"{table}.{name} is NULL in {row}"
            assert value is None or (isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)), \
                f"{table}.{name} = {value!r:.80} is not {allowed}"


def assert_consistent(parsed) -> None:
    """The rows of one page agree with each other and with the schema."""
    bookmarks = {b["tweet_id"]: b for b in parsed.bookmarks}
    assert len(bookmarks) == len(parsed.bookmarks), "a tweet id twice in bookmarks"
    authors = {a["author_id"] for a in parsed.authors}
    for row in parsed.bookmarks:
        assert row["author_id"] in authors and row["sort_index"]
    for table, rows in (("bookmarks", parsed.bookmarks), ("authors", parsed.authors),
                        ("media", parsed.media), ("links", parsed.links)):
        assert_rows_fit_the_schema(table, rows)
    for row in parsed.media + parsed.links:
        assert row["tweet_id"] in bookmarks, f"a {row} without its bookmark"
    assert len({(m["tweet_id"], m["media_key"]) for m in parsed.media}) == len(parsed.media)
    assert len({(link["tweet_id"], link["url_norm"]) for link in parsed.links}) == len(parsed.links)
    for link in parsed.links:
        assert link["url_norm"] == normalize_url(link["expanded_url"])
    # Each tweet entry is a row, a post that X no longer shows, or a named problem.
    named = " ".join(parsed.problems)
    for tweet_id in parsed.seen_tweet_ids:
        assert tweet_id in bookmarks or tweet_id in parsed.unavailable_tweet_ids or f"tweet-{tweet_id}" in named
    for problem in parsed.problems:
        match = re.match(r"entry tweet-(\S+): cannot read the post", problem)
        if match:  # an entry that failed half way left no row behind
            assert match[1] not in bookmarks


def parse_raw(raw: bytes, name: str = "b1/page-0001.json"):
    """load_page + summarize_page + parse_page, as capture and normalize call them."""
    payload = load_page(raw, name=name)
    summarize_page(payload, name=name)
    return parse_page(payload, raw_file=name, batch="b1", captured_at=CAPTURED)


def test_the_template_page_uses_every_part_of_the_parser():
    parsed = parse_raw(raw_bytes(TEMPLATE))
    assert [b["tweet_id"] for b in parsed.bookmarks] == ["101", "102", "103", "104"]
    assert {m["kind"] for m in parsed.media} == {"video", "photo"}
    assert {link["kind"] for link in parsed.links} == {"link", "card", "article"}
    assert parsed.unavailable_tweet_ids == ["105"] and parsed.unknown_entries == {"who-to-follow": 1}
    assert not parsed.problems
    assert_consistent(parsed)


@pytest.mark.slow
@FEW
@given(page=mutated_pages())
def test_generated_pages_parse_or_raise_page_shape_error_naming_the_file(page):
    name = "20261101T000000000Z/page-0007.json"
    try:
        parsed = parse_raw(raw_bytes(page), name)
    except PageShapeError as exc:
        assert str(exc).startswith(f"{name}: ")
        return
    assert_consistent(parsed)


@FEW
@given(payload=values)
def test_any_json_value_is_a_page_or_a_page_shape_error(payload):
    for candidate in (payload, {"data": {"bookmark_timeline_v2": {"timeline": {"instructions": payload}}}},
                      {"data": {"bookmark_timeline_v2": {"timeline": {"instructions": [
                          {"type": "TimelineAddEntries", "entries": payload}]}}}}):
        try:
            assert_consistent(parse_raw(raw_bytes(candidate), "p.json"))
        except PageShapeError as exc:
            assert str(exc).startswith("p.json: ")


@settings(max_examples=50, deadline=None, database=None)
@given(data=st.binary(max_size=300))
def test_any_bytes_are_a_page_or_a_page_shape_error(data):
    try:
        assert_consistent(parse_raw(data, "p.json"))
    except PageShapeError as exc:
        assert str(exc).startswith("p.json: ")


@pytest.mark.parametrize("raw, reason", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    (b'{"data":' * 50_000 + b"1" + b"}" * 50_000, "nested too deep"),
    (b'{"data": ' + b"9" * 5000 + b"}", "not JSON (Exceeds the limit"),
    ('{"data": "caf\xe9"}'.encode("latin-1"), "not JSON ('utf-8' codec can't decode"),
    (b"", "not JSON"),
    (b"\x00\x01\x02", "not JSON"),
    (b"<html>rate limited</html>", "not JSON"),
    (b'{"data": NaN}', "not a Bookmarks page"),
    (b'{"data": {"bookmark_timeline_v2": {"timeline": {"instructions": {"a": 1}}}}}', "instructions is not a list"),
])
def test_raw_bytes_that_are_no_page_name_the_file_and_the_reason(raw, reason):
    with pytest.raises(PageShapeError) as error:
        parse_raw(raw, "b1/page-0003.json")
    assert str(error.value).startswith("b1/page-0003.json: ") and reason in str(error.value)


def test_a_page_in_utf16_is_read_and_the_wrappers_have_a_limit():
    assert [b["tweet_id"] for b in parse_raw(json.dumps(TEMPLATE).encode("utf-16")).bookmarks][:1] == ["101"]
    page = copy.deepcopy(TEMPLATE)
    inner = page["data"]["bookmark_timeline_v2"]["timeline"]["instructions"][0]["entries"][0]["content"]["itemContent"]
    inner["tweet_results"]["result"] = nested(900, inner["tweet_results"]["result"])
    parsed = parse_raw(raw_bytes(page))
    assert "101" in parsed.unavailable_tweet_ids and "101" in parsed.seen_tweet_ids


# --- the normalize asset: generated pages in a batch with good pages ----------------------

def write_raw_batch(batch: str, pages: list[bytes]) -> list:
    store = RawStore.from_settings()
    paths = [store.write_page(batch, n, body) for n, body in enumerate(pages, start=1)]
    store.write_manifest(CaptureManifest(batch=batch, mode="files", full=True, complete=True,
                                         pages=[p.name for p in paths], started_at=CAPTURED.isoformat()))
    return paths


def rows(sql: str, params=()) -> list[tuple]:
    with duckdb.connect(str(get_settings().duckdb_path), read_only=True) as conn:
        return conn.execute(sql, list(params)).fetchall()


BATCH_NUMBERS = itertools.count(1)
bad_page_bytes = st.one_of(
    mutated_pages().map(raw_bytes),
    values.map(raw_bytes),
    st.binary(max_size=200),
    st.sampled_from([b"[" * 50_000 + b"]" * 50_000, '{"a": "\xe9"}'.encode("latin-1")]),
)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(bad=st.lists(bad_page_bytes, min_size=2, max_size=5))
def test_generated_pages_in_a_batch_never_stop_the_normalize_asset(bad):
    batch = f"20261101T{next(BATCH_NUMBERS):06d}000Z"  # each example is a new sync batch
    good = copy.deepcopy(TEMPLATE)
    for item in good["data"]["bookmark_timeline_v2"]["timeline"]["instructions"][0]["entries"]:
        item["entryId"] = item["entryId"].replace("tweet-1", "tweet-9")  # ids no generated page has
    pages = [raw_bytes(good), *bad]
    paths = write_raw_batch(batch, pages)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(sync_batches.name, [batch])

    result = dg.materialize([normalized_bookmarks], partition_key=batch,
                            instance=instance, resources={"duckdb": DuckDBResource.from_settings(), "raw_store": RawStoreResource.from_settings()},
                            raise_on_error=False)

    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert all(check.passed for check in result.get_asset_check_evaluations())
    stored = {r[0] for r in rows("SELECT tweet_id FROM bookmarks WHERE batch = ?", [batch])}
    assert {"901", "902", "903", "904"} <= stored  # the good page normalized
    problems = {r[0] for r in rows("SELECT raw_file FROM capture_problems WHERE batch = ?", [batch])}
    for path, body in zip(paths, pages):
        assert path.read_bytes() == body  # every raw page is kept as it came
        try:
            parse_raw(body)
        except PageShapeError:
            assert f"{batch}/{path.name}" in problems  # named, with its reason


# --- Telegram updates that the Bot API would never send -----------------------------------

TOKEN = "123456:TEST-SECRET-TOKEN-BAD-INPUT"
OWNER = h.OWNER_ID
LONG_TEXT = "Idea: keep a log of every schema change, with the reason, so that a rebuild can replay it."
PRIVATE = "PRIVATE-WORDS-of-a-malformed-update"




# aiogram warns about each update with no event: the stand-in that keeps
# the offset moving past an unreadable update is such an update.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Detected unknown update type:RuntimeWarning")
def test_malformed_updates_are_skipped_and_the_next_messages_are_handled(monkeypatch, caplog, capsys, kb_home):
    caplog.set_level("DEBUG")
    fake = FakeTelegram(TOKEN).start()
    try:
        monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
        monkeypatch.setenv("ALLOWED_USER_IDS", str(OWNER))
        monkeypatch.setenv("TELEGRAM_API_BASE", fake.base_url)

        def msg(message_id: int, **fields) -> dict:
            return tg.message_update(fake.next_update_id(), message_id, OWNER, **fields)

        malformed = [
            {"update_id": fake.next_update_id(), "message": {"message_id": "abc", "text": PRIVATE}},
            msg(2, text=5),  # a number where the text belongs
            msg(3, text=PRIVATE, entities="not a list"),
            msg(4, text=PRIVATE, **{"from": {"id": "not a number"}}),
            {"update_id": fake.next_update_id()},  # no event at all
            {"update_id": fake.next_update_id(), "edited_message": {"message_id": 6, "date": 0, "text": PRIVATE}},
        ]
        odd_but_valid = [
            msg(10, document={"file_id": "nameless", "file_unique_id": "u1"}),  # no name, no type
            msg(11, document={"file_id": "evil", "file_unique_id": "u2", "file_name": "../../../etc/passwd.md",
                              "mime_type": "text/markdown"}),
            msg(12, text=LONG_TEXT, entities=[{"type": "text_link", "offset": 500, "length": 9,
                                               "url": "https://a.example/"}]),  # offset past the end
            msg(13, **tg.command_fields("/status " + "x" * 5000)),
            msg(14, **tg.command_fields("/synthesize " + "topic " * 1000)),
            msg(15, **tg.command_fields("/" + "y" * 4000)),
        ]
        fake.add_file("evil", "documents/file_9.md", b"# Notes\n\nSome notes in Markdown, long enough to keep.")
        converse(fake, *malformed, *odd_but_valid, msg(20, text=LONG_TEXT))
    finally:
        fake.stop()

    assert fake.all_confirmed()  # the offset moved past every update
    assert fake.replies_to(1) == fake.replies_to(2) == fake.replies_to(3) == fake.replies_to(4) == []
    assert fake.replies_to(10)[0].startswith("Unsupported message type (this document).")
    inbox = Inbox(get_settings().inbox_dir)
    evil = inbox.find(telegram_item_id(OWNER, 11))
    assert inbox.attachment_path(evil) == inbox.files_dir(evil.id) / "passwd.md"  # no path from the sender
    assert fake.replies_to(12) == [f"queued for processing (id {telegram_item_id(OWNER, 12)})"]
    [status] = fake.replies_to(13)
    assert status.startswith("no item xxxx") and len(status) < 200
    assert fake.replies_to(14) == ["the topic is too long: 5999 characters; the limit is 200."]
    assert not inbox.request_names_after(None)  # no request for the refused topic
    [unknown] = fake.replies_to(15)
    assert unknown.startswith("unknown command /yyy") and len(unknown) < 200
    assert fake.replies_to(20) == [f"queued for processing (id {telegram_item_id(OWNER, 20)})"]
    # The log names the skipped updates, never their words.
    for update in malformed[:4]:
        assert f"update {update['update_id']} skipped" in caplog.text
    captured = capsys.readouterr()
    assert PRIVATE not in caplog.text + captured.out + captured.err
    assert not [p for p in kb_home.rglob("*") if p.is_file() and PRIVATE in p.read_text(errors="replace")]


# --- PDFs and HTML through the extraction of the documents stage ---------------------------

def make_pdf(text: str = "Glaciers lose ice every summer, and the rivers change their course. " * 20,
             pages: int = 1, **save) -> bytes:
    doc = pymupdf.open()
    for n in range(pages):
        doc.new_page().insert_textbox(pymupdf.Rect(50, 50, 550, 800), f"Page {n + 1}. {text}", fontsize=10)
    data = doc.tobytes(**save)
    doc.close()
    return data


GOOD_PDF = make_pdf()
BAD_PDFS = {
    "empty": b"",
    "header-only": b"%PDF-1.7\n",
    "truncated": GOOD_PDF[:300],
    "garbage": b"%PDF-1.4\n" + bytes(range(256)) * 40,
    "encrypted": make_pdf(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="pw", owner_pw="owner-pw"),
}
BAD_PDF_REASONS = {"empty": "is not a readable PDF", "header-only": "is not a readable PDF",
                   "truncated": "is not a readable PDF", "garbage": "is not a readable PDF",
                   "encrypted": "is an encrypted PDF: it needs a password"}


@pytest.mark.parametrize("name", list(BAD_PDFS))
def test_bad_pdfs_raise_value_error_naming_the_url(name):
    url = f"https://example.org/{name}.pdf"
    with pytest.raises(ValueError) as error:
        extract_pdf(BAD_PDFS[name], url)
    assert str(error.value).startswith(url) and BAD_PDF_REASONS[name] in str(error.value)


def test_a_pdf_damaged_after_its_header_is_read_as_far_as_it_goes():
    half = extract_pdf(GOOD_PDF[: len(GOOD_PDF) // 2], "https://example.org/half.pdf")
    assert half.thin  # the documents stage stores it as `thin`, with the little text there is


@pytest.mark.slow
def test_a_300_page_pdf_is_read_whole_in_seconds():
    data = make_pdf("Words on every page of a long report. " * 30, pages=300)
    started = time.monotonic()
    extracted = extract_pdf(data, "https://example.org/long.pdf")
    assert time.monotonic() - started < 10  # pymupdf4llm's layout needs about 5 minutes here
    assert 300 > MAX_LAYOUT_PAGES
    for n in (1, 150, 300):
        assert f"Page {n}." in extracted.text
    assert extracted.word_count == 300 * (2 + 8 * 30)


@pytest.mark.slow
def test_a_300_page_pdf_from_telegram_is_parsed_whole_in_seconds(tmp_path):
    path = tmp_path / "book.pdf"
    path.write_bytes(make_pdf("Words on every page of a long report. " * 30, pages=300))
    started = time.monotonic()
    parsed = parse_pdf(path)
    assert time.monotonic() - started < 10
    assert parsed.extra == {"pages": 300} and "Page 300." in parsed.body
    assert len(parsed.body.split()) == 300 * (2 + 8 * 30)


LATIN1_WORDS = " ".join(f"Le caf\xe9 num\xe9ro {n} sert une cr\xe8me br\xfbl\xe9e au march\xe9." for n in range(30))


@pytest.mark.parametrize("path, content_type, body", [
    ("/header", "text/html; charset=iso-8859-1", f"<html><head><title>Caf\xe9</title></head><body><article>"
                                                 f"<h1>Caf\xe9</h1><p>{LATIN1_WORDS}</p></article></body></html>"),
    ("/meta", "text/html", f"<html><head><meta charset='iso-8859-1'><title>Caf\xe9</title></head><body><article>"
                           f"<h1>Caf\xe9</h1><p>{LATIN1_WORDS}</p></article></body></html>"),
    ("/plain", "text/plain; charset=iso-8859-1", LATIN1_WORDS),
])
def test_a_latin1_web_page_is_read_by_its_charset(path, content_type, body):
    """Before the fix, parse_web decoded every page as UTF-8: each accent
    became U+FFFD, with no error; a Latin-1 text/plain page was refused."""
    with LoopbackSite({path: page(body.encode("latin-1"), content_type=content_type)}) as site:
        parsed = parse_web(site.url(path), timeout_s=5)
    assert "caf\xe9 num\xe9ro 0 sert une cr\xe8me br\xfbl\xe9e" in parsed.body.lower()
    assert "\ufffd" not in parsed.body


def test_a_text_page_with_no_charset_that_is_not_utf8_names_the_url():
    with LoopbackSite({"/t": page(LATIN1_WORDS.encode("latin-1"), content_type="text/plain")}) as site:
        with pytest.raises(PermanentParseError, match=r"/t: not UTF-8 text \(byte \d+ is invalid\)"):
            parse_web(site.url("/t"), timeout_s=5)


@pytest.mark.parametrize("name, html", [
    # 40,000 levels: deep, and still under the 50,000 elements that kb reads
    # (MAX_PAGE_ELEMENTS; test_extract.py has the page above it).
    ("deep-div", "<html><body>" + "<div>" * 40_000 + "<p>deep text</p>" + "</div>" * 40_000 + "</body></html>"),
    ("deep-unclosed", "<html><body>" + "<div><span>" * 20_000 + "<p>deep text"),
    ("deep-table", "<html><body>" + "<table><tr><td>" * 5000 + "deep text" + "</td></tr></table>" * 5000),
    ("nul-bytes", "<html><body><p>before\x00after</p></body></html>"),
    ("not-html", "\x89PNG\r\n\x1a\n" + "\x00" * 10),
    ("empty", ""),
])
def test_strange_html_never_raises(name, html):
    extracted = extract_html(html, f"https://example.org/{name}")
    assert extracted.word_count == len(extracted.text.split())
    assert isinstance(html_to_text(html), str)


def test_a_large_page_is_extracted_whole():
    paragraphs = [f"Paragraph {n} tells the story of river number {n} and its delta." for n in range(30_000)]
    html = "<html><body><article>" + "".join(f"<p>{p}</p>" for p in paragraphs) + "</article></body></html>"
    assert len(html) > 2_000_000
    text = html_to_text(html)
    assert text.split("\n\n") == paragraphs


def test_extract_file_names_the_file_for_every_bad_input(tmp_path):
    cases = {"empty.html": (b"", "the file is empty"),
             "binary.html": (b"\x89PNG\r\n\x1a\n\x00\x00", "the file is binary"),
             "encrypted.pdf": (BAD_PDFS["encrypted"], "encrypted PDF"),
             "truncated.pdf": (BAD_PDFS["truncated"], "not a readable PDF"),
             "flood.html": (b"<div>" * 100_000, "the page has 100,000 elements, more than the 50,000 that kb reads")}
    for name, (data, reason) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError) as error:
            extract_file(tmp_path / name)
        assert name in str(error.value) and reason in str(error.value)
    latin = tmp_path / "latin.html"
    latin.write_bytes("<html><head><meta charset='iso-8859-1'></head><body><p>caf\xe9 cr\xe8me</p></body></html>"
                      .encode("latin-1"))
    assert "café crème" in html_to_text(latin.read_bytes().decode("latin-1"))
    deep = tmp_path / "deep.html"
    deep.write_text("<div>" * 40_000)
    assert extract_file(deep) == ""


@pytest.mark.slow
def test_documents_asset_stores_a_reason_for_every_bad_pdf(kb_home, monkeypatch):
    """The PDFs on a loopback site: each bad one is a `failed` row with its
    reason, the 300-page one is read, and the run succeeds. PDFs need no
    browser: the asset fetches files with httpx."""
    routes = {f"/{name}.pdf": page(data, content_type="application/pdf") for name, data in BAD_PDFS.items()}
    routes["/long.pdf"] = page(make_pdf("Words on every page of a long report. " * 30, pages=300),
                               content_type="application/pdf")
    routes["/fake.pdf"] = page(b"GIF89a not a pdf at all", content_type="application/pdf")
    batch = "20261101T000000000Z"
    monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "5")
    with LoopbackSite(routes) as site:
        links = [{"tweet_id": "1", "url_norm": normalize_url(site.url(path)), "position": n,
                  "expanded_url": site.url(path), "host": "127.0.0.1", "kind": "link", "from_quote": False,
                  "batch": batch} for n, path in enumerate(routes)]
        with DuckDBStore.from_settings().transaction() as conn:
            insert_rows(conn, "bookmarks", [{"tweet_id": "1", "batch": batch, "sort_index": "1",
                                             "url": "https://x.com/a/status/1", "text": "pdfs", "is_long": False,
                                             "raw_file": "p", "captured_at": CAPTURED}])
            insert_rows(conn, "links", links)
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(sync_batches.name, [batch])
        result = dg.materialize([documents], partition_key=batch, instance=instance,
                                resources={"duckdb": DuckDBResource.from_settings(), "browser": BrowserResource.from_settings()},
                                run_config=dg.RunConfig({"documents": DocumentsConfig(workers=2)}))
        assert result.success
        found = {url.rsplit("/", 1)[1]: (status, reason, detail or "") for url, status, reason, detail in rows(
            "SELECT url, status, reason, detail FROM documents")}
    assert found["long.pdf"][:2] == ("ok", None)
    assert found["fake.pdf"][:2] == ("failed", "binary")
    # The row is keyed by the address; its detail says what is wrong.
    expected = {**BAD_PDF_REASONS, "empty": "not a PDF: application/pdf"}
    for name in BAD_PDFS:
        status, reason, detail = found[f"{name}.pdf"]
        assert (status, reason) == ("failed", "binary") and expected[name] in detail, (name, detail)


# --- Telegram sources through the real source_intake job ----------------------------------

@pytest.mark.slow
def test_bad_sources_fail_with_a_named_reason_keep_their_files_and_stop_nothing_else(tmp_path, kb_home):
    """Each bad item fails at once with an error that names the input; its
    manifest and attachment stay as they came; a good item after them is
    parsed as usual."""
    inbox = h.inbox()
    latin_md = "# Caf\xe9\n\nNotes on cr\xe8me br\xfbl\xe9e, long enough to keep as a source.".encode("latin-1")
    bad_files = {
        "corrupt.pdf": ("pdf", BAD_PDFS["truncated"], "not a readable PDF"),
        "secret.pdf": ("pdf", BAD_PDFS["encrypted"], "the PDF is encrypted (it needs a password)"),
        "empty.pdf": ("pdf", b"", "the PDF file is empty"),
        "latin.md": ("md", latin_md, "not UTF-8 text (byte"),
        "voice.ogg": ("voice", b"OggS but not really audio " * 40, "not a readable audio file"),
    }
    items = {}
    for n, (name, (kind, data, reason)) in enumerate(bad_files.items(), start=1):
        items[name] = (h.add_item(kind, n, file_name=name, content=data), data, reason)
    # A .txt file that the owner drops in the inbox, in Latin-1.
    latin_txt = "Caf\xe9 notes: a plain text file that is not UTF-8 at all, but Latin-1.".encode("latin-1")
    (inbox.root / "note.txt").write_bytes(latin_txt)
    items["note.txt"] = (inbox.adopt_dropped_file(inbox.root / "note.txt"), latin_txt, "not UTF-8 text (byte 3 is invalid)")

    deep_html = "<html><body>" + "<div>" * 40_000 + "<p>text</p>" + "</div>" * 40_000 + "</body></html>"
    routes = {"/deep": page(deep_html), "/huge": page(b"<p>" + b"word " * 2_200_000 + b"</p>")}
    with LoopbackSite(routes) as site:
        web = {"/deep": (h.add_item("web", 20, url=site.url("/deep")), "has 0 characters of text; it needs 200"),
               "/huge": (h.add_item("web", 21, url=site.url("/huge")), "the page is larger than 10 MB")}
        good = h.add_item("text", 30, text=LONG_TEXT)
        dagster = h.ephemeral_instance()
        try:
            results = {name: h.run_item(dagster, item.id) for name, (item, _, _) in items.items()}
            results.update({path: h.run_item(dagster, item.id) for path, (item, _) in web.items()})
            good_result = h.run_item(dagster, good.id)
        finally:
            dagster.dispose()

    with DuckDBStore.from_settings().connect() as conn:
        sources = {r[0]: r[1:] for r in conn.execute("SELECT item_id, status, error FROM sources").fetchall()}
    for name, (item, data, reason) in items.items():
        assert not results[name].success, name
        status, error = sources[item.id]
        where = str(inbox.attachment_path(item))
        assert status == "failed" and error.startswith(where) and reason in error, (name, error)
        assert inbox.attachment_path(item).read_bytes() == data
        assert inbox.find(item.id) is not None  # the manifest stays
        assert "STEP_UP_FOR_RETRY" not in {e.event_type_value for e in results[name].all_events}
    for path, (item, reason) in web.items():
        status, error = sources[item.id]
        assert status == "failed" and error.startswith(item.url) and reason in error, (path, error)
    assert good_result.success and sources[good.id][0] == "accepted"
    # No parsed file for a failed item: only the good one is in raw/parsed.
    parsed = list((get_settings().wiki_dir / "raw" / "parsed").rglob("*.md"))
    assert [p.name.startswith(f"{good.id[:8]}-") for p in parsed] == [True]

