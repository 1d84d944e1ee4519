"""The author's thread: a TweetDetail answer -> the author's own chain of
replies under a bookmarked post, as rows (thread_posts, and media and links
with from_thread)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from kb.x.graphql import POST_ID, TWEET_DETAIL, PageShapeError, as_id, dig, parse_user, timeline_entries, unwrap_tweet
from kb.x.post_rows import ParsedPage, RowBuilder, read_post

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
        results = [dig(content, "itemContent", "tweet_results", "result")]
        items = content.get("items")
        results += [dig(item, "item", "itemContent", "tweet_results", "result")
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
        if entry_id.startswith("tweet-") and POST_ID.match(entry_id.removeprefix("tweet-")):
            focal = entry_id.removeprefix("tweet-")
    return focal


def _post_id(tweet: dict) -> str | None:
    return as_id(tweet.get("rest_id")) or as_id(dig(tweet, "legacy", "id_str"))


def _author_id(tweet: dict) -> str | None:
    user = parse_user(dig(tweet, "core", "user_results", "result"))
    return user["author_id"] if user else as_id(dig(tweet, "legacy", "user_id_str"))


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
                      and as_id(dig(tweet, "legacy", "in_reply_to_status_id_str")) == current), None)
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
    builder = RowBuilder(page, captured_at)
    next_media = THREAD_POSITION
    for tweet in author_thread(payload, head_id=tweet_id, max_posts=max_posts, name=raw_file):
        state = builder.checkpoint()
        try:
            post = read_post(tweet, with_quote=False)
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
