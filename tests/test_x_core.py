"""The X room's core with no Dagster run: capture_batch() imports saved
pages, normalize_batch() stores them, and bad input is refused by name.

The assets x_raw_pages and normalized_bookmarks only call these two
functions (tests/test_capture.py and tests/test_normalize.py run them
through Dagster). The CLI (`kb inspect`) and later callers use the core
directly, so the core must hold its rules without the graph.
"""

from __future__ import annotations

import logging

from pathlib import Path

import pytest

from kb.store.duckdb_store import DuckDBStore
from kb.sample_data import sample_pages
from kb.x.batch_rows import EmptyBatchError
from kb.x.bookmark_tables import normalize_batch
from kb.x.browser import Browser
from kb.x.capture_import import ImportInputError
from kb.x.capture_run import capture_batch
from kb.x.raw_store import RawStore

BATCH = "20261101T000000000Z"
LOG = logging.getLogger("tests.x_core")


def bookmark_count() -> int:
    with DuckDBStore.from_settings().connect() as conn:
        return conn.execute("SELECT count(*) FROM bookmarks").fetchone()[0]


def test_the_core_imports_saved_pages_and_normalizes_them_without_dagster():
    raw_store = RawStore.from_settings()
    pages = sample_pages()
    outcome = capture_batch(Browser.from_settings(), raw_store, BATCH, files=[str(p) for p in pages], log=LOG)

    assert outcome.error is None and outcome.mode == "files"
    manifest = raw_store.manifest(BATCH)
    assert manifest.complete and manifest.error is None and manifest.mode == "files"
    # Byte for byte, in the order given.
    assert [p.read_bytes() for p in raw_store.pages(BATCH)] == [p.read_bytes() for p in pages]
    assert raw_store.watermark() is None  # an import never moves the watermark

    stored = normalize_batch(DuckDBStore.from_settings(), raw_store, BATCH, log=LOG)
    assert len(stored.rows.seen_tweet_ids) == 40  # the sample: 40 bookmarks, one that X no longer shows
    assert len(stored.rows.unavailable_tweet_ids) == 1
    assert stored.stats.new == len(stored.rows.bookmarks) == bookmark_count() == 39
    findings = stored.findings
    assert not findings.missing_author_or_sort_index and not findings.duplicates
    assert not findings.links_not_normalized


def test_a_missing_import_file_is_named_and_nothing_is_imported(tmp_path):
    raw_store = RawStore.from_settings()
    missing = tmp_path / "page-0009.json"
    with pytest.raises(ImportInputError, match=f"no such file: {missing}. Nothing was imported."):
        capture_batch(Browser.from_settings(), raw_store, BATCH, files=[str(sample_pages()[0]), str(missing)],
                      log=LOG)
    assert raw_store.pages(BATCH) == []
    # The manifest says why the batch holds nothing: the next sync does not count it as a capture.
    manifest = raw_store.manifest(BATCH)
    assert not manifest.complete and "no such file" in manifest.error


def test_an_import_file_larger_than_an_x_answer_is_named_and_nothing_is_read(tmp_path, monkeypatch):
    """kb import reads each file whole: a file of some GB (a disk image
    given by mistake, a stranger's archive) is refused by its size before
    any file is read. A sparse file stands in for it."""
    from kb.x.capture_import import MAX_IMPORT_FILE_BYTES

    raw_store = RawStore.from_settings()
    large = tmp_path / "bookmarks.json"
    with open(large, "wb") as handle:
        handle.truncate(4 * 1024**3)  # 4 GiB, no block of it on the disk
    read = []
    original = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or original(self))
    with pytest.raises(ImportInputError, match=f"larger than the {MAX_IMPORT_FILE_BYTES:,} bytes of an X answer: "
                                               f"{large} \\(4,294,967,296 bytes\\). Nothing was imported."):
        capture_batch(Browser.from_settings(), raw_store, BATCH, files=[str(sample_pages()[0]), str(large)], log=LOG)
    assert read == [] and raw_store.pages(BATCH) == []
    assert "larger than" in raw_store.manifest(BATCH).error


def test_an_empty_batch_is_refused_by_name_and_the_tables_stay():
    raw_store = RawStore.from_settings()
    capture_batch(Browser.from_settings(), raw_store, BATCH, files=[str(p) for p in sample_pages()], log=LOG)
    normalize_batch(DuckDBStore.from_settings(), raw_store, BATCH)
    before = bookmark_count()

    with pytest.raises(EmptyBatchError, match="Batch 20261102T000000000Z has no raw pages and no capture.json"):
        normalize_batch(DuckDBStore.from_settings(), raw_store, "20261102T000000000Z")
    assert bookmark_count() == before == 39
