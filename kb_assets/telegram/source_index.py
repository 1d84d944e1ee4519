"""Asset `source_passages`: each approved Telegram source in the LanceDB index.

It runs in the intake run right after the gate, next to the wiki ingest
and independent of it: a source is searchable within a minute, also when
the wiki agent has no endpoint or fails. See kb/telegram/passages.py for
how a source appears in the index.

A rejected or duplicate source is not in the index: the asset removes its
passages (a source that was accepted before and is rejected now leaves).
/override runs the intake again with the override tag; the gate then
accepts the source, and this asset indexes it.
"""


import dagster as dg

from kb.telegram.passages import source_card, source_document_id, source_rows
from kb.telegram.source_parsers import split_frontmatter
from kb.telegram.source_table import read_index_row
from kb_assets.keys import GATED_SOURCES
from kb_assets.partitions import sources
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource, InboxResource, WikiResource


@dg.asset(
    partitions_def=sources,
    deps=[GATED_SOURCES],
    # No pool: the LanceDB writes take the index's writer lock, the DuckDB
    # read the file's (kb/store/writer_lock.py). An X stage never holds this up.
    group_name="telegram",
    kinds={"lancedb"},
    description="An approved Telegram source in the LanceDB search index (source kind `telegram`), "
                "before and independent of the wiki ingest. Rejected and duplicate sources leave the index.",
)
def source_passages(context: dg.AssetExecutionContext, duckdb: DuckDBResource, embedder: EmbedderResource,
                    lance: ChunkIndexResource, inbox: InboxResource, wiki: WikiResource) -> dg.MaterializeResult:
    duckdb, embedder, lance, inbox = duckdb.get_client(), embedder.get_client(), lance.get_client(), inbox.get_client()
    item_id = context.partition_key
    status, title, url, source_type, parsed_path, received_at = read_index_row(duckdb, item_id)
    document_id = source_document_id(item_id)
    # No DuckDB connection is open from here on: embedding is slow.
    if status != "accepted":
        # Rejected, a duplicate, or not gated (a failed parse; `kb index
        # --rebuild` asks for every source): not in the index.
        removed = lance.remove_bookmarks([document_id])
        context.log.info(f"source {item_id}: {status}, so it is not in the index ({removed} passages removed)")
        return dg.MaterializeResult(metadata={"item_id": item_id, "status": status, "passages": 0,
                                              "removed_passages": removed})
    parsed = wiki.get_client().root() / parsed_path
    if not parsed.is_file():
        raise dg.Failure(f"source {item_id}: the parsed file {parsed} is missing; "
                         "materialize parsed_sources for this partition again", allow_retries=False)
    _, body = split_frontmatter(parsed.read_text(encoding="utf-8"))
    item = inbox.find(item_id)
    file_name = item.file_name if item else None
    rows = source_rows(item_id=item_id, title=title or file_name or "", url=url, parsed_path=parsed_path,
                       body=body, received_at=received_at)
    written = lance.replace_chunks([document_id], rows, embedder)
    lance.upsert_bookmark_cards([source_card(item_id=item_id, title=title or "", url=url, source_type=source_type,
                                             file_name=file_name, parsed_path=parsed_path,
                                             received_at=received_at)])
    lance.maintain(skip_if_current=not written["deleted"])
    context.log.info(f"source {item_id}: {len(rows)} passages in the index as {document_id}")
    return dg.MaterializeResult(metadata={
        "item_id": item_id, "status": status, "document_id": document_id,
        "passages": len(rows), "embedded": written.get("embedded", 0), "ref": parsed_path,
    })
