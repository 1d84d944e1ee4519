"""The shape of a bookmark card (kb/index/cards.py): built from DuckDB,
packed into the `bookmarks` table of the index, and served by get_bookmark,
all from one definition. A card that the index cannot pack is refused with
its id and the reason, and the refused write changes nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.index.cards import (ARTICLE_FIELDS, LINK_FIELDS, MEDIA_FIELDS, QUOTED_FIELDS, SERVED_FIELDS, THREAD_FIELDS,
                            bookmark_cards, pack_card, served_card)
from kb.index.client import ChunkIndex
from tests.enrich_rows import NOW, bookmark, media, write

SYNCED = datetime(2026, 11, 2, tzinfo=timezone.utc)


def written_bookmark() -> None:
    post = dict(bookmark("1", "b1", quoted_tweet_id="9", quoted_author_handle="bob"),
                article_title="An article", article_url="https://x.com/i/article/5")
    write([post, bookmark("2", "b1", removed=True)],
          [media("1", "m1", 0, "photo", "https://pbs.twimg.com/a.jpg", "b1")])
    with DuckDBStore.from_settings().transaction() as conn:
        insert_rows(conn, "authors", [{"author_id": "u-alice", "handle": "alice", "name": "Alice", "batch": "b1"}])
        insert_rows(conn, "links", [{"tweet_id": "1", "url_norm": "https://example.org/", "position": 0,
                                     "expanded_url": "https://example.org/", "host": "example.org", "kind": "link",
                                     "from_quote": False, "card_title": "Example", "batch": "b1"}])
        insert_rows(conn, "thread_posts", [{"tweet_id": "1", "position": 0, "post_id": "3",
                                            "url": "https://x.com/alice/status/3", "created_at": NOW,
                                            "text": "and more", "batch": "b1", "raw_file": "b1/detail.json"}])


def test_a_card_built_from_duckdb_is_served_with_the_fields_of_the_definition(tmp_path):
    written_bookmark()
    with DuckDBStore.from_settings().connect() as conn:
        cards = bookmark_cards(conn, ["1", "2"], SYNCED)
    assert [c["tweet_id"] for c in cards] == ["1"]  # a removed bookmark has no card
    index = ChunkIndex.from_settings(path=str(tmp_path / "lance"))
    index.upsert_bookmark_cards(cards)
    card = index.bookmark("1")
    assert set(card["quoted"]) == set(QUOTED_FIELDS) and card["quoted"]["author"] == "bob"
    assert set(card["article"]) == set(ARTICLE_FIELDS) and card["article"]["title"] == "An article"
    assert [set(item) for item in card["links"]] == [set(LINK_FIELDS)]
    assert [set(item) for item in card["media"]] == [set(MEDIA_FIELDS)]
    assert [set(item) for item in card["thread"]] == [set(THREAD_FIELDS)]
    served = served_card(card)
    assert tuple(served) == SERVED_FIELDS
    assert served["author_name"] == "Alice" and served["links"][0]["title"] == "Example"
    assert index.last_sync() == SYNCED.isoformat()


@pytest.mark.parametrize("card, reason", [
    ({"url": "https://x.com/a/status/1"}, "bookmark card 1 has no tweet_id"),
    ({"tweet_id": "7", "payload": "{not json"}, "bookmark card 7: payload is not JSON"),
    ({"tweet_id": "8", "created_at": "yesterday"}, "created_at of bookmark 8"),
])
def test_a_card_that_the_index_cannot_hold_is_refused_and_changes_nothing(tmp_path, card, reason):
    index = ChunkIndex.from_settings(path=str(tmp_path / "lance"))
    index.upsert_bookmark_cards([{"tweet_id": "5", "text": "kept"}])
    with pytest.raises(ValueError, match=reason):
        index.upsert_bookmark_cards([{"tweet_id": "6", "text": "good"}, card])
    assert index.bookmark("6") is None and index.bookmark("5")["text"] == "kept"
    with pytest.raises(ValueError, match=reason):
        pack_card(card, 1)
