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
    home = tmp_path / "demo-home"
    env = {**os.environ, "KB_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "HF_HUB_OFFLINE": "1"}
    tmp_path.joinpath("cwd").mkdir()
    result = subprocess.run([sys.executable, "-m", "kb.apps.cli", "demo", "--home", str(home)],
                            cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all stages finished" in result.stdout
    assert "FAILED" not in result.stdout

    # The store the demo built answers the CLI too, with the same fields as the MCP tool.
    search = subprocess.run([sys.executable, "-m", "kb.apps.cli", "search", "sourdough", "--json", "-n", "3"],
                            cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=300)
    assert search.returncode == 0, search.stderr[-2000:]
    hits = json.loads(search.stdout)["hits"]
    assert hits and len(hits) <= 3
    for field in ("tweet_id", "url", "author", "created_at", "score", "best_source", "best_chunk",
                  "best_ref", "chunk_count", "word_count"):
        assert field in hits[0]
    assert "sourdough" in hits[0]["best_chunk"].lower()

    # Status in this process: it reads the same files, and saves a start-up.
    from kb.apps.status import collect_status

    for name in ("KB_HOME", "DAGSTER_HOME"):
        monkeypatch.setenv(name, env[name])
    report = collect_status()
    assert report["normalized"]["bookmarks"] >= 30
    assert report["index"]["bookmarks"] == report["normalized"]["bookmarks"]
    assert report["capture"]["last_sync"] is not None
