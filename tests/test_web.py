"""`kb web`: the search page, in a real browser (Playwright on Chromium)
against the app on loopback, over a small real LanceDB index and wiki folder
that the tests build. The hash embedder makes the vectors, so no model loads.

The JSON endpoints and the shared reader (kb/index/reading.py) are tested
through HTTP too, without the browser."""

from __future__ import annotations

import re
import socket
import struct
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.loopback import serve_asgi
from starlette.testclient import TestClient

from kb.apps.web import create_app
from kb.index.folders import folder_rows, replace_folders
from kb.apps.web.reader import WikiReader
from kb.apps.web.wiki_html import render_markdown
from kb.wiki_files import wiki_page_files
from kb_assets.index.wiki_index import page_rows
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.settings import Settings
from kb.index.reading import PAGE_WORDS
from tests.owner_browser import owner_browser_options

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # slow: a browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
T0 = datetime(2024, 3, 1, 12, tzinfo=timezone.utc)
SYNCED = datetime(2024, 3, 30, 8, 15, tzinfo=timezone.utc)
CHANGELOG = "https://example.org/frobnicator/changelog"
PHOTO = "https://pbs.twimg.com/media/crab.jpg"
RELEASES = 40
FILLER = "widget gadget sprocket lever gear axle bolt washer spring pulley".split()
SECRET = "sk-TEST-SECRET-web-panel"
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> zanzibar exploit'


def post(tweet_id: str, author: str, text: str, created_at: datetime, **extra) -> dict:
    url = f"https://x.com/{author}/status/{tweet_id}"
    row = {"chunk_id": f"{tweet_id}-post-0", "tweet_id": tweet_id, "url": url, "author": author,
           "created_at": created_at, "source": "post", "ref": url, "position": 0, "text": text}
    row.update(extra)
    return row


def release_note(number: int) -> str:
    # 120 words: 16 of them fill a 2,000-word page, so 40 make three pages.
    words = [FILLER[(number + i) % len(FILLER)] for i in range(113)]
    return f"Release note {number} of the frobnicator changelog. " + " ".join(words)


def corpus_rows() -> list[dict]:
    rows = [
        post("100", "alice", "Rust ownership and the borrow checker explained with small examples", T0),
        post("200", "bob", "Sourdough bread: feeding the starter and shaping the loaf", T0 + timedelta(days=3)),
        post("300", "carol", "A talk on the borrow checker in Rust, and on lifetimes", T0 - timedelta(days=10)),
        post("400", "mallory", HOSTILE, T0 + timedelta(days=1)),
        post("500", "dave", "Kubernetes operators reconcile the cluster state in a control loop", T0 + timedelta(days=5)),
    ]
    rows.append(dict(rows[2], chunk_id="300-video-0", source="video", ref="https://youtube.com/watch?v=rust",
                     text="Transcript: today the borrow checker, lifetimes and the ownership rules of Rust"))
    rows.append(dict(rows[0], chunk_id="100-image-0", source="image", ref=PHOTO,
                     text="A cartoon crab holds a padlock. OCR: OWNERSHIP"))
    for number in range(1, RELEASES + 1):
        rows.append(dict(rows[0], chunk_id=f"100-link-{number}", source="link", ref=CHANGELOG,
                         position=number - 1, text=release_note(number)))
    return rows


def cards() -> list[dict]:
    base = {"lang": "en", "last_sync": SYNCED}
    return [
        dict(base, tweet_id="100", url="https://x.com/alice/status/100", author="alice", author_name="Alice Liddell",
             created_at=T0, text="Rust ownership and the borrow checker explained with small examples",
             quoted={"tweet_id": "90", "author": "ferris", "author_name": "Ferris", "text": "Fearless concurrency, quoted"},
             links=[{"url": CHANGELOG, "kind": "link", "from_quote": False, "title": "Frobnicator changelog"}],
             media=[{"kind": "photo", "url": PHOTO, "alt_text": "A crab", "video_url": None, "from_quote": False}]),
        dict(base, tweet_id="200", url="https://x.com/bob/status/200", author="bob", author_name="Bob",
             created_at=T0 + timedelta(days=3), text="Sourdough bread: feeding the starter and shaping the loaf"),
        dict(base, tweet_id="300", url="https://x.com/carol/status/300", author="carol", author_name="Carol",
             created_at=T0 - timedelta(days=10), text="A talk on the borrow checker in Rust, and on lifetimes",
             media=[{"kind": "video", "url": "https://pbs.twimg.com/media/talk.jpg", "alt_text": None,
                     "video_url": "https://video.twimg.com/talk.mp4", "from_quote": False}]),
        dict(base, tweet_id="400", url="https://x.com/mallory/status/400", author="mallory", author_name=HOSTILE,
             created_at=T0 + timedelta(days=1), text=HOSTILE),
        dict(base, tweet_id="500", url="https://x.com/dave/status/500", author="dave", author_name="Dave",
             created_at=T0 + timedelta(days=5), text="Kubernetes operators reconcile the cluster state in a control loop"),
    ]


WIKI_PAGES = {
    "index.md": "# Index\n\n- [[concepts/borrow-checker]]\n- [[entities/Graydon Hoare]]\n- [[sources/rust-book]]\n",
    "wiki/concepts/borrow-checker.md": """---
type: concept
name: borrow checker
sources: [rust-book]
last_updated: 2024-03-02
---
# Borrow checker

The borrow checker is the part of the Rust compiler that enforces ownership. [[sources/rust-book#para3|the Rust book]]

## Facts
- It was designed in the team that [[entities/Graydon Hoare]] started. [[sources/rust-book#para1]]
- It rejects a second mutable borrow. [[concepts/missing-page]]

| rule | effect |
|---|---|
| one mutable borrow | no data races |

<script>window.__pwned = 3</script> and [a bad link](javascript:window.__pwned=4)
""",
    "wiki/entities/Graydon Hoare.md": """---
type: entity
name: Graydon Hoare
kind: person
sources: [rust-book]
last_updated: 2024-03-02
---
# Graydon Hoare

Graydon Hoare started the Rust language at Mozilla. [[sources/rust-book#para1]]

## Related
- [[concepts/borrow-checker]]
""",
    "wiki/sources/rust-book.md": """---
type: source
title: The Rust Programming Language
source_id: rb1
source_type: web
raw: raw/parsed/web/rust-book.md
ingested_at: 2024-03-02
---
# The Rust Programming Language

## Summary
A book about Rust.

""" + "\n".join(f"Filler line {n} about the book." for n in range(60)) + """

## Passages
### para1
> Rust began as a personal project.

### para3
> Ownership is Rust's most unique feature.
""",
}


def write_wiki(root: Path) -> None:
    for rel, text in WIKI_PAGES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def png(size: int = 48) -> bytes:
    """A small orange square: the test serves it for the media thumbnails,
    so the page shows them without the internet."""
    raw = b"".join(b"\x00" + bytes((235, 120, 40)) * size for _ in range(size))
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


# --- shared fixtures: one corpus, one server, one browser per module ----------------


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    home = tmp_path_factory.mktemp("web") / "kb_home"
    # Fields given here win over the environment: the keys are fake, and the
    # Dagster UI address has nothing listening.
    settings = Settings(kb_home=home, groq_api_key=SECRET, deepseek_api_key=None, anthropic_auth_token=None,
                        telegram_bot_token=None, kb_dagster_ui_url=f"http://127.0.0.1:{closed_port()}")
    index = ChunkIndex.from_settings(path=str(settings.lancedb_dir))
    write_wiki(settings.wiki_dir)
    # The wiki pages go into the same index, as the wiki_index asset writes them.
    rows = corpus_rows() + [row for file in wiki_page_files(settings.wiki_dir)
                            for row in page_rows(settings.wiki_dir, file)]
    index.replace_chunks(sorted({r["tweet_id"] for r in rows}), rows,
                         Embedder.from_settings(backend="hash", cache_dir=str(settings.lancedb_dir)))
    index.upsert_bookmark_cards(cards())
    # Two bookmark folders, as the chunk_index asset writes them.
    replace_folders(index, folder_rows([("f1", "Rust talks"), ("f2", "Bread")],
                                       [("f1", "100"), ("f1", "300"), ("f2", "200")]))
    # Not a DuckDB file: if the app opened it, the answer would be an error.
    settings.duckdb_path.write_bytes(b"this is not a DuckDB database")
    return settings


@pytest.fixture(scope="module")
def client(settings):
    return TestClient(create_app(settings), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def server(settings):
    with serve_asgi(create_app(settings), "the web app") as url:
        yield url


@pytest.fixture(scope="module")
def browser(settings):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**owner_browser_options(settings.chromium_executable()))
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    image = png()
    context.route("https://pbs.twimg.com/**", lambda route: route.fulfill(body=image, content_type="image/png"))
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server + "/")
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def type_query(page, text: str) -> None:
    box = page.locator("#q")
    box.fill("")
    box.press_sequentially(text, delay=15)
    # On a busy machine a pause between two keys can outlast the debounce, and
    # the hits of a prefix show first ("bor": seen at load 6, 3 December 2026).
    # Wait for the search of the whole text: the address holds it (set as the
    # search starts) and the line above the hits no longer says "Searching…".
    page.wait_for_function("text => new URLSearchParams(location.search).get('q') === text"
                           " && document.getElementById('search-info').textContent !== 'Searching…'", arg=text)


# --- in the browser ---------------------------------------------------------------


def test_search_filters_bookmark_and_paging(page):
    from playwright.sync_api import expect

    page.evaluate("window.__sameDocument = 'yes'")
    type_query(page, "borrow checker")
    hits = page.locator("#hits li.hit")
    expect(hits.first).to_be_visible()
    # The two posts that hold the exact phrase come first.
    first_two = {hits.nth(i).get_attribute("data-tweet-id") for i in range(2)}
    assert first_two == {"100", "300"}
    marks = [t.lower() for t in hits.first.locator("mark").all_inner_texts()]
    assert "borrow" in marks and "checker" in marks
    # Results came without a full reload of the page.
    assert page.evaluate("window.__sameDocument") == "yes"

    alice = page.locator('#hits li.hit[data-tweet-id="100"]')
    expect(alice.locator(".author")).to_have_text("@alice")
    expect(alice.locator("time")).to_have_text("2024-03-01")
    expect(alice.locator(".count")).to_contain_text(f"{RELEASES + 2} passages")
    expect(alice.locator(".from a")).to_have_attribute("href", "https://x.com/alice/status/100")
    expect(alice.locator(".thumbs img")).to_have_attribute("src", PHOTO)

    # Filters apply before ranking: only carol's post, then only videos.
    page.fill("#author", "carol")
    expect(hits).to_have_count(1)
    expect(hits.first).to_have_attribute("data-tweet-id", "300")
    page.fill("#author", "")
    page.select_option("#source", "video")
    expect(hits).to_have_count(1)
    expect(hits.first.locator(".badge").first).to_have_text("video")
    page.select_option("#source", "")
    page.fill("#after", "2024-03-01")
    expect(page.locator('#hits li.hit[data-tweet-id="300"]')).to_have_count(0)
    expect(page.locator('#hits li.hit[data-tweet-id="100"]')).to_have_count(1)
    page.fill("#after", "")
    page.select_option("#mode", "bm25")
    expect(page.locator("#search-info")).to_contain_text("bm25")
    expect(hits).to_have_count(2)  # keyword search: only the posts with the words

    # Open the bookmark: post, quoted post, links, media with its caption.
    page.locator('#hits li.hit[data-tweet-id="100"] .passage').click()
    card = page.locator("article.bookmark")
    expect(card).to_have_attribute("data-tweet-id", "100")
    expect(card.locator(".post-text").first).to_contain_text("Rust ownership and the borrow checker")
    expect(card.locator("blockquote.quoted")).to_contain_text("Fearless concurrency, quoted")
    expect(card.locator("ul.links a")).to_have_text("Frobnicator changelog")
    expect(card.locator("figure .caption")).to_contain_text("A cartoon crab holds a padlock")
    expect(card.locator("figure img")).to_have_attribute("src", PHOTO)
    page.wait_for_function("document.querySelector('figure img').naturalWidth > 0")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-search-bookmark.png"))

    # Page through the long document, to its end and back. Pages are those of
    # the MCP tool read_document: at most 2,000 words, cut at a passage end
    # (16 release notes of 120 words).
    card.locator("a.doc-link", has_text=CHANGELOG).click()
    info = page.locator("article.document .page-info").first
    total = RELEASES * 120
    expect(info).to_have_text(f"Words 1–1920 of {total}")
    expect(page.locator("ol.passages li").first).to_contain_text("Release note 1 of")
    expect(page.locator("article.document .prev").first).to_be_disabled()
    page.locator("article.document .next").first.click()
    expect(info).to_have_text(f"Words 1921–3840 of {total}")
    page.locator("article.document .next").first.click()
    expect(info).to_have_text(f"Words 3841–{total} of {total}")
    expect(page.locator("article.document .next").first).to_be_disabled()
    expect(page.locator("ol.passages li").last).to_contain_text(f"Release note {RELEASES} of")
    page.locator("article.document .prev").last.click()
    expect(info).to_have_text(f"Words 1921–3840 of {total}")
    page.screenshot(path=str(ARTIFACTS / "web-document.png"))


def test_the_address_keeps_the_search_and_its_filters(page, server):
    from playwright.sync_api import expect

    # A search that someone bookmarked or shared runs when the page loads.
    page.goto(server + "/?q=borrow+checker&folder=rust+talks&mode=bm25")
    hits = page.locator("#hits li.hit")
    expect(hits).to_have_count(2)
    assert {hits.nth(i).get_attribute("data-tweet-id") for i in range(2)} == {"100", "300"}
    expect(page.locator("#q")).to_have_value("borrow checker")
    expect(page.locator("#folder")).to_have_value("rust talks")
    expect(page.locator("#mode")).to_have_value("bm25")
    # A change of a filter goes into the address; a reload runs the same search.
    page.fill("#author", "carol")
    expect(hits).to_have_count(1)
    expect(page).to_have_url(re.compile(r"[?&]author=carol(&|$)"))
    assert page.evaluate("new URLSearchParams(location.search).get('folder')") == "rust talks"
    page.reload()
    expect(page.locator("#author")).to_have_value("carol")
    expect(hits).to_have_count(1)
    expect(hits.first).to_have_attribute("data-tweet-id", "300")
    # The folder filter keeps to the folder: the bread post is in another one.
    page.fill("#author", "")
    page.fill("#folder", "Bread")
    page.fill("#q", "sourdough bread")
    expect(hits).to_have_count(1)
    expect(hits.first).to_have_attribute("data-tweet-id", "200")
    # The folder names come from the index, for the input's list.
    expect(page.locator("#folder-names option")).to_have_count(2)
    hits.first.click()
    expect(page.locator("#detail .folders .badge")).to_have_text("Bread")


def test_wiki_search_page_and_wikilinks(page):
    from playwright.sync_api import expect

    type_query(page, "borrow checker")
    wiki_hit = page.locator("#wiki-hits li.wiki-hit").first
    expect(wiki_hit.locator("a.title")).to_have_text("Borrow checker")
    expect(wiki_hit.locator("mark").first).to_be_visible()
    wiki_hit.locator("a.title").click()
    body = page.locator("article.wiki-page .wiki-body")
    expect(body.locator("h1")).to_have_text("Borrow checker")
    expect(body.locator("table td").first).to_have_text("one mutable borrow")
    expect(body.locator("span.wikilink.missing")).to_have_text("missing-page")
    # Raw HTML and a javascript: address in a page stay inert.
    expect(body).to_contain_text("<script>window.__pwned = 3</script>")
    expect(body.locator("a", has_text="a bad link")).not_to_have_attribute("href", "javascript:window.__pwned=4")
    assert body.locator("a", has_text="a bad link").get_attribute("href") is None
    page.screenshot(path=str(ARTIFACTS / "web-wiki.png"))

    body.locator("a.wikilink", has_text="Graydon Hoare").click()
    expect(page.locator("article.wiki-page")).to_have_attribute("data-path", "entities/Graydon Hoare")
    expect(page.locator(".wiki-body h1")).to_have_text("Graydon Hoare")
    page.go_back()
    expect(page.locator("article.wiki-page")).to_have_attribute("data-path", "concepts/borrow-checker")
    # A citation link opens the source page at its paragraph.
    page.locator(".wiki-body a.wikilink", has_text="the Rust book").click()
    expect(page.locator("article.wiki-page")).to_have_attribute("data-path", "sources/rust-book")
    anchor = page.locator("#w-para3")
    expect(anchor).to_have_class("target")
    expect(anchor).to_be_in_viewport()
    # The top files (index.md) are read through the Wiki link, not searched.
    assert "index" not in page.locator("#wiki-hits .path").all_inner_texts()
    page.locator("#wiki-link").click()
    expect(page.locator("article.wiki-page")).to_have_attribute("data-path", "index")
    expect(page.locator(".wiki-body a.wikilink")).to_have_count(3)
    assert page.evaluate("window.__pwned") is None


def test_untrusted_bookmark_text_is_shown_escaped(page):
    from playwright.sync_api import expect

    type_query(page, "zanzibar")
    hit = page.locator('#hits li.hit[data-tweet-id="400"]')
    expect(hit.locator(".passage")).to_contain_text('<script>window.__pwned = 1</script><img src=x onerror=')
    hit.locator(".passage").click()
    card = page.locator('article.bookmark[data-tweet-id="400"]')
    expect(card.locator(".post-text")).to_have_text(HOSTILE)
    expect(card.locator("header strong")).to_have_text(HOSTILE)
    assert page.locator("img[src='x']").count() == 0
    assert page.locator("#detail script, #hits script").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_status_panel(page, settings):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#status-link").click()
    panel = page.locator("article.status")
    expect(panel.locator(".last-sync")).to_have_text(SYNCED.isoformat())
    stages = panel.locator("table.stages tbody tr")
    expect(stages.filter(has_text="links extracted").locator("td").first).to_have_text("1 of 1")
    expect(stages.filter(has_text="photos captioned").locator("td").first).to_have_text("1 of 1")
    expect(stages.filter(has_text="videos transcribed").locator("td").first).to_have_text("1 of 1")
    expect(stages.filter(has_text="indexed").locator("td").first).to_have_text("5 of 5")
    services = panel.locator("table.services tr")
    expect(services.filter(has_text="dagster_ui").locator(".state")).to_have_text("not ready")
    expect(services.filter(has_text="groq_api_key").locator(".state")).to_have_text("ready")
    expect(services.filter(has_text="query_embedder").locator(".state")).to_have_text("ready")
    expect(panel.get_by_role("link", name="Dagster UI")).to_have_attribute("href", settings.kb_dagster_ui_url + "/")
    expect(page.locator("#dagster-link")).to_have_attribute("href", settings.kb_dagster_ui_url + "/")
    expect(page.locator("#sync-line")).to_have_text("5 bookmarks · last sync 2024-03-30")
    assert SECRET not in page.content()
    page.screenshot(path=str(ARTIFACTS / "web-status.png"))


# --- the JSON endpoints and the shared reader ---------------------------------------


def test_document_pages_are_bounded_and_cover_the_whole_text(client):
    offset, positions, texts = 0, [], []
    while offset is not None:
        answer = client.get("/api/document", params={"id": CHANGELOG, "offset": offset})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert page["offset"] == offset and sum(len(p["text"].split()) for p in page["parts"]) <= PAGE_WORDS
        positions += [p["position"] for p in page["parts"]]
        texts += [p["text"] for p in page["parts"]]
        assert page["has_more"] == (page["next_offset"] is not None)
        offset = page["next_offset"]
    assert positions == list(range(RELEASES))
    assert texts == [release_note(n) for n in range(1, RELEASES + 1)]
    # Another spelling of the same address finds the same page.
    other = client.get("/api/document", params={"id": "https://EXAMPLE.org/frobnicator/changelog/?utm_source=x"})
    assert other.json()["ref"] == CHANGELOG
    # A bookmark id or its post URL reads every text of the bookmark, the post first.
    for target in ("100", "https://twitter.com/alice/status/100"):
        whole = client.get("/api/document", params={"id": target}).json()
        assert whole["tweet_id"] == "100" and whole["total_passages"] == RELEASES + 2
        assert [p["source"] for p in whole["parts"][:2]] == ["post", "link"]


@pytest.mark.parametrize(("path", "params", "status", "words"), [
    ("/api/search", {"q": "rust", "after": "yesterday"}, 400, "after='yesterday' is not a date"),
    ("/api/search", {"q": "rust", "mode": "fuzzy"}, 400, "mode='fuzzy' is unknown"),
    ("/api/document", {"id": "999"}, 404, "id='999' is not in the index: no bookmark has this id"),
    ("/api/document", {"id": "https://nowhere.example/x"}, 404, "no bookmark and no page has this URL"),
    ("/api/document", {"id": CHANGELOG, "offset": "-1"}, 400, "offset=-1 is negative"),
    ("/api/document", {"id": CHANGELOG, "offset": "99999"}, 400, "offset=99999 is past the end"),
    ("/api/document", {"id": CHANGELOG, "offset": "two"}, 400, "offset='two' is not a whole number"),
    ("/api/document", {}, 400, "id is missing"),
    ("/api/bookmark/999", {}, 404, "tweet_id='999' is not in the index"),
    ("/api/wiki/page", {"path": "../../../etc/passwd"}, 404, "no wiki page"),
    ("/api/wiki/page", {"path": ""}, 400, "path is empty"),
])
def test_bad_input_gets_a_clear_error(client, path, params, status, words):
    answer = client.get(path, params=params)
    assert answer.status_code == status
    assert words in answer.json()["error"]


def test_wiki_is_searched_through_the_index_and_else_through_the_files(client, tmp_path):
    answer = client.get("/api/wiki/search", params={"q": "Graydon Hoare"}).json()
    assert answer["searched"] == "index"
    assert answer["hits"][0]["path"] == "entities/Graydon Hoare"
    assert answer["hits"][0]["title"] == "Graydon Hoare"
    # The bookmark search leaves the wiki passages out.
    hits = client.get("/api/search", params={"q": "Graydon Hoare Mozilla"}).json()["hits"]
    assert hits and not [h for h in hits if h["tweet_id"].startswith("wiki:")]
    # A wiki that the index does not hold yet: the files are searched.
    bare = Settings(kb_home=tmp_path / "bare")
    write_wiki(bare.wiki_dir)
    with TestClient(create_app(bare), base_url="http://127.0.0.1") as other:
        answer = other.get("/api/wiki/search", params={"q": "Graydon"}).json()
        assert answer["searched"] == "files" and answer["hits"][0]["path"] == "entities/Graydon Hoare"
        assert other.get("/api/search", params={"q": "rust"}).json()["hits"] == []
        assert other.get("/api/status").json()["index"]["error"] == "the index is empty: run `kb sync`"
        assert other.get("/api/document", params={"id": "100"}).status_code == 404
    # The reader made no index folder in the empty KB_HOME.
    assert not bare.lancedb_dir.exists()


def test_search_answer_carries_the_hit_fields(client):
    answer = client.get("/api/search", params={"q": "borrow checker", "author": "@Alice"}).json()
    assert [h["tweet_id"] for h in answer["hits"]] == ["100"]
    hit = answer["hits"][0]
    assert hit["chunk_count"] == RELEASES + 2 and hit["media"][0]["url"] == PHOTO
    assert [hit["best_chunk"][s:e] for s, e in hit["highlights"]] == ["borrow", "checker"]
    assert answer["last_sync"] == SYNCED.isoformat()
    assert client.get("/api/search", params={"q": "  "}).json()["hits"] == []


def test_the_deep_search_is_one_choice_away_and_the_fast_search_is_the_default(client):
    """The page keeps the fast search as its default; the deep search is one
    choice of the mode list (issue 49)."""
    fast = client.get("/api/search", params={"q": "borrow checker"}).json()
    assert fast["mode"] == "hybrid" and fast["rerank"] is False
    assert all(h["rerank_score"] is None for h in fast["hits"])
    deep = client.get("/api/search", params={"q": "borrow checker", "mode": "deep"}).json()
    assert deep["mode"] == "hybrid" and deep["rerank"] is True
    assert {h["tweet_id"] for h in deep["hits"]} == {h["tweet_id"] for h in fast["hits"]}
    assert all(isinstance(h["rerank_score"], float) for h in deep["hits"])
    # The wiki list beside it takes the same mode, as a hybrid search.
    assert client.get("/api/wiki/search", params={"q": "Graydon Hoare", "mode": "deep"}).json()["hits"]
    assert '<option value="deep">' in client.get("/").text
    # A mode that the page does not offer is refused, and names itself.
    answer = client.get("/api/search", params={"q": "rust", "mode": "deeper"})
    assert answer.status_code == 400 and "mode='deeper' is unknown" in answer.json()["error"]


def test_folder_filter_and_folder_list(client):
    answer = client.get("/api/search", params={"q": "borrow checker", "folder": "Rust Talks"}).json()
    assert {h["tweet_id"] for h in answer["hits"]} == {"100", "300"} and answer["filters"]["folder"] == "Rust Talks"
    unknown = client.get("/api/search", params={"q": "borrow", "folder": "Poems"})
    assert unknown.status_code == 400 and "'Bread', 'Rust talks'" in unknown.json()["error"]
    assert client.get("/api/folders").json()["folders"] == [
        {"folder_id": "f2", "name": "Bread", "bookmarks": 1}, {"folder_id": "f1", "name": "Rust talks", "bookmarks": 2}]
    assert client.get("/api/bookmark/300").json()["folders"] == ["Rust talks"]


def test_only_loopback_host_names_are_answered(client):
    # A site that points its own name at 127.0.0.1 (DNS rebinding) gets nothing.
    refused = client.get("/api/search", params={"q": "rust"}, headers={"host": "evil.example:8765"})
    assert refused.status_code == 400
    # The refusal carries kb web's headers too (it repeats the Host back).
    assert refused.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in refused.headers["content-security-policy"]
    # The TestClient serves port 80: a Host without a port names it.
    answer = client.get("/", headers={"host": "localhost"})
    assert answer.status_code == 200
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert answer.headers["x-content-type-options"] == "nosniff"


def test_status_reads_no_duckdb_and_shows_no_secret(client, settings):
    answer = client.get("/api/status")
    assert answer.status_code == 200
    status = answer.json()
    assert "normalized" not in status
    assert status["index"]["indexed_bookmarks"] == 5  # the wiki pages in the index are not bookmarks
    assert status["index"]["by_source"]["link"] == {"passages": RELEASES, "bookmarks": 1}
    assert status["services"]["groq_api_key"] == {"ready": True, "detail": "set"}
    assert SECRET not in answer.text
    assert status["wiki"] == {"exists": True, "pages": 3, "indexed": 3,
                              "by_type": {"concepts": 1, "entities": 1, "sources": 1}}
    assert {"stage": "wiki pages indexed", "done": 3, "of": 3, "percent": 100} in status["index"]["stages"]


def test_wiki_markdown_is_sanitized():
    from html.parser import HTMLParser

    class Elements(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found: list[tuple[str, dict]] = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, dict(attrs)))

    html = render_markdown(
        "<script>alert(1)</script>\n\n<img src=x onerror=alert(2)> [a](&#106;avascript:alert(3)) "
        "[b](java&#x09;script:alert(4)) ![c](javascript:alert(5)) [ok](https://example.org/?a=1&b=2)\n\n"
        "# Results {: onclick=alert(6) }\n\n```{#detail .results onclick=alert(7)}\nx\n```\n\n"
        "```{#w-para3}\ny\n```\n\n```python\nz = 1\n```\n", WikiReader(Path("/nonexistent")).resolver())
    parser = Elements()
    parser.feed(html)
    tags = [tag for tag, _ in parser.found]
    assert "script" not in tags
    assert [attrs for tag, attrs in parser.found if tag == "img"] == [{"alt": "c"}]
    for tag, attrs in parser.found:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        for name in ("href", "src"):
            assert "script" not in attrs.get(name, "").lower(), (tag, attrs)
    assert ("a", {"class": "external", "href": "https://example.org/?a=1&b=2"}) in parser.found
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text
    # Heading ids get a prefix: a heading cannot take the id of the page's own #results.
    assert [attrs.get("id") for tag, attrs in parser.found if tag == "h1"][0].startswith("w-results")
    # A fenced block's {#id .class} came out as raw HTML, past the sanitizer:
    # it took the page's #detail, and a citation's anchor w-para3.
    assert [attrs for tag, attrs in parser.found if tag == "pre"] == [{}, {}, {}]
    assert ("code", {"class": "language-python"}) in parser.found


def test_wiki_search_ranks_title_and_phrase(settings):
    reader = WikiReader(settings.wiki_dir)
    assert reader.search("Graydon")[0]["path"] == "entities/Graydon Hoare"
    assert reader.search("borrow checker")[0]["path"] == "concepts/borrow-checker"
    assert reader.search("the of and") == []
    assert reader.resolve("Graydon Hoare") == "entities/Graydon Hoare"
    assert reader.resolve("sources/rust-book#para3|book") == "sources/rust-book"
    assert reader.resolve("concepts/missing-page") is None


def test_a_query_of_a_stranger_that_is_too_long_is_refused_by_its_length(client):
    """A page in the owner's browser may open kb web with a query of 60 kB
    (a top-level navigation passes the guard): 15,000 words took 38 s of
    CPU of kb web, because each word was looked for in a list of the words
    before it, once per hit. Both searches refuse it, and name the limit."""
    from kb.apps.web.reader import query_terms

    words = [f"w{i:04d}" for i in range(9_000)]  # 54 kB: the client's longest query part is 64 kB
    query = " ".join(words)
    for path in ("/api/search", "/api/wiki/search"):
        answer = client.get(path, params={"q": query})
        assert answer.status_code == 400, path
        assert answer.json()["error"] == f"query has {len(query):,} characters: a query has at most 1,000", path
    # The words of a query, once each and in their order (the list kept
    # them so, in quadratic time).
    assert query_terms(query + " " + query) == [w.lower() for w in words]
    assert query_terms("Rust checkers and the rust checker") == ["rust", "checker"]
