"""Reading X web-client GraphQL responses.

Pure functions: no I/O, no Dagster. The capture stage, the normalize stage
and `kb inspect` all read pages through this module, so they agree.

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

import html
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kb.urls import normalize_url, url_host

# The query ID in /i/api/graphql/<id>/<Operation> changes with each X deploy,
# so the capture matches the operation name only.
BOOKMARKS_OPERATION_SUFFIX = "Bookmarks"
BOOKMARKS = "Bookmarks"
FOLDER_LIST = "BookmarkFoldersSlice"
FOLDER_TIMELINE = "BookmarkFolderTimeline"
TWEET_DETAIL = "TweetDetail"
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
    if any(key.startswith("bookmark_collection") and isinstance(_dig(value, "timeline"), dict)
           for key, value in data.items()):
        return FOLDER_TIMELINE
    if _find_key(data, "bookmark_collections_slice") is not None:
        return FOLDER_LIST
    return None


# The folder list sits a few levels under `data` (viewer.user_results.result).
_MAX_SLICE_DEPTH = 6


def _find_key(node: Any, key: str, depth: int = _MAX_SLICE_DEPTH) -> Any:
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
        first = next((key for key, value in data.items() if isinstance(_dig(value, "timeline"), dict)), first)
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
        if entry_id.startswith("tweet-"):
            tweet_id = entry_id.removeprefix("tweet-")
            summary.tweets.append((tweet_id, str(entry.get("sortIndex", ""))))
            handle = _replied_post_author(_dig(content, "itemContent", "tweet_results", "result"))
            if handle:
                summary.with_replies.append((tweet_id, handle))
        elif entry_id.startswith("cursor-bottom-") and isinstance(content, dict):
            summary.bottom_cursor = content.get("value")
    return summary


def _replied_post_author(result: Any) -> str | None:
    """The author handle of a post that has replies, else None. A retweet
    shows another post: its thread is not the bookmark's."""
    tweet = unwrap_tweet(result)
    if tweet is None or _dig(tweet, "legacy", "retweeted_status_result") is not None:
        return None
    if (_int(_dig(tweet, "legacy", "reply_count")) or 0) < 1:
        return None
    user = parse_user(_dig(tweet, "core", "user_results", "result"))
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


# ---------------------------------------------------------------------------
# Normalization: one Bookmarks page -> rows of bookmarks, authors, media, links
# ---------------------------------------------------------------------------
#
# Decisions, with the reason for each:
# - Text. A long post keeps its full text in note_tweet; legacy.full_text is
#   cut at about 280 characters. legacy.full_text is HTML-escaped ("&amp;"),
#   note_tweet text is not (both seen in the captures), so only the first is
#   unescaped. t.co links in the text become their expanded address, and the
#   t.co link of attached media is removed: the media rows hold the media.
# - Retweets. X bookmarks the post that the owner saw, and a retweet shows
#   another post. The row keeps the entry's id (the id that the timeline, the
#   watermark and the --full comparison know), but its text, author, url,
#   media, links, quote and article come from the retweeted post. The retweet's own
#   text is "RT @x: ..." cut short, and its entities are often empty.
#   retweet_of_id and retweeted_by_handle record the retweet.
# - Cards. A card names its target only by a t.co address (the card_url
#   binding, else card.legacy.url, else card.rest_id). The target is the
#   expanded_url that the post's own url entities give for that t.co address.
#   When the entities do not hold it, the card is NOT stored: a t.co address
#   is not the target, and a target from the card's title or domain would be
#   a guess. Such a card is listed in ParsedPage.unresolved_cards.
# - Tombstones. A bookmarked post that X no longer shows (TweetTombstone, or
#   an empty tweet_results) gives no row, so that a row from an earlier
#   capture is not replaced by an empty one. Its id still counts as seen: the
#   owner did not remove the bookmark.
# - A post whose author cannot be read gives no row (every row has an
#   author); it is named in ParsedPage.problems and still counts as seen.
# - A link to the quoted post itself is not stored: the quote columns hold
#   that post. A link that the post and its quote share is stored once, as a
#   link of the post (from_quote false).

X_ORIGIN = "https://x.com"
_TWEET_TIME_FORMAT = "%a %b %d %H:%M:%S %z %Y"  # "Wed Jul 22 06:49:07 +0000 2026"
_LINK_KIND_RANK = {"link": 0, "card": 1, "article": 2}  # a more specific kind wins
_ARTICLE_PATH = re.compile(r"^/i/article/(\d+)$")


@dataclass
class ParsedPage:
    """The rows that one raw Bookmarks page gives."""

    raw_file: str
    batch: str
    bookmarks: list[dict] = field(default_factory=list)
    authors: list[dict] = field(default_factory=list)
    media: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    # Every tweet id of the page, with tombstones: the --full comparison uses it.
    seen_tweet_ids: list[str] = field(default_factory=list)
    unavailable_tweet_ids: list[str] = field(default_factory=list)
    unknown_entries: Counter = field(default_factory=Counter)
    unresolved_cards: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class _Post:
    """The parts of one Tweet object that the rows need."""

    tweet_id: str
    author: dict | None
    created_at: datetime | None
    text: str
    is_long: bool
    lang: str | None
    url: str
    media: list[dict]
    tco_map: dict[str, str]           # t.co address -> expanded address, in entity order
    card: dict | None
    article: dict | None
    quoted_id: str | None
    quoted: "_Post | None"


def entry_kind(entry_id: str) -> str:
    """The kind of a timeline entry: its entryId without the trailing ids.
    "who-to-follow-2085474396218064901" -> "who-to-follow"."""
    words = []
    for word in entry_id.split("-"):
        if any(ch.isdigit() for ch in word):
            break
        words.append(word)
    return "-".join(words) or "<no entryId>"


def parse_tweet_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, _TWEET_TIME_FORMAT)
    except ValueError:
        return None


# X gives each field one JSON type. A field of another type (a number where
# a string belongs) made a whole batch fail at the DuckDB insert, because
# Arrow cannot mix types in one column (found by tests/test_bad_input.py).
# So every value that goes into a row passes one of these: a value of the
# wrong type counts as absent.


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    """A whole number that fits a BIGINT column, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None


def _id(value: Any) -> str | None:
    """An id: X writes them as strings, some older fields as numbers."""
    if isinstance(value, str):
        return value or None
    number = _int(value)
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
    author_id = _id(user_result.get("rest_id"))
    handle = _str(core.get("screen_name")) or _str(legacy.get("screen_name"))
    if not author_id or not handle:
        return None
    return {
        "author_id": author_id,
        "handle": handle,
        "name": _str(core.get("name")) or _str(legacy.get("name")),
        "description": _str(legacy.get("description")) or _str(bio.get("description")),
    }


def video_variant_choice(variants: list[dict]) -> tuple[str | None, str | None]:
    """(smallest MP4, best MP4) by bitrate. The smallest is enough for a
    transcript and is the least to download; the best is for viewing. The
    HLS playlist (.m3u8) variant has no bitrate and is not an MP4."""
    mp4s = [v for v in variants if isinstance(v, dict) and v.get("content_type") == "video/mp4" and _str(v.get("url"))]
    if not mp4s:
        return None, None
    by_bitrate = sorted(mp4s, key=lambda v: _int(v.get("bitrate")) or 0)
    return by_bitrate[0]["url"], by_bitrate[-1]["url"]


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


def _dig(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _url_entities(tweet: dict) -> list[dict]:
    """The url entities of a post: legacy entities, then the note_tweet entity
    set. A long post has its links only in the note_tweet entity set, because
    legacy.full_text is cut before them."""
    out: list[dict] = []
    seen: set[str] = set()
    sources = (
        _dig(tweet, "legacy", "entities", "urls"),
        _dig(tweet, "note_tweet", "note_tweet_results", "result", "entity_set", "urls"),
    )
    for urls in sources:
        for entity in urls if isinstance(urls, list) else []:
            if isinstance(entity, dict) and _str(entity.get("url")) and entity["url"] not in seen:
                seen.add(entity["url"])
                out.append(entity)
    return out


def _media_entities(tweet: dict) -> list[dict]:
    legacy = tweet.get("legacy") or {}
    media = _dig(legacy, "extended_entities", "media") or _dig(legacy, "entities", "media")
    return [m for m in media if isinstance(m, dict)] if isinstance(media, list) else []


def _displayed_text(legacy: dict) -> str:
    """full_text cut to display_text_range. A reply's text starts with the
    @handles it answers, and X hides them by this range; they carry no words."""
    text = _str(legacy.get("full_text")) or ""
    span = legacy.get("display_text_range")
    if isinstance(span, list) and len(span) == 2 and all(isinstance(i, int) for i in span):
        start = max(0, min(span[0], len(text)))
        return text[start:]
    return text


def _post_text(tweet: dict, tco_map: dict[str, str], media: list[dict]) -> tuple[str, bool]:
    note = _dig(tweet, "note_tweet", "note_tweet_results", "result", "text")
    if isinstance(note, str) and note:
        text, is_long = note, True
    else:
        text, is_long = html.unescape(_displayed_text(tweet.get("legacy") or {})), False
    for tco, expanded in tco_map.items():
        text = text.replace(tco, expanded)
    for item in media:
        if item.get("url"):
            text = text.replace(item["url"], "")
    return text.strip(), is_long


def _read_post(tweet: dict, *, with_quote: bool = True) -> _Post:
    user = parse_user(_dig(tweet, "core", "user_results", "result"))
    tco_map = {e["url"]: e["expanded_url"] for e in _url_entities(tweet) if _str(e.get("expanded_url"))}
    media = _media_entities(tweet)
    text, is_long = _post_text(tweet, tco_map, media)
    tweet_id = _id(tweet.get("rest_id")) or _id(_dig(tweet, "legacy", "id_str")) or ""
    handle = user["handle"] if user else "i"  # x.com/i/status/<id> opens any post
    quoted_id = _id(_dig(tweet, "legacy", "quoted_status_id_str"))
    quoted = None
    if with_quote:
        quoted_tweet = unwrap_tweet(_dig(tweet, "quoted_status_result", "result"))
        if quoted_tweet is not None:
            quoted = _read_post(quoted_tweet, with_quote=False)
            quoted_id = quoted.tweet_id or quoted_id
    return _Post(
        tweet_id=tweet_id,
        author=user,
        created_at=parse_tweet_time(_dig(tweet, "legacy", "created_at")),
        text=text,
        is_long=is_long,
        lang=_str(_dig(tweet, "legacy", "lang")),
        url=f"{X_ORIGIN}/{handle}/status/{tweet_id}",
        media=media,
        tco_map=tco_map,
        card=tweet.get("card") if isinstance(tweet.get("card"), dict) else None,
        article=_dig(tweet, "article", "article_results", "result"),
        quoted_id=quoted_id or None,
        quoted=quoted,
    )


def _article_fields(article: dict) -> dict:
    article_id = _id(article.get("rest_id"))
    return {
        "article_id": article_id,
        "article_title": _str(article.get("title")),
        "article_text": article_plain_text(article.get("content_state")),
        "article_preview": _str(article.get("preview_text")),
        "article_url": f"{X_ORIGIN}/i/article/{article_id}" if article_id else None,
    }


def articles_in(payload: Any) -> list[dict]:
    """Every X Article in a GraphQL payload of any operation: the fields of
    each node that has a content_state (as _article_fields gives them). The
    article view of the X web client asks for the article by an operation
    whose name changes, so the search goes by shape, not by name."""
    found: list[dict] = []
    todo = [payload]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "content_state" in node and ("rest_id" in node or "title" in node):
                found.append(_article_fields(node))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


def _card_tco(card: dict) -> str | None:
    """The t.co address that a card points to, as X names it."""
    bindings = _dig(card, "legacy", "binding_values") or []
    for binding in bindings:
        if isinstance(binding, dict) and binding.get("key") == "card_url":
            value = _str(_dig(binding, "value", "string_value"))
            if value:
                return value
    return _str(_dig(card, "legacy", "url")) or _str(card.get("rest_id"))


def _card_text(card: dict, key: str) -> str | None:
    for binding in _dig(card, "legacy", "binding_values") or []:
        if isinstance(binding, dict) and binding.get("key") == key:
            return _str(_dig(binding, "value", "string_value"))
    return None


class _RowBuilder:
    """Collects the rows of one page; keeps the keys of each table unique."""

    def __init__(self, page: ParsedPage, captured_at: datetime):
        self.page = page
        self.captured_at = captured_at
        self._authors: dict[str, dict] = {}
        self._media_keys: set[tuple[str, str]] = set()
        self._links: dict[tuple[str, str], dict] = {}
        self._link_count: Counter = Counter()

    def add_author(self, author: dict | None) -> None:
        if author:
            self._authors[author["author_id"]] = {**author, "batch": self.page.batch}

    def add_media(self, bookmark_id: str, post: _Post, *, from_quote: bool, start: int) -> int:
        position = start
        for item in post.media:
            key = _id(item.get("media_key")) or _id(item.get("id_str"))
            kind = _str(item.get("type"))
            url = _str(item.get("media_url_https")) or _str(item.get("media_url"))
            if not key or not kind or not url:
                self.page.problems.append(f"post {post.tweet_id}: media item without media_key, type or URL skipped")
                continue
            if (bookmark_id, key) in self._media_keys:
                continue
            self._media_keys.add((bookmark_id, key))
            variants = _dig(item, "video_info", "variants")
            variants = [v for v in variants if isinstance(v, dict)] if isinstance(variants, list) else []
            smallest, best = video_variant_choice(variants)
            self.page.media.append({
                "tweet_id": bookmark_id,
                "media_key": key,
                "position": position,
                "kind": kind,
                "from_quote": from_quote,
                "url": url,
                "alt_text": _str(item.get("ext_alt_text")),
                "duration_ms": _int(_dig(item, "video_info", "duration_millis")),
                "variants": json.dumps(variants) if variants else None,
                "smallest_mp4": smallest,
                "best_mp4": best,
                "from_thread": False,
                "batch": self.page.batch,
            })
            position += 1
        return position

    def add_link(self, bookmark_id: str, *, expanded: str, tco: str | None, kind: str,
                 from_quote: bool, source_post: str, card: dict | None = None) -> None:
        try:
            key = normalize_url(expanded)
        except ValueError as exc:
            self.page.problems.append(f"post {source_post}: link {expanded!r} skipped ({exc})")
            return
        article = _ARTICLE_PATH.match(key.removeprefix(X_ORIGIN)) if key.startswith(X_ORIGIN + "/") else None
        if article:
            kind = "article"
        row = self._links.get((bookmark_id, key))
        if row is None:
            row = {
                "tweet_id": bookmark_id,
                "url_norm": key,
                "position": self._link_count[bookmark_id],
                "expanded_url": expanded,
                "tco_url": tco,
                "host": url_host(expanded),
                "kind": kind,
                "from_quote": from_quote,
                "card_title": None,
                "card_description": None,
                "from_thread": False,
                "batch": self.page.batch,
            }
            self._links[(bookmark_id, key)] = row
            self._link_count[bookmark_id] += 1
            self.page.links.append(row)
        elif _LINK_KIND_RANK[kind] > _LINK_KIND_RANK[row["kind"]]:
            row["kind"] = kind
        if card is not None:
            row["card_title"] = _card_text(card, "title") or _card_text(card, "broadcast_title")
            row["card_description"] = _card_text(card, "description")

    def add_post_links(self, bookmark_id: str, post: _Post, *, from_quote: bool, skip_status: str | None) -> None:
        skip = re.compile(rf"^{re.escape(X_ORIGIN)}/[^/]+/status/{re.escape(skip_status)}(/.*)?$") if skip_status else None
        for tco, expanded in post.tco_map.items():
            if skip and skip.match(_safe_normalize(expanded)):
                continue
            self.add_link(bookmark_id, expanded=expanded, tco=tco, kind="link",
                          from_quote=from_quote, source_post=post.tweet_id)
        if post.card is not None:
            tco = _card_tco(post.card)
            expanded = post.tco_map.get(tco) if tco else None
            if expanded:
                self.add_link(bookmark_id, expanded=expanded, tco=tco, kind="card",
                              from_quote=from_quote, source_post=post.tweet_id, card=post.card)
            else:
                self.page.unresolved_cards.append(
                    f"post {post.tweet_id}: card {tco or '<no address>'} is not in the post's url entities")
        if post.article is not None:
            fields = _article_fields(post.article)
            if fields["article_url"]:
                self.add_link(bookmark_id, expanded=fields["article_url"], tco=None, kind="article",
                              from_quote=from_quote, source_post=post.tweet_id)

    def checkpoint(self) -> tuple:
        """The state before one entry, for rollback()."""
        page = self.page
        return (len(page.bookmarks), len(page.media), len(page.links), dict(self._authors),
                set(self._media_keys), dict(self._links), Counter(self._link_count))

    def rollback(self, state: tuple) -> None:
        """Drop every row that one entry added. An entry that fails half way
        must give no row at all: a bookmark row without the media and links
        that its post holds looks complete, and nothing would fetch the rest."""
        n_bookmarks, n_media, n_links, authors, media_keys, links, link_count = state
        del self.page.bookmarks[n_bookmarks:]
        del self.page.media[n_media:]
        del self.page.links[n_links:]
        self._authors, self._media_keys, self._links, self._link_count = authors, media_keys, links, link_count

    def finish(self) -> None:
        self.page.authors = list(self._authors.values())


def _safe_normalize(url: str) -> str:
    try:
        return normalize_url(url)
    except ValueError:
        return url


def _bookmark_row(bookmark_id: str, entry_tweet: dict, sort_index: str, builder: _RowBuilder) -> None:
    page = builder.page
    retweeted = unwrap_tweet(_dig(entry_tweet, "legacy", "retweeted_status_result", "result"))
    is_retweet = retweeted is not None
    if is_retweet:
        post = _read_post(retweeted)
        outer = _read_post(entry_tweet, with_quote=False)
    else:
        post = outer = _read_post(entry_tweet)

    if post.author is None:
        # Every bookmark row has an author (an asset check holds it). The raw
        # page keeps the post, and its id still counts as seen.
        page.problems.append(f"entry tweet-{bookmark_id}: no readable author (user_results); skipped")
        return
    builder.add_author(post.author)
    if is_retweet:
        builder.add_author(outer.author)

    article, article_from_quote = post.article, False
    if article is None and post.quoted is not None and post.quoted.article is not None:
        article, article_from_quote = post.quoted.article, True
    article_fields = _article_fields(article) if article else dict.fromkeys(
        ("article_id", "article_title", "article_text", "article_preview", "article_url"))

    quoted = post.quoted
    page.bookmarks.append({
        "tweet_id": bookmark_id,
        "batch": page.batch,
        "sort_index": sort_index,
        "url": post.url,
        "author_id": post.author["author_id"],
        "author_handle": post.author["handle"],
        "created_at": post.created_at,
        "text": post.text,
        "lang": post.lang,
        "is_long": post.is_long,
        "quoted_tweet_id": post.quoted_id,
        "quoted_author_handle": quoted.author["handle"] if quoted and quoted.author else None,
        "quoted_author_name": quoted.author["name"] if quoted and quoted.author else None,
        "quoted_text": quoted.text if quoted else None,
        "quoted_created_at": quoted.created_at if quoted else None,
        **article_fields,
        "article_from_quote": article_from_quote if article else None,
        "retweet_of_id": post.tweet_id if is_retweet else None,
        "retweeted_by_handle": outer.author["handle"] if is_retweet and outer.author else None,
        "raw_file": page.raw_file,
        "captured_at": builder.captured_at,
        "removed_at": None,
    })

    next_position = builder.add_media(bookmark_id, post, from_quote=False, start=0)
    builder.add_post_links(bookmark_id, post, from_quote=False, skip_status=post.quoted_id)
    if quoted is not None:
        builder.add_author(quoted.author)
        builder.add_media(bookmark_id, quoted, from_quote=True, start=next_position)
        builder.add_post_links(bookmark_id, quoted, from_quote=True, skip_status=None)


def parse_page(payload: dict, *, raw_file: str, batch: str, captured_at: datetime,
               operation: str = BOOKMARKS) -> ParsedPage:
    """The rows of one Bookmarks page (or one BookmarkFolderTimeline page:
    its entries have the same shape).

    A page that is not of the shape raises PageShapeError naming raw_file.
    Inside a good page, a bad entry never stops the page: an unknown entry
    kind is counted in unknown_entries, a tweet entry that cannot be read is
    named in problems."""
    page = ParsedPage(raw_file=raw_file, batch=batch)
    builder = _RowBuilder(page, captured_at)
    for entry in timeline_entries(payload, name=raw_file, operation=operation):
        entry_id = str(entry.get("entryId", ""))
        if entry_id.startswith("cursor-"):
            continue
        if not entry_id.startswith("tweet-"):
            page.unknown_entries[entry_kind(entry_id)] += 1
            continue
        tweet_id = entry_id.removeprefix("tweet-")
        page.seen_tweet_ids.append(tweet_id)
        sort_index = _id(entry.get("sortIndex"))
        if not sort_index:
            page.problems.append(f"entry {entry_id}: no sortIndex; skipped")
            continue
        result = _dig(entry, "content", "itemContent", "tweet_results", "result")
        tweet = unwrap_tweet(result)
        if tweet is None:
            page.unavailable_tweet_ids.append(tweet_id)
            continue
        state = builder.checkpoint()
        try:
            _bookmark_row(tweet_id, tweet, str(sort_index), builder)
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            # One odd tweet must not cost the rest of the page. The raw page
            # keeps the post, and its id still counts as seen.
            builder.rollback(state)
            page.problems.append(f"entry {entry_id}: cannot read the post ({type(exc).__name__}: {str(exc)[:200]}); skipped")
    builder.finish()
    return page


# ---------------------------------------------------------------------------
# Bookmark folders: BookmarkFoldersSlice -> {folder_id, name}
# ---------------------------------------------------------------------------

# A folder id goes into a file name and into an X address: only letters and
# digits pass (X's ids are digits). Anything else is hostile or unknown.
FOLDER_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")
MAX_FOLDER_NAME = 200


def parse_folder_list(payload: dict, *, name: str = "<answer>") -> tuple[list[dict], list[str]]:
    """([{folder_id, name}], problems) of a BookmarkFoldersSlice answer.
    PageShapeError when it holds no folder list."""
    data = payload.get("data") if isinstance(payload, dict) else None
    found = _find_key(data, "bookmark_collections_slice") if isinstance(data, dict) else None
    items = found.get("items") if isinstance(found, dict) else None
    if not isinstance(items, list):
        errors = payload.get("errors") if isinstance(payload, dict) else None
        detail = f"X returned errors: {errors!r:.200}" if errors else "no bookmark_collections_slice.items list"
        raise PageShapeError(f"{name}: not a BookmarkFoldersSlice answer ({detail})")
    folders: list[dict] = []
    problems: list[str] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        folder_id = _id(item.get("id")) if isinstance(item, dict) else None
        if not folder_id or not FOLDER_ID.match(folder_id):
            problems.append(f"folder {position + 1}: id {folder_id!r:.80} is not letters and digits; skipped")
            continue
        if folder_id in seen:
            continue
        seen.add(folder_id)
        label = _str(item.get("name"))
        folders.append({"folder_id": folder_id, "name": label.strip()[:MAX_FOLDER_NAME] if label else None})
    return folders, problems


# ---------------------------------------------------------------------------
# The author's thread: TweetDetail -> the author's own chain under a post
# ---------------------------------------------------------------------------

# Media and link positions of the thread start here, after the post's own.
THREAD_POSITION = 1000


@dataclass
class ParsedThread:
    """The author's own chain under one bookmarked post, as rows."""

    raw_file: str
    batch: str
    tweet_id: str  # the bookmark
    posts: list[dict] = field(default_factory=list)  # thread_posts rows, in chain order
    authors: list[dict] = field(default_factory=list)
    media: list[dict] = field(default_factory=list)  # from_thread = True
    links: list[dict] = field(default_factory=list)  # from_thread = True
    problems: list[str] = field(default_factory=list)


def tweet_detail_posts(payload: dict, *, name: str = "<answer>") -> list[dict]:
    """Every post of a TweetDetail answer (the Tweet objects), in page order:
    the top-level entries and the items of each conversation module."""
    posts: list[dict] = []
    for entry in timeline_entries(payload, name=name, operation=TWEET_DETAIL):
        content = entry.get("content")
        if not isinstance(content, dict):
            continue
        results = [_dig(content, "itemContent", "tweet_results", "result")]
        items = content.get("items")
        results += [_dig(item, "item", "itemContent", "tweet_results", "result")
                    for item in (items if isinstance(items, list) else [])]
        posts += [tweet for tweet in map(unwrap_tweet, results) if tweet is not None]
    return posts


def focal_post_id(payload: dict, *, name: str = "<answer>") -> str | None:
    """The post that a TweetDetail answer is about, when no request names it:
    the last top-level tweet entry. The posts that it answers come before it,
    the replies after it, in conversation modules."""
    focal = None
    for entry in timeline_entries(payload, name=name, operation=TWEET_DETAIL):
        entry_id = str(entry.get("entryId", ""))
        if entry_id.startswith("tweet-") and FOLDER_ID.match(entry_id.removeprefix("tweet-")):
            focal = entry_id.removeprefix("tweet-")
    return focal


def _post_id(tweet: dict) -> str | None:
    return _id(tweet.get("rest_id")) or _id(_dig(tweet, "legacy", "id_str"))


def _author_id(tweet: dict) -> str | None:
    user = parse_user(_dig(tweet, "core", "user_results", "result"))
    return user["author_id"] if user else _id(_dig(tweet, "legacy", "user_id_str"))


def author_thread(payload: dict, *, head_id: str, max_posts: int, name: str = "<answer>") -> list[dict]:
    """The Tweet objects of the author's own chain under the post `head_id`,
    in order: each one is a reply of the same author to the one before, up
    to `max_posts`. Replies of other people, and the author's answers to
    them, are not in the chain. PageShapeError when the post is not in the answer."""
    posts = tweet_detail_posts(payload, name=name)
    head = next((tweet for tweet in posts if _post_id(tweet) == head_id), None)
    if head is None:
        raise PageShapeError(f"{name}: post {head_id} is not in this TweetDetail answer")
    author = _author_id(head)
    chain: list[dict] = []
    used, current = {head_id}, head_id
    while author and len(chain) < max_posts:
        reply = next((tweet for tweet in posts if _post_id(tweet) not in used and _author_id(tweet) == author
                      and _id(_dig(tweet, "legacy", "in_reply_to_status_id_str")) == current), None)
        if reply is None:
            break
        chain.append(reply)
        current = _post_id(reply)
        used.add(current)
    return chain


def parse_thread(payload: dict, *, tweet_id: str, raw_file: str, batch: str, captured_at: datetime,
                 max_posts: int) -> ParsedThread:
    """The rows of the author's own chain under the bookmark `tweet_id`:
    thread_posts rows, and media and link rows of the bookmark (from_thread
    true), so that the enrichment stages fetch and read them."""
    thread = ParsedThread(raw_file=raw_file, batch=batch, tweet_id=tweet_id)
    page = ParsedPage(raw_file=raw_file, batch=batch)
    builder = _RowBuilder(page, captured_at)
    next_media = THREAD_POSITION
    for tweet in author_thread(payload, head_id=tweet_id, max_posts=max_posts, name=raw_file):
        state = builder.checkpoint()
        try:
            post = _read_post(tweet, with_quote=False)
            builder.add_author(post.author)
            next_media = builder.add_media(tweet_id, post, from_quote=False, start=next_media)
            builder.add_post_links(tweet_id, post, from_quote=False, skip_status=None)
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            builder.rollback(state)
            thread.problems.append(f"reply {_post_id(tweet)}: cannot read the post ({type(exc).__name__}); "
                                   "the thread stops before it")
            break
        thread.posts.append({
            "tweet_id": tweet_id,
            "position": len(thread.posts),
            "post_id": post.tweet_id,
            "url": post.url,
            "created_at": post.created_at,
            "text": post.text,
            "lang": post.lang,
            "batch": batch,
            "raw_file": raw_file,
        })
    builder.finish()
    for row in page.media:
        row["from_thread"] = True
    for row in page.links:
        row["from_thread"] = True
        row["position"] += THREAD_POSITION
    thread.authors, thread.media, thread.links = page.authors, page.media, page.links
    thread.problems += page.problems
    return thread
