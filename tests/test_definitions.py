"""The Definitions load, and the Dagster webserver serves the graph over GraphQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

pytestmark = pytest.mark.slow  # slow: kb or a server in another process

REPO = Path(__file__).resolve().parents[1]

X_PATH = ["x_raw_pages", "bookmarks", "authors", "media", "links", "chunks", "chunk_index"]


def test_definitions_load_every_stage():
    from kb_assets.definitions import defs as load_definitions

    defs = load_definitions()

    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert set(X_PATH) <= keys
    # Every X stage shares the sync batch partitions.
    for name in X_PATH:
        partitions = graph.get(dg.AssetKey(name)).partitions_def
        assert isinstance(partitions, dg.DynamicPartitionsDefinition), name
        assert partitions.name == "sync_batches"
    assert defs.resolve_job_def("x_sync") is not None
    assert defs.resolve_sensor_def("x_sync_sensor") is not None
    # No asset holds a pool slot for DuckDB: a step would hold it for its
    # whole fetch, GPU wait or embedding, and the Telegram intake would wait
    # behind it. Each write takes the store's writer lock instead (kb/store/writer_lock.py).
    for key in graph.get_all_asset_keys():
        assert "duckdb" not in (graph.get(key).pools or set()), key
    for name in ["parsed_sources", "gated_sources", "source_passages", "chunks", "chunk_index"]:
        assert not graph.get(dg.AssetKey(name)).pools, name


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


GRAPH_QUERY = """
{
  assetNodes { assetKey { path } groupName isPartitioned }
  bookmarks: assetNodeOrError(assetKey: {path: ["bookmarks"]}) {
    ... on AssetNode { partitionKeys partitionDefinition { name type } }
  }
}
"""


@pytest.mark.slow
def test_webserver_serves_the_graph_and_its_partitions(kb_home):
    from kb_assets.instance_config import ensure_dagster_home

    dagster_home = ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("sync_batches", ["20260101T000000000Z", "20260102T000000000Z"])

    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-w", str(REPO / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        payload = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"dagster-webserver exited: {server.stderr.read().decode()[-2000:]}")
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": GRAPH_QUERY}, timeout=10)
                payload = response.json()
                if payload.get("data", {}).get("assetNodes"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.25)  # a short poll: the test ends as soon as the webserver answers
        assert payload and payload.get("data"), payload
        nodes = {"/".join(n["assetKey"]["path"]): n for n in payload["data"]["assetNodes"]}
        assert set(X_PATH) <= set(nodes)
        assert nodes["bookmarks"]["isPartitioned"]
        bookmarks = payload["data"]["bookmarks"]
        assert bookmarks["partitionDefinition"]["name"] == "sync_batches"
        assert bookmarks["partitionKeys"] == ["20260101T000000000Z", "20260102T000000000Z"]
    finally:
        # SIGKILL: the test reads nothing after the stop, and after SIGTERM the
        # webserver spent seconds of CPU on its last garbage collection.
        server.kill()
        server.wait(timeout=30)


def test_loading_the_code_location_writes_dagster_yaml(tmp_path):
    """dagster dev, the daemon and each code server load kb's code location
    (they call kb_assets.definitions.defs) with DAGSTER_HOME set: the load
    writes kb's dagster.yaml when it is absent, so every Dagster process sees
    the same pools, monitoring and retries. An import of the module alone
    (a test, a script, a tool that reads the code) writes nothing, freezes
    nothing and leaves the umask as it is (issue 50)."""
    home = tmp_path / "fresh-dagster-home"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    check = ("import gc, os, json\n"
             "def state(): mask = os.umask(0o022); os.umask(mask); "
             "return [os.path.exists(os.environ['DAGSTER_HOME']), gc.get_freeze_count() > 0, oct(mask)]\n"
             "import kb_assets.definitions as d\n"
             "imported = state()\n"
             "d.defs()\n"
             "print(json.dumps({'imported': imported, 'loaded': state()}))\n")
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=250,
                          preexec_fn=lambda: os.umask(0o022))
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    states = json.loads(done.stdout.strip().splitlines()[-1])
    assert states["imported"] == [False, False, "0o22"]  # the import wrote no file, froze nothing
    assert states["loaded"] == [True, True, "0o77"]  # the load of the code location did the set-up
    instance = dg.DagsterInstance.from_config(str(home))
    assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    assert type(instance.run_launcher).__name__ == "LocalRunLauncher"
    assert instance.run_launcher.supports_check_run_worker_health
    assert instance.run_retries_max_retries == 1
