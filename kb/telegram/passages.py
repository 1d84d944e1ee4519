"""An approved Telegram source as passages of the search index.

The intake run indexes each approved source right after the gate, before
and independent of the wiki ingest: the owner can find a source within a
minute, also when the wiki agent has no endpoint. The wiki page about the
source comes later, as source kind `wiki`; both stay in the index, and the
source kind of a hit says which is which.

How a source appears in the index:
- source kind `telegram`, document id `telegram:<item id>`, author `telegram`;
- url: the source's URL (empty for a file or a text);
- ref: the parsed file, relative to the wiki folder
  (raw/parsed/<type>/<slug>.md): the citation back to what was indexed;
- the first passage starts with the title, so a search for the title finds it;
- one card (the `bookmarks` table) with the title, type, file name and
  parsed file, for get_bookmark and the web page.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from kb.index.chunking import chunk_text

TELEGRAM_SOURCE = "telegram"
TELEGRAM_ID_PREFIX = "telegram:"
TELEGRAM_AUTHOR = "telegram"


def source_document_id(item_id: str) -> str:
    return TELEGRAM_ID_PREFIX + item_id


def source_chunk_id(item_id: str, position: int) -> str:
    return hashlib.sha1(f"{TELEGRAM_SOURCE}\x1f{item_id}\x1f{position}".encode()).hexdigest()[:24]


def source_text(title: str, body: str) -> str:
    """The text to index: the title as the first line, unless the body
    starts with it already (a Markdown file with its own heading)."""
    body = body.strip()
    title = (title or "").strip()
    if not title or body.lstrip("# ").startswith(title.rstrip("…")):
        return body
    return f"{title}\n\n{body}"


def source_rows(*, item_id: str, title: str, url: str | None, parsed_path: str, body: str,
                received_at: datetime | str) -> list[dict]:
    """The passages of one source, as rows for ChunkIndex.replace_chunks."""
    document_id = source_document_id(item_id)
    return [{
        "chunk_id": source_chunk_id(item_id, position),
        "tweet_id": document_id,
        "url": url or "",
        "author": TELEGRAM_AUTHOR,
        "created_at": received_at,
        "source": TELEGRAM_SOURCE,
        "ref": parsed_path,
        "position": position,
        "text": passage,
        "lang": "",
    } for position, passage in enumerate(chunk_text(source_text(title, body)))]


def source_card(*, item_id: str, title: str, url: str | None, source_type: str, file_name: str | None,
                parsed_path: str, received_at: datetime | str) -> dict:
    """The card of one source, for ChunkIndex.upsert_bookmark_cards. It has
    no last_sync: the last sync is the last X capture."""
    return {
        "tweet_id": source_document_id(item_id),
        "url": url or "",
        "author": TELEGRAM_AUTHOR,
        "author_name": title or file_name or url or item_id,
        "created_at": received_at,
        "text": title or "",
        "lang": "",
        "last_sync": None,
        "payload": {"source_kind": TELEGRAM_SOURCE, "item_id": item_id, "title": title or "",
                    "type": source_type, "file_name": file_name or "", "parsed_path": parsed_path},
    }
