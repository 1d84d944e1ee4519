"""Bookmark folders and the author's thread, from the raw answers to the
search: `kb import` (no browser) of real-shaped answers, through every stage,
into real DuckDB and LanceDB files, then `kb search`, the MCP tools and
`kb status`.

The folder answers follow the public captures of the X web client
(twillot-app/twillot docs/req-res/folders.md; see tests/x_fixtures.py). The
thread is the real TweetDetail capture in ../shared/fixtures/x: @XDevelopers'
first post, then three replies of the same author in a chain, among replies
of 35 other people."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from kb.settings import get_settings
from tests.shared_data import x_fixture
from tests.x_fixtures import all_tweet_entries, folder_list_answer, folder_page, paged_bookmarks

FOCAL = "1649191520250245121"
THIRD_REPLY = "https://x.com/XDevelopers/status/1649191523697979392"
READING, CODE = "1794418757911433313", "1794004218426319192"


@pytest.fixture(autouse=True)
def offline_stages(monkeypatch):
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")  # no model load


def kb(*argv: str) -> int:
    """The `kb` command line, in this process; returns its exit code."""
    import click

    from kb.apps.cli import main

    try:
        main(list(argv), prog_name="kb", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return 0


def search(query: str, capsys, **options) -> dict:
    flags = [part for name, value in options.items() for part in (f"--{name}", value)]
    capsys.readouterr()
    assert kb("search", query, "--json", "-n", "20", *flags) == 0
    return json.loads(capsys.readouterr().out)


def duck(sql: str) -> list[tuple]:
    conn = duckdb.connect(str(get_settings().duckdb_path), read_only=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def write(folder: Path, name: str, payload: dict) -> str:
    path = folder / name
    path.write_text(json.dumps(payload))
    return str(path)


@pytest.mark.slow
def test_folders_and_the_authors_thread_from_import_to_search(tmp_path, capsys):
    entries = all_tweet_entries()
    focal = next(e for e in entries if e["entryId"] == f"tweet-{FOCAL}")
    bookmarks = [focal] + [e for e in entries if e is not focal][:24]
    ids = [e["entryId"].removeprefix("tweet-") for e in bookmarks]
    files = tmp_path / "answers"
    files.mkdir()
    pages = [write(files, f"saved-{n}.json", page) for n, page in enumerate(paged_bookmarks(bookmarks), start=1)]
    thread = files / "raw_tweet_details.json"  # not the capture's name: kb finds the post by the answer's shape
    shutil.copy(x_fixture("raw_tweet_details.json"), thread)
    folder_list = write(files, "list.json", folder_list_answer(((READING, "Reading"), (CODE, "GitHub"))))
    reading = write(files, f"folder-{READING}-0001.json", folder_page([bookmarks[0], bookmarks[3], bookmarks[4]]))
    code = write(files, f"folder-{CODE}-0001.json", folder_page([bookmarks[5], bookmarks[6]]))

    # In any order: folder pages and the thread before the Bookmarks pages.
    assert kb("import", reading, str(thread), code, *pages, folder_list, "--no-link") == 0

    # The third reply of the author finds the bookmark; the hit names the reply.
    hits = search("Thank you to those who have already migrated to our new API offerings", capsys)["hits"]
    assert hits[0]["tweet_id"] == FOCAL and hits[0]["best_source"] == "thread" and hits[0]["best_ref"] == THIRD_REPLY
    # A phrase only in someone else's reply finds nothing: no passage holds it.
    assert search('"Rapid Unscheduled Disassembly"', capsys, mode="bm25")["hits"] == []
    texts = [t for (t,) in duck("SELECT text FROM chunks")]
    assert not any("Rapid Unscheduled" in text or "What data makes you think" in text for text in texts)
    assert [p for (p,) in duck(f"SELECT post_id FROM thread_posts WHERE tweet_id = '{FOCAL}' ORDER BY position")] \
        == ["1649191521323995138", "1649191522485817345", "1649191523697979392"]
    # The thread's links go to the documents stage: they are links of the bookmark.
    from kb.documents.document_store import targets_for_batch

    [(batch,)] = duck("SELECT DISTINCT batch FROM bookmarks")
    conn = duckdb.connect(str(get_settings().duckdb_path), read_only=True)
    try:
        targets = {t.url_norm for t in targets_for_batch(conn, batch, retry=False)}
    finally:
        conn.close()
    assert "https://developer.twitter.com" in targets
    # A folder page's small sortIndex never replaces the bookmark time of the Bookmarks page.
    assert duck(f"SELECT sort_index FROM bookmarks WHERE tweet_id = '{ids[3]}'") == [(bookmarks[3]["sortIndex"],)]

    # The folder filter keeps to the folder, in every front end.
    in_reading = {h["tweet_id"] for h in search("api developers post", capsys, folder="reading")["hits"]}
    assert in_reading == {ids[0], ids[3], ids[4]}
    assert kb("search", "api", "--folder", "Poems") != 0
    assert "the folders are 'GitHub', 'Reading'" in capsys.readouterr().err

    from mcp_server.server import get_bookmark, search_bookmarks

    answer = search_bookmarks("api developers post", limit=20, folder="GitHub")
    assert {h["tweet_id"] for h in answer["hits"]} == {ids[5], ids[6]} and answer["filters"]["folder"] == "GitHub"
    card = get_bookmark(FOCAL)
    assert card["folders"] == ["Reading"] and [p["url"] for p in card["thread"]][-1] == THIRD_REPLY
    assert len(card["thread"]) == 3

    from kb.apps.status import collect_status

    assert collect_status()["normalized"]["folders"] == [
        {"folder_id": CODE, "name": "GitHub", "bookmarks": 2}, {"folder_id": READING, "name": "Reading", "bookmarks": 3}]

    # The next sync: the owner renamed GitHub to Code, and took a post out of
    # Reading. The renamed folder keeps its bookmarks under its new name.
    renamed = write(files, "list-2.json", folder_list_answer(((READING, "Reading"), (CODE, "Code"))))
    reading_2 = write(files, f"folder-{READING}-0002.json", folder_page([bookmarks[0], bookmarks[3]]))
    # A folder page under another name cannot say its folder: it is kept, and named.
    unnamed = write(files, "folder-page.json", folder_page([bookmarks[7]]))
    assert kb("import", renamed, reading_2, unnamed, "--no-link") == 1
    report = capsys.readouterr()
    problems = [line for line in report.err.splitlines() if "Could not read" in line or "no page was read" in line]
    assert len(problems) == 1 and "folder-page.json" in problems[0] and "does not name its folder" in problems[0]

    assert {h["tweet_id"] for h in search("api developers post", capsys, folder="Code")["hits"]} == {ids[5], ids[6]}
    assert {h["tweet_id"] for h in search("api developers post", capsys, folder="Reading")["hits"]} == {ids[0], ids[3]}
    assert kb("search", "api", "--folder", "GitHub") != 0
    assert collect_status()["normalized"]["folders"][0] == {"folder_id": CODE, "name": "Code", "bookmarks": 2}

    # The post that left Reading is in Code now: the next read of Code shows it.
    code_2 = write(files, f"folder-{CODE}-0002.json", folder_page([bookmarks[4], bookmarks[5], bookmarks[6]]))
    assert kb("import", code_2, "--no-link") == 0
    assert {h["tweet_id"] for h in search("api developers post", capsys, folder="Code")["hits"]} == \
        {ids[4], ids[5], ids[6]}
    assert get_bookmark(ids[4])["folders"] == ["Code"]

    # The raw answers are kept as they came: `kb normalize` reads them again
    # and comes to the same rows.
    before = duck("SELECT folder_id, tweet_id FROM folder_bookmarks ORDER BY ALL")
    unsorted = [p for p in get_settings().x_raw_dir.glob("*/unsorted-*.json")]
    assert [p.read_bytes() for p in unsorted] == [Path(unnamed).read_bytes()]
    capsys.readouterr()
    assert kb("normalize") == 1  # it names the unsorted answer again, and only it
    named = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Problem:")]
    assert len(named) == 1 and "unsorted-0001.json" in named[0] and "names no folder or post" in named[0], named
    assert duck("SELECT folder_id, tweet_id FROM folder_bookmarks ORDER BY ALL") == before
    assert duck(f"SELECT count(*) FROM thread_posts WHERE tweet_id = '{FOCAL}'") == [(3,)]


def test_ids_from_a_hostile_page_never_reach_an_address_or_a_file_name(tmp_path):
    """A Bookmarks page names posts and folders; kb puts their ids into X
    addresses and raw file names. Only digits (posts) and letters and digits
    (folders) pass, and the raw store refuses any other name."""
    from kb.x.raw_store import RawStore
    from kb.x.capture_extras import thread_targets

    hostile = [("../../../etc/passwd", "x"), ("123", "../evil"), ("456", "alice"), ("456", "alice"),
               ("789", "bob"), ("12 34", "bob")]
    assert thread_targets(hostile, read={"789"}, limit=10) == [("123", "i"), ("456", "alice")]
    assert thread_targets(hostile, read=set(), limit=1) == [("123", "i")]
    store = RawStore(root=str(tmp_path / "raw"))
    for name in ("thread-../../x.json", "folder-a/b-0001.json", "page-0001.json", "capture.json", "../folders-0001.json"):
        with pytest.raises(ValueError):
            store.write_answer("b1", name, b"{}")
    assert not any(tmp_path.rglob("*.json"))


def test_only_a_folder_read_to_its_end_replaces_its_bookmarks():
    """A browser capture that a limit cut off in a folder holds only the
    folder's first pages: they add bookmarks, and remove none."""
    from kb.x.raw_store import CaptureManifest
    from kb.x.batch_rows import BatchRows, folders_read_whole

    members = {"a": {"1"}, "b": {"2"}}
    cut = CaptureManifest(batch="b1", mode="browser", full=False, complete=True, folders=["a", "b"],
                          folders_done=["a"])
    assert folders_read_whole(BatchRows("b1", cut, folder_members=members)) == {"a"}
    imported = CaptureManifest(batch="b1", mode="files", full=False, complete=True)
    assert folders_read_whole(BatchRows("b1", imported, folder_members=members)) == {"a", "b"}
