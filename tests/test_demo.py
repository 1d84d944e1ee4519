"""`kb demo` on an empty KB_HOME: the whole graph on the shipped sample, then searches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loopback import free_port
from tests.private_modes import open_to_others, open_umask

pytestmark = pytest.mark.slow  # slow: kb or a server in another process

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_the_whole_graph_on_an_empty_home(tmp_path, monkeypatch):
    with open_umask():  # as on many systems: only kb's own rule makes the home private
        run_the_demo_commands(tmp_path, monkeypatch)


def run_the_demo_commands(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    home = cwd / "kb-demo"
    # As a new user runs it: no KB_HOME, no DAGSTER_HOME, the default --home.
    env = {k: v for k, v in os.environ.items() if k not in ("KB_HOME", "DAGSTER_HOME", "KB_EMBED_BACKEND")}
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run([sys.executable, "-m", "kb.apps.cli", "demo"],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all stages finished" in result.stdout
    assert "FAILED" not in result.stdout
    assert home.is_dir()

    # The commands that the demo prints reach the demo store when typed in a
    # shell in this folder, as printed: the venv is not on PATH.
    typed = [line.strip().removeprefix("$ ") for line in result.stdout.splitlines()
             if line.strip().startswith(("$ KB_HOME=", "KB_HOME="))]
    assert typed and all(line.startswith("KB_HOME=kb-demo ") for line in typed), typed
    venv_bin = Path(sys.executable).parent.resolve()
    shell_env = {**env, "PATH": ":".join(p for p in env["PATH"].split(":") if p and Path(p).resolve() != venv_bin)}
    status = subprocess.run(["bash", "-c", next(line for line in typed if line.endswith(" status"))], cwd=cwd,
                            env=shell_env, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0 and "indexed" in status.stdout, status.stderr[-2000:]
    web = next(line for line in typed if line.endswith(" web"))
    started = subprocess.run(["bash", "-c", web + " --help"], cwd=cwd, env=shell_env, capture_output=True,
                             text=True, timeout=120)
    assert started.returncode == 0, (web, started.stderr[-1000:])
    # `kb up` as printed starts on the demo's home: every part runs (it read
    # the home's heartbeats before it set DAGSTER_HOME, and stopped, before).
    up = next(line for line in typed if line.endswith(" up --no-bot"))
    assert_up_starts(f"{up} --no-web --dagster-port {free_port()}", cwd, shell_env)
    last_search = [line for line in typed if " search " in line][-1]
    search = subprocess.run(["bash", "-c", last_search + " --json"], cwd=cwd, env=shell_env,
                            capture_output=True, text=True, timeout=300)
    assert search.returncode == 0, search.stderr[-2000:]
    hits = json.loads(search.stdout)["hits"]
    assert hits and len(hits) <= 3
    for field in ("tweet_id", "url", "author", "created_at", "score", "best_source", "best_chunk",
                  "best_ref", "chunk_count", "word_count"):
        assert field in hits[0]
    assert "vector database" in hits[0]["best_chunk"].lower()
    env = {**env, "KB_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}

    # Status in this process: it reads the same files, and saves a start-up.
    from kb.apps.status import collect_status

    for name in ("KB_HOME", "DAGSTER_HOME"):
        monkeypatch.setenv(name, env[name])
    report = collect_status()
    assert report["normalized"]["bookmarks"] >= 30
    assert report["index"]["bookmarks"] == report["normalized"]["bookmarks"]
    assert report["capture"]["last_sync"] is not None
    # kb status names the settings file that it read.
    assert report["settings_file"] == str(Path(os.environ["KB_ENV_FILE"]).resolve())
    # The home that the demo, kb up (its logs), status and search made is
    # the owner's only: each folder 0700, each file 0600 (kb/store/private_files.py).
    assert (home / "logs").is_dir() and (home / "dagster").is_dir()
    assert open_to_others(home) == []


def assert_up_starts(command: str, cwd: Path, env: dict[str, str]) -> None:
    """Run the shell command of `kb up` until it says that every part runs, then stop it with SIGTERM."""
    up = subprocess.Popen(["bash", "-c", f"exec env {command}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in up.stdout:
            lines.append(line)
            if "kb up: running" in line:
                break
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
    assert any("kb up: running" in line for line in lines), "".join(lines)[-3000:]


def test_a_read_of_a_missing_store_creates_nothing_and_says_what_to_do(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from kb.apps.cli import main
    from mcp_server.server import search_bookmarks

    home = tmp_path / "no-store"
    monkeypatch.setenv("KB_HOME", str(home))
    result = CliRunner().invoke(main, ["search", "vector database", "-n", "3"])
    assert result.exit_code == 1
    assert f"The index at {home / 'lancedb'} is empty" in result.stderr
    assert "kb sync" in result.stderr and "kb demo" in result.stderr
    answer = search_bookmarks("vector database", limit=3)
    assert answer["count"] == 0 and "kb sync" in answer["note"]
    assert not home.exists()
