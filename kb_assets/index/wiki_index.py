"""Asset `wiki_index`: the wiki pages in the LanceDB serving index.

Each page under wiki/ (sources, entities, concepts, syntheses) is cut into
passages and written into the same `chunks` table as the bookmarks, as its
own source kind `wiki`, so the MCP server can search it (search_wiki) with
the same search function. Each page is one "document":
tweet_id = "wiki:<path>", ref = "<path>", author = "wiki", where <path> is
relative to the wiki folder (for example wiki/concepts/vector-search.md).

Every run makes the index hold exactly the pages that are on disk: changed
pages are written again (the embedding cache keeps unchanged passages from
being embedded again), and a page that was deleted leaves the index.
"""


import hashlib
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg

from kb.index.chunking import chunk_text
from kb.wiki_files import WIKI_AUTHOR, WIKI_ID_PREFIX, WIKI_SOURCE, WikiPage, read_page_file, wiki_page_files
from kb_assets.keys import WIKI_WRITERS
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, WikiResource


def passage_date(page: WikiPage, file: Path) -> datetime:
    """The date of a page's passages: the page's date (kb.wiki_files.read_page:
    `last_updated` of entity and concept pages, `ingested_at` of source
    pages, `created` of syntheses), else the time of the file's last change."""
    return page.date or datetime.fromtimestamp(file.stat().st_mtime, tz=timezone.utc)


def wiki_page_id(rel_path: str) -> str:
    return WIKI_ID_PREFIX + rel_path


def wiki_chunk_id(rel_path: str, position: int) -> str:
    return hashlib.sha1(f"{WIKI_SOURCE}\x1f{rel_path}\x1f{position}".encode()).hexdigest()[:24]


def page_rows(root: Path, file: Path) -> list[dict]:
    """The passages of one page, as rows for ChunkIndex.replace_chunks."""
    rel = file.relative_to(root).as_posix()
    # The one reader of a page, as the wiki checks, the web page and the MCP
    # server read it: one frontmatter, one date everywhere.
    page = read_page_file(root, file)
    body = "\n".join(page.body)
    created_at = passage_date(page, file)
    return [{
        "chunk_id": wiki_chunk_id(rel, position),
        "tweet_id": wiki_page_id(rel),
        "url": "",
        "author": WIKI_AUTHOR,
        "created_at": created_at,
        "source": WIKI_SOURCE,
        "ref": rel,
        "position": position,
        "text": passage,
        "lang": "",
    } for position, passage in enumerate(chunk_text(body))]


@dg.asset(
    deps=WIKI_WRITERS,
    # Two processes that compact and index one table at the same time make
    # commit conflicts: each write of the index takes its writer lock
    # (ChunkIndex.writing), only for the write. This asset never opens DuckDB.
    group_name="index",
    # Re-index after any wiki change, with no job to remember.
    automation_condition=dg.AutomationCondition.eager(),
    description="The wiki pages in the LanceDB search index, as source kind `wiki`. Deleted pages leave the index.",
)
def wiki_index(context: dg.AssetExecutionContext, wiki: WikiResource, embedder: EmbedderResource,
               lance: ChunkIndexResource) -> dg.MaterializeResult:
    wiki, embedder, lance = wiki.get_client(), embedder.get_client(), lance.get_client()
    root = wiki.root()
    files = wiki_page_files(root)
    rows = [row for file in files for row in page_rows(root, file)]
    on_disk = {wiki_page_id(f.relative_to(root).as_posix()) for f in files}
    indexed = lance.tweet_ids(source=WIKI_SOURCE)
    removed = sorted(indexed - on_disk)
    # One call for all pages: the pages that are gone are in the id list
    # with no rows, so the same commit deletes their passages.
    written = lance.replace_chunks(sorted(on_disk | indexed), rows, embedder)
    if rows or removed:
        lance.maintain()
    context.log.info(f"wiki_index: {len(files)} pages, {len(rows)} passages, {len(removed)} pages removed")
    return dg.MaterializeResult(metadata={
        "pages": len(files),
        "passages": len(rows),
        "removed_pages": dg.MetadataValue.json(removed),
        "embedded": written.get("embedded", 0),
        "wiki": str(root),
    })
