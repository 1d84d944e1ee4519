"""The layout of the passages table (`chunks`): its columns, and the
schema metadata that records the embedding model. The Lance client
(kb/index/writes.py) writes it; the passage rows in memory
(kb/index/passage_rows.py) read it."""

from __future__ import annotations

import pyarrow as pa

MODEL_KEY, DIM_KEY = "kb.model", "kb.dim"


# The word index (kb.index.maintenance.fts_config()) sees a run of Chinese, Japanese or Thai as one word,
# and a Korean word with its particle as one word: a query word inside a run
# finds nothing. So the runs of those scripts (kb.index.chunking.unspaced_runs() of
# text and source_text) have a column of their own, NGRAM_COLUMN, with a
# full-text index of their characters and character pairs (Lance's n-gram
# tokenizer). A query with such characters looks them up there too
# (kb/index/search.py). Pairs only: a query of one character would find nothing;
# 1 to 3 characters: 1.7 times the index size for no gain on a two-character
# word. A text in Latin letters has an empty run column, so English queries
# and their index stay as they were. ICU's word segmenter (base_tokenizer
# "icu") finds Chinese, Japanese and Thai words too, but not a Korean word
# before its particle (benchmarks/filters_and_scripts.md).
NGRAM_COLUMN = "ngram_text"

# The author filter compares handles without case ("@Karpathy" finds
# karpathy). A test of lower(author) cannot use an index: it read the author
# of every row, 108 ms at p95 at 1,000,000 passages where the search alone
# took 23 ms (issue 49). So each row also holds its author in lower case, in
# a column with a scalar index (kb.index.maintenance, ChunkIndex.maintain()).
AUTHOR_KEY_COLUMN = "author_key"


def author_key(author: str | None) -> str:
    """The author as the author filter compares it: without "@", in lower case."""
    return (author or "").strip().lstrip("@").lower()


CHUNK_FIELDS = ("chunk_id", "tweet_id", "url", "author", "created_at", "source", "ref", "position",
                "text", "source_text", "word_count", "lang", "bookmark_chunks", "bookmark_words")


def chunks_schema(dim: int, model: str = "") -> pa.Schema:
    # The model name and dimension live in the table's own schema metadata:
    # they are born and dropped with the vectors, so they can never disagree.
    metadata = {MODEL_KEY: model, DIM_KEY: str(dim)} if model else None
    return pa.schema([
        ("chunk_id", pa.string()),
        ("tweet_id", pa.string()),
        ("url", pa.string()),
        ("author", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("source", pa.string()),
        ("ref", pa.string()),
        ("position", pa.int32()),
        ("text", pa.string()),
        ("source_text", pa.string()),
        ("word_count", pa.int32()),
        ("lang", pa.string()),
        # Totals of the owning bookmark, kept on each row so that a search
        # needs no second query for chunk_count and word_count.
        ("bookmark_chunks", pa.int32()),
        ("bookmark_words", pa.int32()),
        ("vector", pa.list_(pa.float32(), dim)),
        (NGRAM_COLUMN, pa.string()),  # made from text and source_text: see ngram_fts_config()
        (AUTHOR_KEY_COLUMN, pa.string()),  # made from author: see author_key()
    ], metadata=metadata)
