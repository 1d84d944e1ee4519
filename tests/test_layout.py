"""The floor plan holds: the serving apps load no Dagster, the import-linter
core list is complete, module names are unique, resources mirror their
clients, and the one wiki listing keeps a link to .git/config out of the index.
The layers themselves are import-linter contracts (pyproject.toml), run by .ci/run."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import kb
import kb_assets
import kb_resources
import mcp_server
import sensors
import telegram_bridge

REPO = Path(__file__).resolve().parents[1]
PACKAGES = [kb, kb_assets, kb_resources, sensors, telegram_bridge, mcp_server]

SERVING_MODULES = ["mcp_server.server", "telegram_bridge.bot", "kb.index.search", "kb.index.reading"]
# A fresh interpreter imports the modules one after another. After each
# import it lists the modules of Dagster, DuckDB and the graph that are
# loaded so far. An empty list for a module means that it and the modules
# before it loaded none of them. Why one interpreter and not one per module:
# each start imports kb's core again (about 1.2 s of CPU for the four).
NO_GRAPH_CHECK = """
import importlib, json, sys
loaded = {}
for module in sys.argv[1:]:
    importlib.import_module(module)
    loaded[module] = sorted(n for n in sys.modules
                            if n.split(".")[0] in ("dagster", "duckdb", "kb_assets", "kb_resources", "sensors"))
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def graph_modules_found() -> dict:
    return {}


@pytest.fixture
def graph_modules_of(graph_modules_found, kb_home) -> dict[str, list[str]]:
    """For each serving module: what NO_GRAPH_CHECK found after its import.
    The first test that asks runs the check, in the environment of conftest.kb_home."""
    if not graph_modules_found:
        result = subprocess.run([sys.executable, "-c", NO_GRAPH_CHECK, *SERVING_MODULES], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        graph_modules_found.update(json.loads(result.stdout.strip().splitlines()[-1]))
    return graph_modules_found


@pytest.mark.slow
@pytest.mark.parametrize("module", SERVING_MODULES)
def test_serving_apps_and_the_core_load_no_dagster(module, graph_modules_of):
    # A fresh interpreter: in this one, other tests have already imported Dagster.
    # The MCP server must start fast and must never open DuckDB.
    loaded = graph_modules_of[module]
    assert not loaded, f"{module} (or a module before it in SERVING_MODULES) loaded {', '.join(loaded[:20])}"


# Client libraries that the graph must not import when it loads: every
# Dagster process (daemon, webserver, code server, each run worker) loads the
# graph, and these took about 8 s of each start on two cores (aiogram's types
# 4 s, lancedb 3 s). A client imports its library when it is built.
CLIENT_LIBRARIES = ("lancedb", "aiogram", "openai", "groq", "ollama", "torch", "sentence_transformers", "onnxruntime")


@pytest.mark.slow
def test_loading_the_graph_imports_no_client_library():
    check = ("import sys, kb_assets.definitions\n"
             f"print(' '.join(name for name in {CLIENT_LIBRARIES!r} if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == []


@pytest.mark.slow
def test_opening_lancedb_imports_no_rest_client_until_a_name_of_it_is_read(tmp_path):
    """kb/index/lance_loader.py: the REST client of LanceDB's namespace package
    cost 2 s of CPU in each process that opens LanceDB. Its models load; its
    API classes load only when something reads a name of the package."""
    check = ("import sys\nfrom kb.index.lance_loader import lancedb_module\n"
             f"lancedb_module().connect({str(tmp_path)!r}).table_names()\n"
             "print('lance_namespace_urllib3_client.api' in sys.modules)\n"
             "from lance_namespace_urllib3_client import ApiClient\n"
             "print(ApiClient.__name__, 'lance_namespace_urllib3_client.api' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "ApiClient", "True"]


def all_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package.__name__)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return names


def test_the_core_contract_names_every_core_module():
    """A new core module that the contract does not name could import Dagster unseen."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["name"].startswith("The core imports no Dagster"))
    core = {m.split(".")[1] for m in all_modules() if m.startswith("kb.") and not m.startswith("kb.apps")}
    listed = {m.split(".")[1] for m in contract["source_modules"]}
    assert core == listed, f"add to or remove from the contract: {sorted(core ^ listed)}"


def test_the_core_has_one_room_per_asset_group():
    """kb/x, kb/enrich, kb/index, kb/telegram, kb/wiki hold the code that the asset
    groups of the same name in kb_assets call. A room without its group, or a
    group without its room, is a floor plan that no longer tells the truth."""
    # kb/models, kb/store, kb/guards and kb/backup are no rooms: the catalog
    # of models, the stores on disk and the guards that every room uses, and
    # the backup of all of them.
    rooms = {m.name for m in pkgutil.iter_modules(kb.__path__) if m.ispkg} - {
        "apps", "sample_data", "models", "store", "guards", "backup"}
    groups = {m.name for m in pkgutil.iter_modules(kb_assets.__path__) if m.ispkg}
    assert rooms == groups, f"rooms and asset groups differ: {sorted(rooms ^ groups)}"


def test_module_names_are_unique_and_no_standard_library_name():
    # The rooms of the core share their names with the asset groups on purpose
    # (the test above); every module file has a name of its own.
    rooms = {m.name for m in pkgutil.iter_modules(kb.__path__) if m.ispkg}
    leaves: dict[str, list[str]] = {}
    for name in all_modules():
        leaf = name.rsplit(".", 1)[-1]
        if name in (f"kb.{leaf}", f"kb_assets.{leaf}") and leaf in rooms:
            continue
        leaves.setdefault(leaf, []).append(name)
    twice = {leaf: names for leaf, names in leaves.items() if len(names) > 1}
    assert not twice, f"two modules with one name: {twice}"
    shadows = sorted(leaf for leaf in leaves if leaf in sys.stdlib_module_names)
    assert not shadows, f"modules named like a standard-library module: {shadows}"


def test_a_secret_reaches_the_client_but_the_resource_shows_none(monkeypatch):
    from kb_resources.services import QualityGateResource

    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-test-secret-0123")
    resource = QualityGateResource.from_settings()
    assert "sk-test-secret-0123" not in repr(resource.get_resource_definition().config_schema.as_field().default_value)
    assert resource.get_client().api_key.get_secret_value() == "sk-test-secret-0123"


def test_a_symlink_to_git_config_is_no_page_for_any_reader(kb_home):
    """One listing of wiki pages serves the index, the checks and the readers."""
    from kb.wiki.checks import check_wiki
    from kb.wiki_files import wiki_page_files
    from kb_assets.index.wiki_index import page_rows

    root = kb_home / "wiki"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "config").write_text("[remote]\n\turl = https://user:token@example.org/wiki.git\n")
    (root / "wiki" / "concepts").mkdir(parents=True)
    (root / "wiki" / "concepts" / "real.md").write_text("---\ntype: concept\n---\n# Real\n\nA page.\n")
    (root / "wiki" / "concepts" / "leak.md").symlink_to(root / ".git" / "config")
    pages = wiki_page_files(root)
    assert [p.name for p in pages] == ["real.md"]
    rows = [row for page in pages for row in page_rows(root, page)]
    assert rows and not any("token" in row["text"] for row in rows)
    findings = check_wiki(root)
    assert not any("leak" in str(item) for items in findings.values() for item in items)
