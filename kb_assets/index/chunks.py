"""Asset `chunks`: paragraph-aligned passages of every bookmark's text
(the sources and the cut: kb/index/chunk_sources.py)."""


import dagster as dg

from kb.index.chunk_sources import chunk_batch
from kb_assets.enrich.enrichment import failure_line, failure_list, from_batches
from kb_assets.partitions import sync_batches
from kb_resources.stores import DuckDBResource


@dg.asset(
    partitions_def=sync_batches,
    deps=["bookmarks", "author_threads", "links", "media", "documents", "captions", "transcripts"],
    group_name="index",
    description="Paragraph-aligned passages of each bookmark's texts: post, the author's thread, quote, article, and enrichments.",
)
def chunks(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    batch = context.partition_key
    done = chunk_batch(duckdb.get_client(), batch)
    lines = [failure_line(item, "error", detail) for item, detail in done.failures.values()]
    for line in lines:
        context.log.warning(f"chunks: {line}")
    by_source: dict[str, int] = {}
    for row in done.rows:
        by_source[row["source"]] = by_source.get(row["source"], 0) + 1
    return dg.MaterializeResult(metadata={
        "bookmarks": len(done.live),
        "chunks": len(done.rows),
        "by_source": dg.MetadataValue.json(by_source),
        "removed_bookmarks_dropped": len(done.removed),
        "from_batches": from_batches([batch] * len(done.live)),
        "failures": failure_list(lines),
    })
