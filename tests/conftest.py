"""Shared test set-up: every test gets its own KB_HOME in a temp folder, and
no test reads the owner's ~/.config/kb."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import sys
import tempfile

import pytest

# Keep the bytecode. This machine sets PYTHONDONTWRITEBYTECODE=1, so each
# process compiled kb's modules again: each xdist worker at collection, and
# each `kb` command, Dagster code server, daemon and run worker that a test
# starts (they get this environment). The cache cuts the CPU of a collection
# and of each import of the graph by a large part
# (benchmarks/figures_from_comments.md). The xdist workers and every subprocess start
# after this line, so they inherit it. .gitignore keeps __pycache__/ out of git.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The ONNX file of the local model (kb/index/embed_onnx.py) lives in the user's cache
# folder. Tests that give a process another HOME keep this one, so the file
# is made once, not once per test (the wiki checks load the model).
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
# The install's folder of ONNX files (kb/index/onnx_cache.py) is the user's
# one here: a test never writes into the venv that other clones share.
os.environ.setdefault("KB_ONNX_SHARED_DIR", os.path.join(os.environ["XDG_CACHE_HOME"], "kb", "onnx"))
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The wiki assets build their retry policy at import: a test of a failed
# wiki change must not wait a minute for each retry.
os.environ.setdefault("KB_WIKI_RETRY_DELAY_S", "0")
# The gate waits 60, 120 and 240 s between its tries: no test waits so long.
os.environ.setdefault("KB_GATE_RETRY_WAITS_S", "0,0,0")
# A module or session fixture runs before the test's own KB_HOME (kb_home
# below). Without a KB_HOME it read the default ~/kb: e.g. the LanceDB lock
# of ChunkIndex.from_settings(path=...) was ~/kb/lancedb.lock, one lock for
# every module fixture of every worker and of every other pytest run on the
# machine. Module fixtures of test_web.py and test_mcp_server.py waited on
# it for more than 300 s (timeouts), test_search.py's for 180 s (6 December
# 2026, load 13). Each process gets its own home; each module gets its own
# (module_kb_home below).
os.environ["KB_HOME"] = tempfile.mkdtemp(prefix="kb-tests-outside-a-test-")
atexit.register(shutil.rmtree, os.environ["KB_HOME"], ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def module_kb_home(tmp_path_factory):
    """The KB_HOME of the module fixtures: an autouse fixture is made before
    the other fixtures of its scope, so a module fixture of one file never
    shares a store or a lock file with another file's (see above)."""
    saved = os.environ.get("KB_HOME")
    os.environ["KB_HOME"] = str(tmp_path_factory.mktemp("module-kb-home"))
    yield
    if saved is None:
        os.environ.pop("KB_HOME", None)
    else:
        os.environ["KB_HOME"] = saved


@pytest.fixture(autouse=True)
def restore_environ():
    """Every test ends with the environment it began with: one test's key
    or home must not reach the next (kb's commands set DAGSTER_HOME, a test
    sets keys)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def kb_home(tmp_path, monkeypatch):
    home = tmp_path / "kb_home"
    home.mkdir(mode=0o700)  # as kb makes it: a wider mode makes each kb command say that it tightened it
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    monkeypatch.setenv("KB_HOME", str(home))
    monkeypatch.setenv("KB_X_STATE", str(config / "state.json"))
    monkeypatch.setenv("KB_CONFIG_FILE", str(config / "config.toml"))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    # An empty settings file: no test reads the owner's ~/.config/kb/.env.
    (config / ".env").write_text("")
    monkeypatch.setenv("KB_ENV_FILE", str(config / ".env"))
    # Keep a developer's .env and real keys out of tests.
    for var in ("TELEGRAM_BOT_TOKEN", "GROQ_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "OLLAMA_URL", "KB_EMBED_BACKEND",
                # A developer's shared stores: no test may write to them.
                "KB_DAGSTER_POSTGRES_URL", "KB_LANCE_URI", "KB_S3_ENDPOINT", "KB_S3_ACCESS_KEY_ID",
                "KB_S3_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    # The names of the owner's specification set kb's settings too (kb/setting_names.py).
    from kb.setting_names import NO_MEANING, RETRY_NAMES, SPEC_NAMES, TIME_PARTS

    for var in (*SPEC_NAMES, *RETRY_NAMES, *NO_MEANING, *(n for pair in TIME_PARTS.values() for n in pair), "KB_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture
def loopback_fetches(monkeypatch):
    """Let kb's fetch guard reach the loopback servers of this test, by port,
    for test files whose loopback sites fetch links (`pytestmark =
    pytest.mark.usefixtures("loopback_fetches")`). The guard refuses
    loopback by default, and a loopback entry of KB_FETCH_ALLOW_HOSTS needs
    its port (kb/guards/fetch_guard.py). So the fixture allows each port on which
    this process listens: the servers of module fixtures, which started
    before it, and each server that starts later in the test (it watches
    socketserver's listen). Every other loopback port stays refused."""
    import socketserver

    ports = set(listening_ports())

    def publish() -> None:
        monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS",
                           ",".join(f"{host}:{port}" for port in sorted(ports) for host in ("127.0.0.1", "localhost")))

    listen = socketserver.TCPServer.server_activate

    def server_activate(server) -> None:
        listen(server)
        if isinstance(server.server_address, tuple):  # not a Unix socket (a subclass too): it has a path
            ports.add(server.server_address[1])
            publish()

    monkeypatch.setattr(socketserver.TCPServer, "server_activate", server_activate)
    publish()


def listening_ports() -> list[int]:
    """The TCP ports on which this process listens (Linux /proc)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


@pytest.fixture
def hasher():
    """The deterministic hash embedder: shared words make near vectors, and
    no model loads."""
    from kb.index.embedder import Embedder

    return Embedder.from_settings(backend="hash")


# --- the order of the work on `pytest -n 3` -----------------------------------
# pyproject.toml runs the workers with --dist loadfile --no-loadscope-reorder:
# a file is a unit of work (its module fixtures are built once) that goes to
# the next free worker, in the order below. The longest files start first, so
# no long file starts late while the other worker runs out of work (before:
# test_up.py and test_shared_instance.py, late in the alphabet, often ended
# the run alone). Seconds of one full run on two cores that other jobs also
# used (the date and load: benchmarks/figures_from_comments.md); a file not
# named here counts as short.
FILE_SECONDS = {
    "test_control_plane.py": 113, "test_stage_commands.py": 98, "test_extract.py": 92,
    "test_crash_safety.py": 91, "test_capture.py": 88, "test_up.py": 85, "test_bad_input.py": 82,
    "test_wiki_agent.py": 74, "test_demo.py": 68, "test_security.py": 66, "test_sources_assets.py": 64,
    "test_shared_instance.py": 62, "test_captions.py": 62, "test_catch_up.py": 57, "test_red_team.py": 51,
    "test_obedient_agent.py": 51, "test_parsers.py": 48, "test_sync.py": 46, "test_sqlite_instance.py": 39,
    "test_definitions.py": 39, "test_embedder.py": 38, "test_backup.py": 38, "test_mcp_front.py": 37,
    "test_layout.py": 36, "test_writer_lock.py": 36, "test_documents.py": 29, "test_archive_attacks.py": 28,
    "test_fetch_guard.py": 25, "test_rows_files.py": 23, "test_normalize.py": 23, "test_telegram_bot.py": 21,
    "test_folders_threads.py": 21, "test_browser_room.py": 20, "test_web.py": 18, "test_mcp_server.py": 17,
    "test_partitions.py": 16, "test_notifications.py": 15, "test_resource_secrets.py": 15,
    "test_wiki_change_rules.py": 14, "test_first_hour.py": 12, "test_mcp_stdio_channel.py": 12,
    "test_filtered_search.py": 10, "test_compute_logs.py": 10, "test_block_choice.py": 9,
    "test_run_endings.py": 8, "test_duckdb_store.py": 8, "test_status.py": 8, "test_object_storage.py": 7,
    "test_search.py": 7, "test_agent_on_the_owner_machine.py": 7, "test_retry_budget.py": 7,
    "test_rerank.py": 6, "test_inbox_sensor.py": 6, "test_translations.py": 6, "test_fast_loop.py": 6,
    "test_run_monitoring.py": 5, "test_load.py": 5, "test_private_files.py": 5, "test_wiki_coherence.py": 5,
    "test_index_writes.py": 5, "test_up_crash.py": 4, "test_dagster_internals.py": 4, "test_modal_apps.py": 4,
    "test_transcripts.py": 3, "test_inspect.py": 3, "test_page_types.py": 1, "test_scripts.py": 1,
    "test_wiki_remote.py": 1, "test_x_graphql.py": 1, "test_sync_kb_up.py": 1,
}


def pytest_collection_finish(session):
    """What the imports of the test modules made (Dagster, pydantic, the
    clients: millions of objects) lives as long as the worker. Python's full
    garbage collection scanned all of it again and again during the tests;
    frozen objects are not scanned (as kb_assets/definitions.py does for a
    Dagster process)."""
    gc.freeze()


# --- the fast loop: `pytest -m "not slow"` -------------------------------------
# The fast loop holds the core rules (parsing, chunking, search, guards,
# checks) and must stay under 60 s on 2 cores. The rule: a test is slow when
# it needs a browser, starts a `kb` command or a server in another process,
# loads a real model, starts PostgreSQL or runs the agent's CLI, or when it
# takes 0.4 s of CPU or more after the warm-up (measure with `--durations=0`;
# on a loaded machine compare CPU time, not wall time). A slow test carries
# `@pytest.mark.slow`; a file whose tests are slow as a rule sets
# `pytestmark = pytest.mark.slow`. The mark sits next to the test, so a
# renamed test keeps it. A test with `@pytest.mark.browser` is slow too
# (the hook below adds the mark). The CPU figures behind the marks are in
# benchmarks/figures_from_comments.md.


# First: pytest's own `-m` selection runs after this hook and sees the marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("browser") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    # Stable: the tests of a file keep their order.
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))
