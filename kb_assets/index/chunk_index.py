"""Asset `chunk_index`: the LanceDB serving index of one sync batch (the
work: kb/index/batch_index.py)."""


import dagster as dg

from kb.index.batch_index import index_batch
from kb_assets.enrich.enrichment import failure_line, failure_list, from_batches
from kb_assets.partitions import sync_batches
from kb_assets.run_choices import excluded_in_run
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource


@dg.asset(
    partitions_def=sync_batches,
    deps=["chunks", "translations", "bookmark_folders"],
    group_name="index",
    description="LanceDB index of the batch's chunks: vectors and a full-text index, plus bookmark cards and "
                "the bookmarks of each folder.",
)
def chunk_index(
    context: dg.AssetExecutionContext, duckdb: DuckDBResource, embedder: EmbedderResource, lance: ChunkIndexResource
) -> dg.MaterializeResult:
    batch = context.partition_key
    done = index_batch(duckdb.get_client(), lance.get_client(), embedder.get_client(), batch,
                       excluded_in_run(context), context.log.warning)
    return dg.MaterializeResult(metadata={
        "bookmarks": len(done.live),
        "from_batches": from_batches([batch] * len(done.live)),
        "chunks": done.rows,
        "chunks_written": done.written["written"],
        "chunks_embedded": done.written["embedded"],
        "unchanged_bookmarks": done.written["unchanged_bookmarks"],
        "optimize": done.maintained.get("optimize", "done"),
        "removed_bookmarks": len(done.removed),
        "folders_written": done.folders_written,
        "index_chunks": done.counts.get("chunks", 0),
        "model": str(done.counts.get("model", "")),
        "failures": failure_list([failure_line(tweet_id, "error", error) for tweet_id, error in done.failures]),
    })
