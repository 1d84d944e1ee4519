"""The envelope of X web-client GraphQL answers: operation names, loading,
timeline entries, the capture's page summary, and the typed value readers
that every row builder shares (posts, users, X Articles).

Pure functions: no I/O, no Dagster. The rows come from the modules beside
this one: post_rows.py (Bookmarks and folder pages), folder_list.py
(BookmarkFoldersSlice) and thread_rows.py (TweetDetail). The capture stage,
the normalize stage and `kb inspect` all read pages through them, so they agree.

The Bookmarks operation wraps tweet entries in this envelope:
    data.bookmark_timeline_v2.timeline.instructions[] (type TimelineAddEntries)
      .entries[]  entryId "tweet-<id>" | "cursor-top-..." | "cursor-bottom-..."
        .sortIndex  string; orders by bookmark time (not post time)
        .content.itemContent.tweet_results.result   Tweet or TweetWithVisibilityResults{tweet}

Three more operations of the web client hold what the owner sorted and wrote:
- BookmarkFoldersSlice: the folders of a Premium account,
      data.viewer.user_results.result.bookmark_collections_slice.items[] {id, name}
- BookmarkFolderTimeline (variables.bookmark_collection_id): one folder's posts,
      data.bookmark_collection_timeline.timeline.instructions, the same entries as Bookmarks.
      The answer does not name its folder: the capture keeps the id in the file name.
- TweetDetail (variables.focalTweetId): a post and its replies,
      data.threaded_conversation_with_injections_v2.instructions; replies come in
      TimelineTimelineModule entries (content.items[].item.itemContent).
Where a real capture differs from these documented shapes, the capture wins:
the readers below look for the parts by their names, not by a fixed path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# The query ID in /i/api/graphql/<id>/<Operation> changes with each X deploy,
# so the capture matches the operation name only.
BOOKMARKS_OPERATION_SUFFIX = "Bookmarks"
BOOKMARKS = "Bookmarks"
FOLDER_LIST = "BookmarkFoldersSlice"
FOLDER_TIMELINE = "BookmarkFolderTimeline"
TWEET_DETAIL = "TweetDetail"
# A post id: a number. It goes into an X address, a file name
# (thread-<id>.json) and the index, where a bookmark's id shares one space
# with the wiki's ("wiki:<path>"). An entry "tweet-" (no id) stopped the
# index of its batch; "tweet-wiki:index.md" took the passages of the
# owner's wiki page (the red team, 7 December 2026).
POST_ID = re.compile(r"^[0-9]{1,30}$")
# Where each timeline keeps its instructions, as documented. A folder
# timeline under another key of `data` is still read (see _instructions).
_INSTRUCTION_PATHS = {
    BOOKMARKS: ("bookmark_timeline_v2", "timeline", "instructions"),
    FOLDER_TIMELINE: ("bookmark_collection_timeline", "timeline", "instructions"),
    TWEET_DETAIL: ("threaded_conversation_with_injections_v2", "instructions"),
}
# How the first words of an error name each kind of answer.
_ANSWER_NAMES = {BOOKMARKS: "Bookmarks page", FOLDER_TIMELINE: "BookmarkFolderTimeline answer",
                 TWEET_DETAIL: "TweetDetail answer", FOLDER_LIST: "BookmarkFoldersSlice answer"}


class PageShapeError(ValueError):
    """A raw page that is not JSON, or not of the shape of its operation."""


def operation_name(url: str) -> str | None:
    """`Bookmarks` for .../i/api/graphql/<id>/Bookmarks?..., else None."""
    path = url.split("?", 1)[0]
    parts = path.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-3] == "graphql":
        return parts[-1]
    return None


def is_bookmarks_response(url: str) -> bool:
    name = operation_name(url)
    return bool(name) and name.endswith(BOOKMARKS_OPERATION_SUFFIX)


def answer_kind(payload: Any) -> str | None:
    """The operation whose answer `payload` is, by its shape: BOOKMARKS,
    FOLDER_LIST, FOLDER_TIMELINE or TWEET_DETAIL; None for another shape.
    `kb import` takes files in any order and sorts them by this."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, dict):
        return None
    if "bookmark_timeline_v2" in data:
        return BOOKMARKS
    if any(key.startswith("threaded_conversation") for key in data):
        return TWEET_DETAIL
    if any(key.startswith("bookmark_collection") and isinstance(dig(value, "timeline"), dict)
           for key, value in data.items()):
        return FOLDER_TIMELINE
    if find_key(data, "bookmark_collections_slice") is not None:
        return FOLDER_LIST
    return None


# The folder list sits a few levels under `data` (viewer.user_results.result).
MAX_SLICE_DEPTH = 6


def find_key(node: Any, key: str, depth: int = MAX_SLICE_DEPTH) -> Any:
    """The value of the first `key` in dicts at most `depth` levels down, breadth first."""
    level = [node]
    for _ in range(depth + 1):
        found = [n[key] for n in level if isinstance(n, dict) and key in n]
        if found:
            return found[0]
        level = [v for n in level if isinstance(n, dict) for v in n.values() if isinstance(v, dict)]
        if not level:
            return None
    return None


def load_page(raw: bytes | str, *, name: str = "<page>") -> dict:
    """Parse raw bytes of a captured page; PageShapeError names the file."""
    try:
        payload = json.loads(raw)
    except RecursionError:
        # json.loads recurses once per nesting level. A page nested deeper
        # than the recursion limit is no X page; say so, do not crash the batch.
        raise PageShapeError(f"{name}: not a Bookmarks page (JSON nested too deep to read)") from None
    except ValueError as exc:
        # ValueError, not only JSONDecodeError: bytes that are not UTF-8/16/32
        # raise UnicodeDecodeError, and an integer of more than 4300 digits
        # raises a plain ValueError (Python's int conversion limit).
        raise PageShapeError(f"{name}: not JSON ({str(exc)[:200]})") from exc
    if not isinstance(payload, dict):
        raise PageShapeError(f"{name}: top level is {type(payload).__name__}, not an object")
    return payload


def timeline_instructions(payload: dict, *, name: str = "<page>", operation: str = BOOKMARKS) -> list[dict]:
    """The instructions list of a timeline answer of `operation`."""
    try:
        instructions = _instructions(payload, operation)
    except (KeyError, TypeError) as exc:
        errors = payload.get("errors") if isinstance(payload, dict) else None
        detail = f"X returned errors: {errors!r:.200}" if errors else f"missing key {exc}"
        raise PageShapeError(f"{name}: not a {_ANSWER_NAMES[operation]} ({detail})") from exc
    if not isinstance(instructions, list):
        raise PageShapeError(f"{name}: timeline.instructions is not a list")
    return instructions


def _instructions(payload: dict, operation: str) -> Any:
    """The documented path; for a folder timeline also `data.<any key>.timeline`.
    Why: the folder operations are newer and less stable than Bookmarks, and
    the capture wins over the documented shape."""
    first, *rest = _INSTRUCTION_PATHS[operation]
    data = payload["data"]
    if operation == FOLDER_TIMELINE and first not in data and isinstance(data, dict):
        first = next((key for key, value in data.items() if isinstance(dig(value, "timeline"), dict)), first)
    if operation == TWEET_DETAIL and first not in data and isinstance(data, dict):
        first = next((key for key in data if key.startswith("threaded_conversation")), first)
    node = data[first]
    for key in rest:
        node = node[key]
    return node


def timeline_entries(payload: dict, *, name: str = "<page>", operation: str = BOOKMARKS) -> list[dict]:
    """Every entry of every TimelineAddEntries instruction, in page order."""
    entries: list[dict] = []
    for instruction in timeline_instructions(payload, name=name, operation=operation):
        if not isinstance(instruction, dict):
            continue
        if instruction.get("type") == "TimelineAddEntries" or "entries" in instruction:
            found = instruction.get("entries")
            # Only a list holds entries. A number or true here made the loop
            # raise TypeError, which stopped the whole batch (found by the
            # generated pages of tests/test_bad_input.py).
            for entry in found if isinstance(found, list) else []:
                if isinstance(entry, dict):
                    entries.append(entry)
    return entries


@dataclass
class PageSummary:
    """What the capture needs to know of a page: its bookmarks and cursor."""

    tweets: list[tuple[str, str]] = field(default_factory=list)  # (tweet_id, sort_index)
    bottom_cursor: str | None = None
    # (tweet_id, author handle) of each post that has replies: its author may
    # have gone on in a thread below it (the capture reads its TweetDetail).
    with_replies: list[tuple[str, str]] = field(default_factory=list)


def summarize_page(payload: dict, *, name: str = "<page>", operation: str = BOOKMARKS) -> PageSummary:
    summary = PageSummary()
    for entry in timeline_entries(payload, name=name, operation=operation):
        entry_id = str(entry.get("entryId", ""))
        content = entry.get("content") or {}
        if entry_id.startswith("tweet-") and POST_ID.match(entry_id.removeprefix("tweet-")):
            tweet_id = entry_id.removeprefix("tweet-")
            summary.tweets.append((tweet_id, str(entry.get("sortIndex", ""))))
            handle = _replied_post_author(dig(content, "itemContent", "tweet_results", "result"))
            if handle:
                summary.with_replies.append((tweet_id, handle))
        elif entry_id.startswith("cursor-bottom-") and isinstance(content, dict):
            summary.bottom_cursor = content.get("value")
    return summary


def _replied_post_author(result: Any) -> str | None:
    """The author handle of a post that has replies, else None. A retweet
    shows another post: its thread is not the bookmark's."""
    tweet = unwrap_tweet(result)
    if tweet is None or dig(tweet, "legacy", "retweeted_status_result") is not None:
        return None
    if (as_int(dig(tweet, "legacy", "reply_count")) or 0) < 1:
        return None
    user = parse_user(dig(tweet, "core", "user_results", "result"))
    return user["handle"] if user else None


# X wraps a post in TweetWithVisibilityResults once. More levels than this
# are not an X page; the post counts as unavailable.
MAX_TWEET_WRAPPERS = 8


def unwrap_tweet(result: Any) -> dict | None:
    """The Tweet object inside a tweet_results.result, or None for a tombstone
    or an unavailable post. TweetWithVisibilityResults wraps it in `tweet`."""
    # A loop with a limit, not recursion: a generated page with hundreds of
    # wrappers hit the recursion limit and stopped the whole batch.
    for _ in range(MAX_TWEET_WRAPPERS + 1):
        if not isinstance(result, dict):
            return None
        typename = result.get("__typename")
        if typename == "TweetWithVisibilityResults" or ("tweet" in result and "legacy" not in result):
            result = result.get("tweet")
            continue
        if typename in ("TweetTombstone", "TweetUnavailable") or "legacy" not in result:
            return None
        return result
    return None


# X gives each field one JSON type. A field of another type (a number where
# a string belongs) made a whole batch fail at the DuckDB insert, because
# Arrow cannot mix types in one column (found by tests/test_bad_input.py).
# So every value that goes into a row passes one of these: a value of the
# wrong type counts as absent.


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    """A whole number that fits a BIGINT column, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None


def as_id(value: Any) -> str | None:
    """An id: X writes them as strings, some older fields as numbers."""
    if isinstance(value, str):
        return value or None
    number = as_int(value)
    return str(number) if number is not None else None


def parse_user(user_result: Any) -> dict | None:
    """{author_id, handle, name, description} of a User object.

    The new format keeps name and screen_name in `core` and the bio in
    `profile_bio`; the old format keeps all three in `legacy`. The captures
    hold both formats."""
    if not isinstance(user_result, dict) or user_result.get("__typename") not in (None, "User"):
        return None
    core = user_result.get("core") if isinstance(user_result.get("core"), dict) else {}
    legacy = user_result.get("legacy") if isinstance(user_result.get("legacy"), dict) else {}
    bio = user_result.get("profile_bio") if isinstance(user_result.get("profile_bio"), dict) else {}
    author_id = as_id(user_result.get("rest_id"))
    handle = as_str(core.get("screen_name")) or as_str(legacy.get("screen_name"))
    if not author_id or not handle:
        return None
    return {
        "author_id": author_id,
        "handle": handle,
        "name": as_str(core.get("name")) or as_str(legacy.get("name")),
        "description": as_str(legacy.get("description")) or as_str(bio.get("description")),
    }


def dig(node: Any, *keys: str) -> Any:
    """The value under `keys`, or None where a level is not a dict."""
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


X_ORIGIN = "https://x.com"  # the origin of post, profile and article addresses


def article_plain_text(content_state: Any) -> str | None:
    """Plain text of an X Article's content_state (Draft.js blocks). One
    line per block; blocks without text (media, dividers) are left out."""
    if isinstance(content_state, str):
        try:
            content_state = json.loads(content_state)
        except json.JSONDecodeError:
            return None
    if not isinstance(content_state, dict):
        return None
    blocks = content_state.get("blocks")
    if not isinstance(blocks, list):
        return None
    lines = [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"].strip()]
    return "\n".join(lines) if lines else None


def article_fields(article: dict) -> dict:
    article_id = as_id(article.get("rest_id"))
    return {
        "article_id": article_id,
        "article_title": as_str(article.get("title")),
        "article_text": article_plain_text(article.get("content_state")),
        "article_preview": as_str(article.get("preview_text")),
        "article_url": f"{X_ORIGIN}/i/article/{article_id}" if article_id else None,
    }


def articles_in(payload: Any) -> list[dict]:
    """Every X Article in a GraphQL payload of any operation: the fields of
    each node that has a content_state (as article_fields gives them). The
    article view of the X web client asks for the article by an operation
    whose name changes, so the search goes by shape, not by name."""
    found: list[dict] = []
    todo = [payload]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "content_state" in node and ("rest_id" in node or "title" in node):
                found.append(article_fields(node))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found
