"""One Bookmarks page (or one folder page) -> rows of the tables bookmarks,
authors, media and links.

The capture, the normalize stage and `kb inspect` read pages through
parse_page, so they agree. The author's thread (kb/x/thread_rows.py) builds
its rows with the same RowBuilder.
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
from kb.x.graphql import (BOOKMARKS, POST_ID, X_ORIGIN, article_fields, as_id, as_int, as_str, dig, parse_user,
                          timeline_entries, unwrap_tweet)

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
class Post:
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
    quoted: "Post | None"


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


def video_variant_choice(variants: list[dict]) -> tuple[str | None, str | None]:
    """(smallest MP4, best MP4) by bitrate. The smallest is enough for a
    transcript and is the least to download; the best is for viewing. The
    HLS playlist (.m3u8) variant has no bitrate and is not an MP4."""
    mp4s = [v for v in variants if isinstance(v, dict) and v.get("content_type") == "video/mp4" and as_str(v.get("url"))]
    if not mp4s:
        return None, None
    by_bitrate = sorted(mp4s, key=lambda v: as_int(v.get("bitrate")) or 0)
    return by_bitrate[0]["url"], by_bitrate[-1]["url"]


def _url_entities(tweet: dict) -> list[dict]:
    """The url entities of a post: legacy entities, then the note_tweet entity
    set. A long post has its links only in the note_tweet entity set, because
    legacy.full_text is cut before them."""
    out: list[dict] = []
    seen: set[str] = set()
    sources = (
        dig(tweet, "legacy", "entities", "urls"),
        dig(tweet, "note_tweet", "note_tweet_results", "result", "entity_set", "urls"),
    )
    for urls in sources:
        for entity in urls if isinstance(urls, list) else []:
            if isinstance(entity, dict) and as_str(entity.get("url")) and entity["url"] not in seen:
                seen.add(entity["url"])
                out.append(entity)
    return out


def _media_entities(tweet: dict) -> list[dict]:
    legacy = tweet.get("legacy") or {}
    media = dig(legacy, "extended_entities", "media") or dig(legacy, "entities", "media")
    return [m for m in media if isinstance(m, dict)] if isinstance(media, list) else []


def _displayed_text(legacy: dict) -> str:
    """full_text cut to display_text_range. A reply's text starts with the
    @handles it answers, and X hides them by this range; they carry no words."""
    text = as_str(legacy.get("full_text")) or ""
    span = legacy.get("display_text_range")
    if isinstance(span, list) and len(span) == 2 and all(isinstance(i, int) for i in span):
        start = max(0, min(span[0], len(text)))
        return text[start:]
    return text


def _post_text(tweet: dict, tco_map: dict[str, str], media: list[dict]) -> tuple[str, bool]:
    note = dig(tweet, "note_tweet", "note_tweet_results", "result", "text")
    if isinstance(note, str) and note:
        text, is_long = note, True
    else:
        text, is_long = html.unescape(_displayed_text(tweet.get("legacy") or {})), False
    if tco_map:
        # One pass: replaced in turn, an expanded address that holds the
        # t.co address of a later entity multiplied the text at each step
        # (five entities of 2.8 kB made 76 MB; 7 December 2026).
        addresses = re.compile("|".join(re.escape(tco) for tco in sorted(tco_map, key=len, reverse=True)))
        text = addresses.sub(lambda match: tco_map[match.group(0)], text)
    for item in media:
        if item.get("url"):
            text = text.replace(item["url"], "")
    return text.strip(), is_long


def read_post(tweet: dict, *, with_quote: bool = True) -> Post:
    user = parse_user(dig(tweet, "core", "user_results", "result"))
    tco_map = {e["url"]: e["expanded_url"] for e in _url_entities(tweet) if as_str(e.get("expanded_url"))}
    media = _media_entities(tweet)
    text, is_long = _post_text(tweet, tco_map, media)
    tweet_id = as_id(tweet.get("rest_id")) or as_id(dig(tweet, "legacy", "id_str")) or ""
    handle = user["handle"] if user else "i"  # x.com/i/status/<id> opens any post
    quoted_id = as_id(dig(tweet, "legacy", "quoted_status_id_str"))
    quoted = None
    if with_quote:
        quoted_tweet = unwrap_tweet(dig(tweet, "quoted_status_result", "result"))
        if quoted_tweet is not None:
            quoted = read_post(quoted_tweet, with_quote=False)
            quoted_id = quoted.tweet_id or quoted_id
    return Post(
        tweet_id=tweet_id,
        author=user,
        created_at=parse_tweet_time(dig(tweet, "legacy", "created_at")),
        text=text,
        is_long=is_long,
        lang=as_str(dig(tweet, "legacy", "lang")),
        url=f"{X_ORIGIN}/{handle}/status/{tweet_id}",
        media=media,
        tco_map=tco_map,
        card=tweet.get("card") if isinstance(tweet.get("card"), dict) else None,
        article=dig(tweet, "article", "article_results", "result"),
        quoted_id=quoted_id or None,
        quoted=quoted,
    )


def _card_tco(card: dict) -> str | None:
    """The t.co address that a card points to, as X names it."""
    bindings = dig(card, "legacy", "binding_values") or []
    for binding in bindings:
        if isinstance(binding, dict) and binding.get("key") == "card_url":
            value = as_str(dig(binding, "value", "string_value"))
            if value:
                return value
    return as_str(dig(card, "legacy", "url")) or as_str(card.get("rest_id"))


def _card_text(card: dict, key: str) -> str | None:
    for binding in dig(card, "legacy", "binding_values") or []:
        if isinstance(binding, dict) and binding.get("key") == key:
            return as_str(dig(binding, "value", "string_value"))
    return None


class RowBuilder:
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

    def add_media(self, bookmark_id: str, post: Post, *, from_quote: bool, start: int) -> int:
        position = start
        for item in post.media:
            key = as_id(item.get("media_key")) or as_id(item.get("id_str"))
            kind = as_str(item.get("type"))
            url = as_str(item.get("media_url_https")) or as_str(item.get("media_url"))
            if not key or not kind or not url:
                self.page.problems.append(f"post {post.tweet_id}: media item without media_key, type or URL skipped")
                continue
            if (bookmark_id, key) in self._media_keys:
                continue
            self._media_keys.add((bookmark_id, key))
            variants = dig(item, "video_info", "variants")
            variants = [v for v in variants if isinstance(v, dict)] if isinstance(variants, list) else []
            smallest, best = video_variant_choice(variants)
            self.page.media.append({
                "tweet_id": bookmark_id,
                "media_key": key,
                "position": position,
                "kind": kind,
                "from_quote": from_quote,
                "url": url,
                "alt_text": as_str(item.get("ext_alt_text")),
                "duration_ms": as_int(dig(item, "video_info", "duration_millis")),
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

    def add_post_links(self, bookmark_id: str, post: Post, *, from_quote: bool, skip_status: str | None) -> None:
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
            fields = article_fields(post.article)
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


def _bookmark_row(bookmark_id: str, entry_tweet: dict, sort_index: str, builder: RowBuilder) -> None:
    page = builder.page
    retweeted = unwrap_tweet(dig(entry_tweet, "legacy", "retweeted_status_result", "result"))
    is_retweet = retweeted is not None
    if is_retweet:
        post = read_post(retweeted)
        outer = read_post(entry_tweet, with_quote=False)
    else:
        post = outer = read_post(entry_tweet)

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
    article_columns = article_fields(article) if article else dict.fromkeys(
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
        **article_columns,
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
    builder = RowBuilder(page, captured_at)
    for entry in timeline_entries(payload, name=raw_file, operation=operation):
        entry_id = str(entry.get("entryId", ""))
        if entry_id.startswith("cursor-"):
            continue
        if not entry_id.startswith("tweet-"):
            page.unknown_entries[entry_kind(entry_id)] += 1
            continue
        tweet_id = entry_id.removeprefix("tweet-")
        if not POST_ID.match(tweet_id):
            page.problems.append(f"entry {entry_id[:80]!r}: the post id is not a number; skipped")
            continue
        page.seen_tweet_ids.append(tweet_id)
        sort_index = as_id(entry.get("sortIndex"))
        if not sort_index:
            page.problems.append(f"entry {entry_id}: no sortIndex; skipped")
            continue
        result = dig(entry, "content", "itemContent", "tweet_results", "result")
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
