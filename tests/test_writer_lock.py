"""The writer locks of DuckDB and LanceDB (kb/store/writer_lock.py), across real
processes on real files.

A write holds its store's lock for seconds; network, GPU, model and
embedding work hold nothing. So a Telegram source goes through its intake
(parse, gate, index) while an X stage fetches in another process, where the
old Dagster pool `duckdb` made it wait for the whole step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kb.store.duckdb_store import DuckDBStore, insert_rows, writer_lock_path
from kb.index.client import ChunkIndex
from kb.urls import normalize_url
from kb.store.writer_lock import WriterLockTimeout
from tests import source_helpers as h
from tests.enrich_rows import add_batches, bookmark, rows, write
from tests.fake_openai_chat import FakeOpenAIChat, chat
from tests.loopback_site import HeldPdfSite, pdf_bytes

pytestmark = [pytest.mark.usefixtures('loopback_fetches'), pytest.mark.slow]  # slow: two processes that share a store

WAIT_S = 120  # a wait limit, not a speed check

HOLDER = textwrap.dedent("""
    import sys, time
    from kb.store.duckdb_store import DuckDBStore
    with DuckDBStore.from_settings().transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS held (n INTEGER)")
        conn.execute("INSERT INTO held VALUES (1)")
        print("held", flush=True)
        time.sleep(float(sys.argv[1]))
    print("released", flush=True)
""")


def start_holder(hold_s: float) -> subprocess.Popen:
    """Another process that holds a DuckDB write transaction for `hold_s` seconds."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(hold_s)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_process_waits_for_the_write_and_a_killed_writer_frees_the_lock(monkeypatch):
    store = DuckDBStore.from_settings()
    holder = start_holder(1.5)
    started = time.monotonic()
    with store.connect() as conn:  # waits for the other process; DuckDB's own lock would fail here
        waited = time.monotonic() - started
        assert conn.execute("SELECT count(*) FROM held").fetchone() == (1,)  # its transaction committed
    assert holder.wait(timeout=WAIT_S) == 0
    assert waited >= 1.0

    # SIGKILL in the middle of a transaction: the kernel frees the lock at once.
    holder = start_holder(3600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=WAIT_S)
    started = time.monotonic()
    with store.connect() as conn:
        assert conn.execute("SELECT count(*) FROM held").fetchone() == (1,)  # the killed insert rolled back
    assert time.monotonic() - started < 10

    # A writer that hangs: the wait ends with an error that names the lock file.
    monkeypatch.setenv("KB_WRITER_LOCK_WAIT_S", "0.5")
    holder = start_holder(3600)
    try:
        with pytest.raises(WriterLockTimeout, match="KB_WRITER_LOCK_WAIT_S") as error, store.connect():
            pass
        assert str(writer_lock_path(store.db_path())) in str(error.value)
    finally:
        holder.kill()
        holder.wait()


def test_lancedb_writes_of_two_processes_take_turns(hasher):
    """Two processes write one LanceDB table at once, each with a compaction:
    no commit conflict, and every row of both lands."""
    script = textwrap.dedent("""
        import sys
        from kb.index.embedder import Embedder
        from kb.index.client import ChunkIndex
        index, embedder = ChunkIndex.from_settings(), Embedder.from_settings(backend="hash")
        prefix = sys.argv[1]
        for n in range(8):
            doc = f"{prefix}-{n}"
            index.replace_chunks([doc], [{"chunk_id": doc, "tweet_id": doc, "text": f"text of {doc}"}], embedder)
            index.maintain()
    """)
    # The table exists first: its creation is not what this test is about.
    ChunkIndex.from_settings().replace_chunks(["seed"], [{"chunk_id": "seed", "tweet_id": "seed", "text": "x"}],
                                              hasher)
    workers = [subprocess.Popen([sys.executable, "-c", script, name], stderr=subprocess.PIPE, text=True)
               for name in ("a", "b")]
    errors = [w.communicate(timeout=WAIT_S)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], errors
    ids = set(ChunkIndex.from_settings().table("chunks").to_arrow().column("tweet_id").to_pylist())
    assert ids == {"seed"} | {f"{p}-{n}" for p in "ab" for n in range(8)}


def test_a_telegram_source_is_searchable_while_an_x_stage_fetches_in_another_process(monkeypatch):
    from kb.index.search import search

    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "300")  # the fetch waits until the test releases it
    words = "Glaciers in the northern valleys lost a third of their ice in two decades. " * 12
    with HeldPdfSite(pdf_bytes(words), wait_s=WAIT_S) as web, FakeOpenAIChat(chat('{"score": 80, "topics": ["db"], "reason": "ok"}')) as gate:
        monkeypatch.setenv("KB_GATE_BASE_URL", gate.base_url)
        monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-TEST-SECRET-GATE-KEY-lock-0001")
        batch, url = "20261101T000000000Z", f"{web.base_url}/report.pdf"
        write([bookmark("1", batch, text="a report on glaciers")])
        with DuckDBStore.from_settings().transaction() as conn:
            insert_rows(conn, "links", [{"tweet_id": "1", "url_norm": normalize_url(url), "position": 0,
                                         "expanded_url": url, "host": "127.0.0.1", "kind": "link",
                                         "from_quote": False, "batch": batch}])
        instance = h.instance()
        add_batches(instance, batch)
        # `kb extract` in its own process, as the owner types it: its step
        # `documents` waits in the fetch of the held file.
        extract = subprocess.Popen([str(Path(sys.executable).parent / "kb"), "extract"], env=dict(os.environ),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert web.arrived.wait(WAIT_S), "kb extract never fetched"
            item = h.add_item("text", 41, text="Write-ahead logging makes a database crash safe: "
                                                "the log reaches the disk before the data pages do.")
            result = h.run_item(instance, item.id)
            assert result.success
            hits = search("write-ahead logging crash safe", limit=5).hits
            assert f"telegram:{item.id}" in {hit.tweet_id for hit in hits}
            # The X stage is still in its fetch: the intake did not wait for it.
            assert extract.poll() is None and rows("SELECT count(*) FROM documents") == [(0,)]
            assert gate.requests, "the gate judged the source"
        finally:
            web.release.set()
        output = extract.communicate(timeout=WAIT_S)[0]
    assert extract.returncode == 0, output
    assert rows("SELECT url, status FROM documents") == [(url, "ok")]
