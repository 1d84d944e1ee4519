"""The KB_HOME that a module fixture sees (tests/conftest.py): its own
folder under pytest's temp folder, never the owner's ~/kb. The LanceDB lock
of ChunkIndex.from_settings() is $KB_HOME/lancedb.lock: with ~/kb, the
module fixtures of every worker and of every pytest run on the machine
waited on one lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def home_of_the_module(tmp_path_factory) -> Path:
    from kb.index.client import ChunkIndex
    from kb.settings import get_settings

    home = get_settings().home
    # What a module fixture of test_search.py or test_web.py builds: its lock goes to this home.
    assert Path(ChunkIndex.from_settings(path=str(tmp_path_factory.mktemp("lance"))).lock_path).parent == home
    return home


def test_a_module_fixture_gets_a_home_of_its_own_under_pytests_temp_folder(home_of_the_module, tmp_path_factory, kb_home):
    assert home_of_the_module != Path.home() / "kb"
    assert home_of_the_module.is_relative_to(tmp_path_factory.getbasetemp())
    assert home_of_the_module.name.startswith("module-kb-home")
    # The test itself has its own home (conftest's kb_home), another one.
    assert Path(os.environ["KB_HOME"]) == kb_home != home_of_the_module
