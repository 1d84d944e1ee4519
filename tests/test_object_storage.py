"""The index in an S3-compatible bucket (KB_LANCE_URI=s3://...).

A loopback moto server speaks the S3 protocol; LanceDB writes and reads it
through its own object-store client. One server and one index serve every
test of the module: writes, the full-text and vector indexes, search, the
web page and the MCP server."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
from starlette.testclient import TestClient

from kb.apps.web import create_app
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS
from kb.index.search import search
from kb.settings import Settings
from tests.fake_s3 import SECRET_ACCESS_KEY, object_keys, s3_env, s3_server

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
URI = "s3://kb-index/team/lancedb"
TEXTS = {
    "1": "Rust ownership and the borrow checker explained with small examples",
    "2": "Sourdough bread: feeding the starter and shaping the loaf",
    "3": "Kubernetes operators reconcile the cluster state in a control loop",
}


def passage(tweet_id: str, text: str) -> dict:
    url = f"https://x.com/alice/status/{tweet_id}"
    return {"chunk_id": f"{tweet_id}-post-0", "tweet_id": tweet_id, "url": url, "author": "alice",
            "created_at": T0, "source": "post", "ref": url, "position": 0, "text": text}


@pytest.fixture(scope="module")
def endpoint():
    with s3_server() as url:
        yield url


@pytest.fixture
def settings(endpoint, monkeypatch, kb_home) -> Settings:
    for name, value in s3_env(endpoint, URI).items():
        monkeypatch.setenv(name, value)
    # A vector index from the first rows: the test must build one in the bucket.
    monkeypatch.setenv("KB_VECTOR_INDEX_MIN_ROWS", "2")
    return Settings()


@pytest.fixture
def written(settings) -> ChunkIndex:
    """The index after one write and one maintain(), as chunk_index leaves it."""
    index = ChunkIndex.from_settings(settings)
    if not index.exists():
        index.replace_chunks(sorted(TEXTS), [passage(t, text) for t, text in TEXTS.items()],
                             Embedder.from_settings(settings, backend="hash"))
        index.upsert_bookmark_cards([{"tweet_id": "1", "url": "https://x.com/alice/status/1", "author": "alice",
                                      "created_at": T0, "text": TEXTS["1"], "last_sync": T0}])
        index.maintain()
    return index


@pytest.mark.slow
def test_writes_and_indexes_go_to_the_bucket(written, endpoint, settings):
    keys = object_keys(endpoint)
    assert any(key.startswith("team/lancedb/chunks.lance/") for key in keys), keys[:20]
    assert any(key.startswith("team/lancedb/bookmarks.lance/") for key in keys)
    # The passages table is in the bucket, not on the local disk.
    assert not (settings.lancedb_dir / f"{CHUNKS}.lance").exists()
    table = ChunkIndex.from_settings(settings).table(CHUNKS)
    assert {tuple(ix.columns) for ix in table.list_indices()} >= {("text",), ("vector",)}
    counts = ChunkIndex.from_settings(settings).counts()
    assert (counts["chunks"], counts["bookmarks"], counts["vector_index"]) == (3, 1, True)
    assert counts["path"] == URI


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_search_reads_the_bucket(written, settings, mode):
    hits = search("borrow checker", mode=mode, index=ChunkIndex.from_settings(settings),
                  embedder=Embedder.from_settings(settings, backend="hash")).hits
    assert hits and hits[0].tweet_id == "1"


@pytest.mark.slow
def test_web_page_and_mcp_server_read_the_bucket(written, settings, endpoint, tmp_path):
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        answer = client.get("/api/search", params={"q": "sourdough starter"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["hits"][0]["tweet_id"] == "2"
        status = client.get("/api/status").json()
        assert status["index"]["indexed_bookmarks"] == 3
    from tests.test_mcp_server import McpClient

    # PYTHONPATH: the server runs this checkout's code, as the test does.
    env = {**s3_env(endpoint, URI), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    with McpClient(settings.home, tmp_path / "mcp.stderr", extra_env=env) as mcp:
        found = mcp.ok("search_bookmarks", query="kubernetes operators")
        assert found["hits"][0]["tweet_id"] == "3"
        assert mcp.ok("get_bookmark", tweet_id="1")["text"] == TEXTS["1"]
        # The log names the bucket, never the key.
        assert URI in mcp.stderr() and SECRET_ACCESS_KEY not in mcp.stderr()


def test_the_resource_holds_no_key_and_its_client_gets_them(settings):
    from kb_resources.stores import ChunkIndexResource

    resource = ChunkIndexResource.from_settings(settings)
    # The Dagster UI shows a resource's config: no key is in it.
    assert SECRET_ACCESS_KEY not in repr(resource.get_resource_definition().config_schema.as_field().default_value)
    client = resource.get_client()
    assert client.storage_options()["aws_secret_access_key"] == SECRET_ACCESS_KEY
    assert SECRET_ACCESS_KEY not in repr(client)


def test_a_bad_index_address_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"KB_LANCE_URI='gs://bucket/index': .* not gs://"):
        ChunkIndex(path="gs://bucket/index", vector_index_min_rows=10)
