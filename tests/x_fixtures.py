"""Build Bookmarks pages from the real X captures in ../shared/fixtures/x.

The captures are other timeline endpoints; their tweet entries have the same
shape as in the Bookmarks response. Here they move into the Bookmarks
envelope (see ../shared/fixtures/x/README.md), paged by cursor.
"""

from __future__ import annotations

import json
from functools import cache

from tests.shared_data import x_fixture

FIXTURE_FILES = (
    "raw_list_timeline.json",
    "raw_user_tweets.json",
    "raw_tweet_details.json",
    "manual_tweet_with_video_1.json",
    "card_summary.json",
    "card_broadcast.json",
    "card_audiospace.json",
)


def _walk_entries(node):
    if isinstance(node, dict):
        if isinstance(node.get("entryId"), str) and "content" in node:
            yield node
            return
        for value in node.values():
            yield from _walk_entries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_entries(value)


@cache
def fixture_tweet_entries(name: str) -> tuple[str, ...]:
    """The tweet entries of one capture file (as JSON strings, so the cache
    cannot be mutated by a test)."""
    payload = json.loads(x_fixture(name).read_text())
    out = []
    for entry in _walk_entries(payload):
        if entry["entryId"].startswith("tweet-"):
            result = entry["content"].get("itemContent", {}).get("tweet_results", {}).get("result")
            if result:
                out.append(json.dumps(entry))
    return tuple(out)


def all_tweet_entries() -> list[dict]:
    """Every tweet entry of every capture, de-duplicated by entryId, with
    sortIndex rewritten to a strictly falling sequence (newest first), as a
    bookmark timeline has it."""
    seen: set[str] = set()
    entries: list[dict] = []
    for name in FIXTURE_FILES:
        for raw in fixture_tweet_entries(name):
            entry = json.loads(raw)
            if entry["entryId"] in seen:
                continue
            seen.add(entry["entryId"])
            entries.append(entry)
    top = 1900000000000000000
    for i, entry in enumerate(entries):
        entry["sortIndex"] = str(top - i * 1000)
    return entries


def cursor_entry(kind: str, value: str, sort_index: str) -> dict:
    return {
        "entryId": f"cursor-{kind.lower()}-{sort_index}",
        "sortIndex": sort_index,
        "content": {"entryType": "TimelineTimelineCursor", "__typename": "TimelineTimelineCursor",
                    "value": value, "cursorType": kind},
    }


def bookmarks_page(entries: list[dict], *, bottom_cursor: str | None, page_no: int = 0,
                   folder: bool = False) -> dict:
    """One Bookmarks response: the entries, then top and bottom cursors.
    folder=True: a BookmarkFolderTimeline response, whose envelope is
    data.bookmark_collection_timeline (twillot-app/twillot docs/req-res/folders.md)."""
    items = list(entries)
    items.append(cursor_entry("Top", f"top-{page_no}", "1999999999999999999"))
    if bottom_cursor is not None:
        items.append(cursor_entry("Bottom", bottom_cursor, "0"))
    timeline = {"timeline": {"instructions": [{"type": "TimelineAddEntries", "entries": items}],
                             "responseObjects": {"feedbackActions": []}}}
    return {"data": {"bookmark_collection_timeline" if folder else "bookmark_timeline_v2": timeline}}


def paged_bookmarks(entries: list[dict], page_size: int = 20, *, folder: bool = False) -> list[dict]:
    """Split entries into Bookmarks pages linked by cursor. The last page has
    a bottom cursor but no tweets, as X ends a timeline."""
    pages = []
    chunks = [entries[i:i + page_size] for i in range(0, len(entries), page_size)]
    for n, chunk in enumerate(chunks):
        pages.append(bookmarks_page(chunk, bottom_cursor=f"page-{n + 1}", page_no=n, folder=folder))
    pages.append(bookmarks_page([], bottom_cursor=f"page-{len(chunks) + 1}", page_no=len(chunks), folder=folder))
    return pages


# --- bookmark folders ------------------------------------------------------------
# The shapes below follow the public captures of the X web client in
# twillot-app/twillot, docs/req-res/folders.md: BookmarkFoldersSlice answers
# data.viewer.user_results.result.bookmark_collections_slice.items[] ({id,
# media, name}, slice_info {}), and BookmarkFolderTimeline answers
# data.bookmark_collection_timeline.timeline.instructions with the entries of
# Bookmarks (there with sortIndex "1" and a bottom cursor "-1716657745566").
# The folder ids and names are the ones of that capture.
TWILLOT_FOLDERS = (("1794418757911433313", "社会科学"), ("1794165526627033447", "邮件营销"),
                   ("1794004218426319192", "GitHub"))


def folder_list_answer(folders=TWILLOT_FOLDERS) -> dict:
    items = [{"id": folder_id, "media": {"id": "QXBpTWVkaWE6", "media_key": f"3_{folder_id}",
                                         "media_info": {"__typename": "ApiImage", "original_img_height": 480,
                                                        "original_img_width": 480}},
              "name": name} for folder_id, name in folders]
    return {"data": {"viewer": {"user_results": {"result": {
        "__typename": "User", "bookmark_collections_slice": {"items": items, "slice_info": {}}}}}}}


def folder_page(entries: list[dict], *, bottom_cursor: str | None = "-1716657745566") -> dict:
    """One BookmarkFolderTimeline answer. As in the public capture, the
    folder's entries carry small sortIndex values, not bookmark times."""
    numbered = [dict(entry, sortIndex=str(len(entries) - i)) for i, entry in enumerate(entries)]
    return bookmarks_page(numbered, bottom_cursor=bottom_cursor, folder=True)
