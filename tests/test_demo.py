"""`kb demo` on an empty KB_HOME: the whole graph on the shipped sample, then searches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_the_whole_graph_on_an_empty_home(tmp_path, monkeypatch):
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

    # The search that the demo prints reaches the demo store when typed in a shell.
    typed = [line.strip() for line in result.stdout.splitlines() if " kb search " in line and "KB_HOME=" in line]
    assert typed and all(line.startswith(("$ KB_HOME=kb-demo ", "KB_HOME=kb-demo ")) for line in typed), typed
    shell_env = {**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    search = subprocess.run(["bash", "-c", typed[-1] + " --json"], cwd=cwd, env=shell_env,
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
