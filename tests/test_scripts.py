"""Search in every script (issue 29): Chinese, Japanese, Korean and Thai
passages on real LanceDB files. The word index sees a run of characters
without spaces as one word; the n-gram index of the runs finds a
two-character word inside such a run, in bm25 and in hybrid mode."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from kb.index.chunking import chunk_text, word_count
from kb.index.chunk_schema import NGRAM_COLUMN, chunks_schema
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS
from kb.index.search import search
from tests.scripts_text import TEXTS

# A word of two characters that only the text of one language holds.
WORDS = {"zh": ["尊严", "兄弟"], "ja": ["尊厳", "苦役"], "ko": ["양심", "존엄"], "th": ["คน"]}
ENGLISH = ["Rust ownership and the borrow checker", "Sourdough bread: feeding the starter",
           "Human rights and the dignity of each person"]


def _rows() -> list[dict]:
    rows = []
    texts = {**TEXTS, **{f"en{i}": text for i, text in enumerate(ENGLISH)}}
    for name, text in texts.items():
        # Twice over, so that each text makes more than one passage.
        for position, passage in enumerate(chunk_text(f"{text}\n\n{text}", max_words=80)):
            rows.append({"chunk_id": f"{name}-{position}", "tweet_id": name, "url": "", "author": "alice",
                         "source": "post", "ref": name, "position": position, "text": passage})
    return rows


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("scripts")


@pytest.fixture(scope="module")
def hasher_module(folder):
    from kb.index.embedder import Embedder

    return Embedder.from_settings(backend="hash", cache_dir=str(folder / "cache"))


@pytest.fixture(scope="module")
def store(folder, hasher_module) -> ChunkIndex:
    index = ChunkIndex(path=str(folder / "lancedb"), vector_index_min_rows=5000)
    rows = _rows()
    index.replace_chunks(sorted({r["tweet_id"] for r in rows}), rows, hasher_module)
    index.maintain()
    return index


def test_each_passage_holds_at_most_the_word_limit():
    rows = _rows()
    assert {r["tweet_id"] for r in rows if r["position"] > 0} >= set(TEXTS)
    assert all(word_count(r["text"]) <= 80 for r in rows)


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
@pytest.mark.parametrize("lang", sorted(WORDS))
def test_a_two_character_word_finds_its_passage(store, hasher_module, lang, mode):
    for word in WORDS[lang]:
        assert len(word) == 2
        hits = search(word, index=store, embedder=hasher_module, mode=mode, limit=5).hits
        assert hits and hits[0].tweet_id == lang, (word, [h.tweet_id for h in hits])
        assert word in hits[0].best_chunk and hits[0].exact_match


def test_an_english_query_reads_the_word_index_as_before(store, hasher_module):
    hits = search("borrow checker", index=store, embedder=hasher_module, mode="bm25").hits
    assert [h.tweet_id for h in hits] == ["en0"]


def test_a_table_from_before_gets_the_ngram_column_and_index(tmp_path, hasher_module):
    """A passages table without the n-gram column (written before issue 29):
    the next write adds the column to every row, and maintain() builds the
    index, so the old rows are found too."""
    path = tmp_path / "lancedb"
    index = ChunkIndex(path=str(path), vector_index_min_rows=5000)
    old = [{"chunk_id": "ja-0", "tweet_id": "ja", "url": "", "author": "alice", "source": "post", "ref": "ja",
            "position": 0, "text": TEXTS["ja"]}]
    index.replace_chunks(["ja"], old, hasher_module)
    # Make it a table of the old layout: the same rows without the column.
    table = lance.dataset(index.table_uri(CHUNKS)).to_table()
    schema = chunks_schema(256, "hash:bow-256")
    old_schema = pa.schema([f for f in schema if f.name != NGRAM_COLUMN], metadata=schema.metadata)
    index._connect().create_table(CHUNKS, data=table.drop_columns([NGRAM_COLUMN]).cast(old_schema), mode="overwrite")
    assert NGRAM_COLUMN not in index.table(CHUNKS).schema.names
    assert search("尊厳", index=index, embedder=hasher_module, mode="bm25").hits == []

    new = [{"chunk_id": "zh-0", "tweet_id": "zh", "url": "", "author": "alice", "source": "post", "ref": "zh",
            "position": 0, "text": TEXTS["zh"]}]
    index.replace_chunks(["zh"], new, hasher_module)
    report = index.maintain()
    assert report["fts"] == "created"  # the table made anew above has no index
    for word, lang in (("尊厳", "ja"), ("尊严", "zh")):
        hits = search(word, index=index, embedder=hasher_module, mode="bm25").hits
        assert hits[0].tweet_id == lang and hits[0].exact_match
