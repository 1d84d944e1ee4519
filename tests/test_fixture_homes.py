"""The KB_HOME that a module fixture sees (tests/conftest.py): its own
folder under pytest's temp folder, never the owner's ~/kb. And the LanceDB
lock of an index: the file beside its folder. The lock of
ChunkIndex.from_settings(path=...) was $KB_HOME/lancedb.lock: with ~/kb, the
module fixtures of every worker and of every pytest run on the machine
waited on one lock."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def home_of_the_module(tmp_path_factory) -> Path:
    from kb.index.client import ChunkIndex
    from kb.settings import get_settings

    home = get_settings().home
    # What a module fixture of test_search.py or test_web.py builds: the index of the settings is in this home.
    assert Path(ChunkIndex.from_settings().path).parent == home
    return home


def test_a_module_fixture_gets_a_home_of_its_own_under_pytests_temp_folder(home_of_the_module, tmp_path_factory, kb_home):
    assert home_of_the_module != Path.home() / "kb"
    assert home_of_the_module.is_relative_to(tmp_path_factory.getbasetemp())
    assert home_of_the_module.name.startswith("module-kb-home")
    # The test itself has its own home (conftest's kb_home), another one.
    assert Path(os.environ["KB_HOME"]) == kb_home != home_of_the_module


def test_an_index_locks_the_file_beside_its_own_folder(tmp_path, kb_home):
    """Two indexes in two folders do not wait for each other; an index in a
    bucket locks a file in KB_HOME (it has no folder)."""
    from kb.index.client import ChunkIndex

    first = ChunkIndex.from_settings(path=str(tmp_path / "a" / "lancedb"))
    second = ChunkIndex.from_settings(path=str(tmp_path / "b" / "lancedb"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    entered = threading.Event()

    def write_second():
        with second.writing():
            entered.set()

    with first.writing():
        assert (tmp_path / "a" / "lancedb.lock").exists() and not (kb_home / "lancedb.lock").exists()
        writer = threading.Thread(target=write_second)
        writer.start()
        assert entered.wait(5), "the index in folder b waited for the lock of the index in folder a"
        writer.join(5)
    assert (tmp_path / "b" / "lancedb.lock").exists()
    assert ChunkIndex.from_settings(path="s3://bucket/kb").lock_path == str(kb_home / "lancedb.lock")
