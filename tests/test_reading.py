"""kb/index/reading.py at the function level: the page bound, the document
that an id or URL names (over a real LanceDB index), and the wiki path
safety (over a real folder with symbolic links). The MCP server and the web
page read through these functions; tests/test_mcp_server.py and
tests/test_web.py test them through the two consumers."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kb.index.reading import (PAGE_CHARS, PAGE_WORDS, DocumentNotFound, OffsetError, Passage, WikiPageNotFound,
                               WikiPathError, clip_words, is_wiki_page, media_with_captions, page_of, read_wiki_file,
                               resolve_document, wiki_page_file, wiki_page_path)
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
POST = "https://x.com/alice/status/100"
# The documents stage stores a page under its normalized URL (no tracking
# parameters, no final slash, lower-case host).
PAGE = "https://example.org/notes/rust"


# --- the page bound ----------------------------------------------------------------


def test_pages_never_exceed_the_bound_and_rejoin():
    rng = random.Random(3)
    passages = [Passage("link", "r", i, " ".join(f"w{i}x{j}" for j in range(rng.randint(1, 900))))
                for i in range(40)]
    # A passage with no spaces at all (base64, or Chinese text) is bounded too.
    passages.append(Passage("link", "r", 40, "字" * 50_000))
    offset, texts = 0, []
    while True:
        page = page_of(passages, offset)
        assert page.words <= PAGE_WORDS
        assert sum(len(p["text"]) for p in page.parts) <= PAGE_CHARS
        texts.append(page.parts)
        if not page.has_more:
            break
        offset = page.next_offset
    pieces: dict[int, list[str]] = {}
    for parts in texts:
        for part in parts:
            pieces.setdefault(part["position"], []).append(part["text"])
    # A page ends after a word and the next starts with the next word.
    for passage in passages[:-1]:
        assert " ".join(pieces[passage.position]).split() == passage.text.split()
    assert "".join(pieces[40]) == passages[-1].text


def test_a_page_ends_at_a_passage_end_when_that_keeps_half_the_page():
    passages = [Passage("link", "r", 0, "a " * 1500), Passage("link", "r", 1, "b " * 1500)]
    first = page_of(passages)
    assert (first.words, first.next_offset) == (1500, 1500)
    assert [p["whole_passage"] for p in first.parts] == [True]
    # A passage end before half the page does not cut the page short.
    passages = [Passage("link", "r", 0, "a " * 400), Passage("link", "r", 1, "b " * 3000)]
    first = page_of(passages)
    assert first.words == PAGE_WORDS
    assert [p["whole_passage"] for p in first.parts] == [True, False]


def test_page_offsets_out_of_the_document_are_refused():
    passages = [Passage("post", "r", 0, "one two three")]
    assert page_of(passages, 3).parts == [] and not page_of(passages, 3).has_more
    for offset, reason in [(-1, "is negative"), (4, "past the end: the document has 3 words"),
                           ("1", "is not a whole number"), (True, "is not a whole number")]:
        with pytest.raises(OffsetError, match=reason):
            page_of(passages, offset)


def test_clip_words_keeps_both_bounds():
    assert clip_words("a b c", 5) == ("a b c", False)
    assert clip_words("a b c d", 2) == ("a b", True)
    text, cut = clip_words("x" * 1000, 100, max_chars=100)
    assert cut and len(text) <= 100


# --- documents ---------------------------------------------------------------------


def row(tweet_id: str, source: str, ref: str, position: int, text: str) -> dict:
    return {"chunk_id": f"{tweet_id}-{source}-{ref}-{position}", "tweet_id": tweet_id, "url": POST,
            "author": "alice", "created_at": T0, "source": source, "ref": ref, "position": position, "text": text}


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> ChunkIndex:
    folder = tmp_path_factory.mktemp("reading") / "lancedb"
    index = ChunkIndex.from_settings(path=str(folder))
    rows = [row("100", "image", "https://pbs.twimg.com/media/crab.jpg", 0, "A crab with a padlock."),
            row("100", "link", PAGE, 1, "Second passage of the notes."),
            row("100", "link", PAGE, 0, "First passage of the notes."),
            row("100", "post", POST, 0, "Notes on Rust ownership.")]
    index.replace_chunks(["100"], rows, Embedder.from_settings(backend="hash", cache_dir=str(folder)))
    return index


def test_a_tweet_id_or_post_url_names_every_text_behind_the_bookmark_in_reading_order(index):
    for value in ("100", " 100 ", POST, "https://twitter.com/i/web/status/100"):
        document = resolve_document(index, value)
        assert (document.tweet_id, document.ref) == ("100", None)
        assert [(p.source, p.position) for p in document.passages] == [
            ("post", 0), ("link", 0), ("link", 1), ("image", 0)]


@pytest.mark.parametrize("url", [PAGE, PAGE + "/", "https://EXAMPLE.org/notes/rust?utm_source=x"])
def test_a_page_url_names_that_page_in_any_of_its_forms(index, url):
    document = resolve_document(index, url)
    assert (document.tweet_id, document.ref) == (None, PAGE)
    assert [p.text for p in document.passages] == ["First passage of the notes.", "Second passage of the notes."]


@pytest.mark.parametrize("value, error, reason", [
    ("  ", ValueError, "tweet_id_or_url is empty"),
    ("999", DocumentNotFound, "tweet_id_or_url='999' is not in the index: no bookmark has this id"),
    ("https://example.org/other", DocumentNotFound, "no bookmark and no page has this URL"),
    ("https://x.com/bob/status/999", DocumentNotFound, "no bookmark and no page has this URL"),
])
def test_an_unknown_or_empty_id_gets_a_clear_error(index, value, error, reason):
    with pytest.raises(error, match=reason):
        resolve_document(index, value, name="tweet_id_or_url")


def test_media_get_their_caption_from_the_card_or_from_the_photo_passages(index):
    crab = "https://pbs.twimg.com/media/crab.jpg"
    media = [{"url": crab}, {"url": "https://pbs.twimg.com/media/b.jpg", "caption": "From the card."},
             {"url": "https://pbs.twimg.com/media/none.jpg"}]
    assert media_with_captions(index, "100", media) == [
        {"url": crab, "caption": "A crab with a padlock."},
        {"url": "https://pbs.twimg.com/media/b.jpg", "caption": "From the card."},
        {"url": "https://pbs.twimg.com/media/none.jpg"}]
    cut = media_with_captions(index, "100", media[:1], max_words=2)
    assert cut == [{"url": crab, "caption": "A crab", "caption_cut": True}]
    assert media[0] == {"url": crab}  # the card is not changed


# --- wiki path safety ------------------------------------------------------------------


@pytest.mark.parametrize("path, reason", [
    ("  ", "path is empty"),
    ("#para1", "names no page"),
    ("/etc/passwd", "is absolute"),
    (r"C:\Windows\win.ini", "is absolute"),
    ("~/secret.md", "is absolute"),
    ("../secret.md", "leaves the wiki folder"),
    (r"wiki\..\..\secret.md", "leaves the wiki folder"),
    (".git/config", "is a hidden file"),
    ("wiki/.obsidian/app.md", "is a hidden file"),
    ("raw/parsed/notes.txt", "is not a Markdown page"),
])
def test_wiki_page_path_refuses_paths_that_can_leave_the_folder(path, reason):
    with pytest.raises(WikiPathError, match=reason):
        wiki_page_path(path)


def test_wiki_page_path_takes_page_paths_and_link_targets():
    assert str(wiki_page_path("wiki/concepts/vector-search.md")) == "wiki/concepts/vector-search.md"
    assert str(wiki_page_path("concepts/vector-search#para3|the text")) == "concepts/vector-search.md"
    assert str(wiki_page_path("entities/Ada Lovelace")) == "entities/Ada Lovelace.md"


@pytest.fixture
def wiki(tmp_path) -> Path:
    root = tmp_path / "wiki-root"
    (root / "wiki" / "concepts").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("url = https://TOPSECRET@example.org/wiki.git\n")
    (root / "index.md").write_text("# Index\n")
    (root / "wiki" / "concepts" / "vector-search.md").write_text(
        "---\ntype: concept\nname: Vector search\n---\n# Vector search\n\nHNSW graphs.\n")
    outside = tmp_path / "secret.md"
    outside.write_text("TOPSECRET outside the wiki\n")
    (root / "wiki" / "concepts" / "escape.md").symlink_to(outside)
    # A link with a page name, to a hidden file inside the folder.
    (root / "wiki" / "concepts" / "git.md").symlink_to(root / ".git" / "config")
    # A link to another page inside the folder is a page.
    (root / "wiki" / "concepts" / "alias.md").symlink_to(root / "wiki" / "concepts" / "vector-search.md")
    return root


def test_wiki_page_file_finds_pages_from_the_folder_or_its_wiki_folder(wiki):
    page = (wiki / "wiki" / "concepts" / "vector-search.md").resolve()
    for path in ("wiki/concepts/vector-search.md", "concepts/vector-search", "concepts/vector-search#para1"):
        assert wiki_page_file(wiki, path) == page
    assert wiki_page_file(wiki, "index") == (wiki / "index.md").resolve()
    assert wiki_page_file(wiki, "concepts/alias") == page


@pytest.mark.parametrize("path, error, reason", [
    ("concepts/escape", WikiPathError, "leaves the wiki folder"),
    ("concepts/git", WikiPathError, "is not a wiki page"),
    ("concepts/no-such-page", WikiPageNotFound, "there is no file concepts/no-such-page.md"),
])
def test_wiki_page_file_refuses_links_out_and_names_missing_pages(wiki, path, error, reason):
    with pytest.raises(error, match=reason) as caught:
        wiki_page_file(wiki, path)
    assert "TOPSECRET" not in str(caught.value)


def test_is_wiki_page_keeps_only_markdown_pages_inside_the_folder(wiki):
    concepts = wiki / "wiki" / "concepts"
    assert is_wiki_page(wiki, concepts / "vector-search.md")
    assert is_wiki_page(wiki, concepts / "alias.md")
    assert not is_wiki_page(wiki, concepts / "escape.md")
    assert not is_wiki_page(wiki, concepts / "git.md")
    assert not is_wiki_page(wiki, wiki / ".git" / "config")
    assert not is_wiki_page(wiki, concepts / "missing.md")


def test_read_wiki_file_gives_text_and_frontmatter(wiki, tmp_path):
    page = read_wiki_file(wiki, "concepts/vector-search")
    assert page.path == "wiki/concepts/vector-search.md"
    assert page.frontmatter == {"type": "concept", "name": "Vector search"}
    assert page.text.startswith("---\ntype: concept") and page.body[0] == "# Vector search"
    # A path that is refused gets its own error, even before the wiki exists.
    with pytest.raises(WikiPathError, match="is absolute"):
        read_wiki_file(tmp_path / "none", "/etc/passwd")
    with pytest.raises(WikiPageNotFound, match="the wiki does not exist yet"):
        read_wiki_file(tmp_path / "none", "concepts/vector-search")
