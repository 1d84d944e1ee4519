"""kb_assets/dagster_internals.py is the one door to Dagster's private
modules. These tests fail, and say which use broke, when a Dagster release
moves or changes a private name that kb uses, or when another module of kb
imports `dagster._` directly."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("kb", "kb_assets", "kb_resources", "sensors", "mcp_server", "telegram_bridge")
ADAPTER = REPO / "kb_assets" / "dagster_internals.py"
PRIVATE = "dagster._"


def _private_uses(path: Path) -> list[str]:
    """Each import of a private Dagster module in `path`, and each string that
    names one (dagster.yaml names classes by module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith(PRIVATE)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PRIVATE):
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PRIVATE):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


@pytest.mark.slow
def test_no_module_but_the_adapter_uses_private_dagster_modules():
    offenders = {}
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            if path != ADAPTER and (uses := _private_uses(path)):
                offenders[str(path.relative_to(REPO))] = uses
    assert not offenders, (
        "Only kb_assets/dagster_internals.py may use Dagster's private modules (dagster._...). "
        f"Use the public API, or add the name to the adapter with its reason: {offenders}")


def test_the_check_sees_a_private_import(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("from dagster._core.launcher import WorkerStatus\nX = 'dagster._core.run_coordinator'\n")
    assert _private_uses(source) == ["line 1: from dagster._core.launcher import ...",
                                     "line 2: 'dagster._core.run_coordinator'"]


def _adapter_imports() -> list[tuple[str, str]]:
    """(module, name) of every private import of the adapter, its lazy
    names included."""
    pairs = []
    for node in ast.walk(ast.parse(ADAPTER.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PRIVATE):
            pairs += [(node.module, alias.name) for alias in node.names]
    import kb_assets.dagster_internals as internals

    return pairs + sorted(internals.LAZY.values())


def test_every_private_name_of_the_adapter_still_exists():
    missing = []
    for module, name in _adapter_imports():
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{module}.{name} ({type(exc).__name__}: {exc})")
    assert not missing, (
        f"Dagster {dg.__version__} moved or removed private names that kb uses: {missing}. "
        "Each use has its reason in kb_assets/dagster_internals.py: find the new name or a public hook.")


MAX_PRIVATE_PATHS = 5  # issue 50: the adapter keeps at most 5, each with its reason


def test_the_adapter_imports_at_most_five_private_module_paths():
    paths = sorted({module for module, _name in _adapter_imports()})
    assert len(paths) <= MAX_PRIVATE_PATHS, (
        f"kb_assets/dagster_internals.py imports {len(paths)} private module paths of Dagster: {paths}. "
        "Use Dagster's public API, or copy a value with a test that compares it.")
    text = ADAPTER.read_text()
    # Each path has its reason in the module text.
    assert [path for path in paths if f"`{path}`" not in text] == []


# The values that the adapter copies from Dagster's private modules: {name in the adapter: (module, name)}.
COPIES = {
    "ASSET_PARTITION_RANGE_START_TAG": ("dagster._core.storage.tags", "ASSET_PARTITION_RANGE_START_TAG"),
    "ASSET_PARTITION_RANGE_END_TAG": ("dagster._core.storage.tags", "ASSET_PARTITION_RANGE_END_TAG"),
    "INDEX_SHARD_NAME": ("dagster._core.storage.event_log.sqlite.sqlite_event_log", "INDEX_SHARD_NAME"),
    "SQLITE_BUSY_TIMEOUT_SECONDS": ("dagster._core.storage.sqlite", "SQLITE_BUSY_TIMEOUT_SECONDS"),
    "ALEMBIC_SCRIPTS_LOCATION": ("dagster._core.storage.sql", "ALEMBIC_SCRIPTS_LOCATION"),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_each_copied_value_equals_dagsters(name):
    import kb_assets.dagster_internals as internals

    module, dagster_name = COPIES[name]
    try:
        theirs = getattr(importlib.import_module(module), dagster_name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"Dagster {dg.__version__} moved {module}.{dagster_name} ({exc}): "
                    f"check the copy {name} in kb_assets/dagster_internals.py")
    assert getattr(internals, name) == theirs, (
        f"Dagster {dg.__version__} changed {module}.{dagster_name}: change the copy {name} in "
        "kb_assets/dagster_internals.py")


def test_the_copied_conn_string_equals_dagsters(tmp_path):
    from dagster._core.storage.sqlite import create_db_conn_string

    import kb_assets.dagster_internals as internals

    for base in (str(tmp_path), str(tmp_path / "history" / "runs") + "/", "relative/dir"):
        assert internals.create_db_conn_string(base, "runs") == create_db_conn_string(base, "runs")


# The private methods and keywords that kb calls or overrides: {(class, method): keywords that kb passes}.
def _calls() -> dict:
    import kb_assets.dagster_internals as internals

    return {
        (internals.DagsterEventLog, "_connect"): {"shard"},
        (internals.DagsterEventLog, "_initdb"): {"engine", "for_index_shard"},
        (internals.DagsterEventLog, "has_table"): {"table_name"},
        (internals.DagsterRunStorage, "connect"): set(),
        (internals.DagsterRunStorage, "from_local"): {"base_dir", "inst_data"},
        (internals.DagsterScheduleStorage, "connect"): set(),
        (internals.DagsterScheduleStorage, "from_local"): {"base_dir", "inst_data"},
        (dg.DefaultRunLauncher, "check_run_worker_health"): {"run"},
        (dg.DefaultRunLauncher, "launch_run"): {"context"},
    }


def test_the_private_methods_that_kb_calls_or_overrides_keep_their_arguments():
    changed = []
    for (cls, method), keywords in _calls().items():
        function = getattr(cls, method, None)
        if function is None:
            changed.append(f"{cls.__name__}.{method} is gone")
            continue
        parameters = set(inspect.signature(function).parameters)
        if not keywords <= parameters:
            changed.append(f"{cls.__name__}.{method} has no {sorted(keywords - parameters)}")
    assert not changed, (
        f"Dagster {dg.__version__} changed methods that kb_assets/dagster_internals.py and "
        f"kb_assets/sqlite_instance.py rely on: {changed}")


@dg.op
def one() -> int:
    return 1


@dg.job(executor_def=dg.in_process_executor)
def one_op_job():
    one()


@pytest.mark.slow
def test_the_public_execute_job_still_makes_runs_that_the_ui_cannot_re_execute():
    """What kb/apps/run_paths.py tells the owner: the UI's re-execution from
    failure reads the run's remote origin (the code location), and
    dg.execute_job does not record one, so only kb up's runs can be
    re-executed in the UI. When a Dagster release records it, change that text."""
    with dg.instance_for_test() as instance:
        result = dg.execute_job(dg.reconstructable(one_op_job), instance=instance)
        assert result.success
        run = instance.get_run_by_id(result.run_id)
    assert run.remote_job_origin is None, (
        "dg.execute_job now records the code location of a run: the UI can re-execute the runs that kb "
        "executes in its own process; change the text of kb/apps/run_paths.py and README.md")


def test_the_postgres_run_coordinator_loads_from_dagsters_public_name():
    from kb_assets.instance_config import POSTGRES_URL_VAR, instance_storage_sections
    from kb.settings import Settings

    sections = instance_storage_sections(Settings(**{POSTGRES_URL_VAR.lower(): "postgresql://u:p@127.0.0.1/db"}))
    coordinator = sections["run_coordinator"]
    loaded = getattr(importlib.import_module(coordinator["module"]), coordinator["class"])
    assert loaded is dg.QueuedRunCoordinator


@pytest.mark.parametrize("name", ["CheckRunHealthResult", "WorkerStatus", "ASSET_PARTITION_RANGE_START_TAG",
                                  "ASSET_PARTITION_RANGE_END_TAG", "SqliteEventLogStorage", "SqliteRunStorage",
                                  "SqliteScheduleStorage"])
def test_the_names_that_dagster_does_not_export_are_still_not_exported(name):
    """When `dagster` exports one of them, kb takes the public name."""
    assert not hasattr(dg, name), f"dagster {dg.__version__} exports {name} now: use dg.{name} in kb"
