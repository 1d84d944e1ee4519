"""Settings reach the graph at each load of the code location, not at
import (issue 57, point 4): "Reload" in the Dagster UI takes a changed .env."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import dagster as dg

from kb_resources.services import CaptionerResource, EmbedderResource

REPO = Path(__file__).resolve().parents[1]
# The packages of the Dagster graph: their modules must not read the settings at import.
GRAPH_PACKAGES = ("kb_assets", "sensors", "kb_resources")
SETTINGS_READS = {"get_settings", "Settings"}


def _import_time_reads(tree: ast.AST) -> list[int]:
    """The lines of calls of get_settings() or Settings() that run at
    import: in the module body, a class body, a decorator or a default
    argument. A call in the body of a function runs later."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for part in (*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)):
                visit(part)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in SETTINGS_READS:
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_no_module_of_the_graph_reads_the_settings_at_import():
    reads = {}
    for package in GRAPH_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            lines = _import_time_reads(ast.parse(path.read_text(), str(path)))
            if lines:
                reads[str(path.relative_to(REPO))] = lines
    assert reads == {}, f"settings read at import (build them in defs() instead): {reads}"


def test_the_scan_finds_a_read_at_import():
    """The scan above must see the forms that the issue found."""
    code = ("import dagster as dg\nX = get_settings().tz\n"
            "@dg.sensor(minimum_interval_seconds=get_settings().kb_inbox_sensor_interval_s)\n"
            "def s(context, wait=get_settings().kb_stuck_minutes):\n    return get_settings()\n")
    assert _import_time_reads(ast.parse(code)) == [2, 3, 4]


def _write_env(path: Path, **values: str) -> None:
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))


def test_a_new_load_of_the_definitions_takes_a_changed_env_file(kb_home):
    """The owner edits .env and presses "Reload": the same process builds
    the Definitions again (defs()), with the new times and intervals."""
    from kb_assets.definitions import defs

    env_file = Path(os.environ["KB_ENV_FILE"])
    _write_env(env_file, TZ="UTC", KB_LINT_TIME="02:00", KB_INBOX_SENSOR_INTERVAL_S="15", KB_BACKUP_CRON="",
               KB_EMBED_BATCH="32")
    first = defs()
    assert first.resolve_schedule_def("wiki_lint_schedule").cron_schedule == "0 2 * * *"
    assert first.resolve_sensor_def("inbox_sensor").minimum_interval_seconds == 15
    assert first.resources["embedder"].get_client().batch_size == 32
    backup = first.resolve_schedule_def("backup_schedule")
    assert backup.default_status == dg.DefaultScheduleStatus.STOPPED

    _write_env(env_file, TZ="Europe/Berlin", KB_LINT_TIME="03:30", KB_INBOX_SENSOR_INTERVAL_S="420",
               KB_BACKUP_CRON="15 4 * * *", KB_EMBED_BATCH="8")
    second = defs()
    lint = second.resolve_schedule_def("wiki_lint_schedule")
    assert (lint.cron_schedule, lint.execution_timezone) == ("30 3 * * *", "Europe/Berlin")
    assert second.resolve_sensor_def("inbox_sensor").minimum_interval_seconds == 420
    backup = second.resolve_schedule_def("backup_schedule")
    assert (backup.cron_schedule, backup.default_status) == ("15 4 * * *", dg.DefaultScheduleStatus.RUNNING)
    # The resources of the new load build their clients from the new file.
    assert second.resources["embedder"].get_client().batch_size == 8


def test_each_resource_builds_its_client_from_the_settings_but_for_its_overrides(kb_home, monkeypatch):
    """The resource is the one path from the settings to the client: no
    copy of the client's fields that could drift (the test that compared
    the copies is gone). A run builds the resource again from its config
    (overrides only), and the client still gets the settings."""
    from kb_assets.definitions import build_resources

    monkeypatch.setenv("KB_EMBED_BATCH", "24")
    monkeypatch.setenv("KB_CAPTION_WORKERS", "7")
    for name, resource in build_resources().items():
        client = resource.get_client()
        assert client is resource.get_client(), name  # one client per resource: a run shares it
    # The settings that build_resources() got reach the clients, the inbox's too,
    # also when the process's settings changed since.
    from kb.settings import get_settings

    settings = get_settings()
    monkeypatch.setenv("KB_HOME", str(kb_home / "elsewhere"))
    resources = build_resources(settings)
    assert resources["inbox"].get_client().root == settings.inbox_dir
    assert resources["duckdb"].get_client().path == str(settings.duckdb_path)
    embedder = EmbedderResource.from_settings(backend="hash")
    assert (embedder.get_client().backend, embedder.get_client().batch_size) == ("hash", 24)

    seen = {}

    @dg.asset
    def captions_probe(captioner: CaptionerResource) -> None:
        client = captioner.get_client()
        seen.update(workers=client.workers, max_retries=client.max_retries)

    assert dg.materialize([captions_probe], resources={"captioner": CaptionerResource.from_settings(max_retries=0)}).success
    assert seen == {"workers": 7, "max_retries": 0}

