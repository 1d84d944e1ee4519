"""Reading X web-client GraphQL responses.

Pure functions: no I/O, no Dagster. The capture stage, the normalize stage
and `kb inspect` all read pages through this module, so they agree.

The Bookmarks operation wraps tweet entries in this envelope:
    data.bookmark_timeline_v2.timeline.instructions[] (type TimelineAddEntries)
      .entries[]  entryId "tweet-<id>" | "cursor-top-..." | "cursor-bottom-..."
        .sortIndex  string; orders by bookmark time (not post time)
        .content.itemContent.tweet_results.result   Tweet or TweetWithVisibilityResults{tweet}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The query ID in /i/api/graphql/<id>/<Operation> changes with each X deploy,
# so the capture matches the operation name only.
BOOKMARKS_OPERATION_SUFFIX = "Bookmarks"


class PageShapeError(ValueError):
    """A raw page that is not JSON, or not of the Bookmarks shape."""


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


def load_page(raw: bytes | str, *, name: str = "<page>") -> dict:
    """Parse raw bytes of a captured page; PageShapeError names the file."""
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PageShapeError(f"{name}: not JSON ({exc})") from exc
    if not isinstance(payload, dict):
        raise PageShapeError(f"{name}: top level is {type(payload).__name__}, not an object")
    return payload


def timeline_instructions(payload: dict, *, name: str = "<page>") -> list[dict]:
    """The instructions list of a Bookmarks page."""
    try:
        instructions = payload["data"]["bookmark_timeline_v2"]["timeline"]["instructions"]
    except (KeyError, TypeError) as exc:
        errors = payload.get("errors") if isinstance(payload, dict) else None
        detail = f"X returned errors: {errors!r:.200}" if errors else f"missing key {exc}"
        raise PageShapeError(f"{name}: not a Bookmarks page ({detail})") from exc
    if not isinstance(instructions, list):
        raise PageShapeError(f"{name}: timeline.instructions is not a list")
    return instructions


def timeline_entries(payload: dict, *, name: str = "<page>") -> list[dict]:
    """Every entry of every TimelineAddEntries instruction, in page order."""
    entries: list[dict] = []
    for instruction in timeline_instructions(payload, name=name):
        if not isinstance(instruction, dict):
            continue
        if instruction.get("type") == "TimelineAddEntries" or "entries" in instruction:
            for entry in instruction.get("entries") or []:
                if isinstance(entry, dict):
                    entries.append(entry)
    return entries


@dataclass
class PageSummary:
    """What the capture needs to know of a page: its bookmarks and cursor."""

    tweets: list[tuple[str, str]] = field(default_factory=list)  # (tweet_id, sort_index)
    bottom_cursor: str | None = None


def summarize_page(payload: dict, *, name: str = "<page>") -> PageSummary:
    summary = PageSummary()
    for entry in timeline_entries(payload, name=name):
        entry_id = str(entry.get("entryId", ""))
        content = entry.get("content") or {}
        if entry_id.startswith("tweet-"):
            summary.tweets.append((entry_id.removeprefix("tweet-"), str(entry.get("sortIndex", ""))))
        elif entry_id.startswith("cursor-bottom-") and isinstance(content, dict):
            summary.bottom_cursor = content.get("value")
    return summary


def unwrap_tweet(result: Any) -> dict | None:
    """The Tweet object inside a tweet_results.result, or None for a tombstone
    or an unavailable post. TweetWithVisibilityResults wraps it in `tweet`."""
    if not isinstance(result, dict):
        return None
    typename = result.get("__typename")
    if typename == "TweetWithVisibilityResults" or ("tweet" in result and "legacy" not in result):
        return unwrap_tweet(result.get("tweet"))
    if typename in ("TweetTombstone", "TweetUnavailable") or "legacy" not in result:
        return None
    return result
