"""Shared test set-up: every test gets its own KB_HOME in a temp folder, and
no test reads the owner's ~/.config/kb."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The wiki assets build their retry policy at import: a test of a failed
# wiki change must not wait a minute for each retry.
os.environ.setdefault("KB_WIKI_RETRY_DELAY_S", "0")


@pytest.fixture(autouse=True)
def restore_environ():
    """Every test ends with the environment it began with. Building a
    resource exports a secret from the settings file to the environment
    (kb_resources/client_resource.py), so one test's key must not reach the next."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def kb_home(tmp_path, monkeypatch):
    home = tmp_path / "kb_home"
    home.mkdir()
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
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture
def loopback_fetches(monkeypatch):
    """Let kb's fetch guard reach every port of 127.0.0.1 and localhost, for test files
    whose loopback sites fetch links (`pytestmark = pytest.mark.usefixtures(
    "loopback_fetches")`). The guard refuses loopback by default; the tests of
    the guard itself (tests/test_fetch_guard.py) allow one port at a time."""
    monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", "127.0.0.1,localhost")


@pytest.fixture
def hasher():
    """The deterministic hash embedder: shared words make near vectors, and
    no model loads."""
    from kb.embedder import Embedder

    return Embedder.from_settings(backend="hash")


# --- the order of the work on `pytest -n 2` -----------------------------------
# pyproject.toml runs the workers with --dist loadfile --no-loadscope-reorder:
# a file is a unit of work (its module fixtures are built once) that goes to
# the next free worker, in the order below. The longest files start first, so
# no long file starts late while the other worker runs out of work (before:
# test_up.py and test_shared_instance.py, late in the alphabet, often ended
# the run alone). Seconds of one full run on two cores that other jobs also
# used (load average 5.6, 1 December 2026); a file not named here counts as
# short.
FILE_SECONDS = {
    "test_crash_safety.py": 172, "test_up.py": 149, "test_sync.py": 96, "test_wiki_agent.py": 95,
    "test_extract.py": 87, "test_shared_instance.py": 71, "test_layout.py": 66, "test_bad_input.py": 66,
    "test_demo.py": 64, "test_security.py": 55, "test_capture.py": 52, "test_sources_assets.py": 49,
    "test_embedder.py": 29, "test_stage_commands.py": 47, "test_sqlite_instance.py": 46, "test_parsers.py": 44,
    "test_captions.py": 39, "test_definitions.py": 35, "test_documents.py": 34, "test_normalize.py": 32,
    "test_notifications.py": 24, "test_telegram_bot.py": 19, "test_web.py": 18, "test_mcp_server.py": 17,
    "test_object_storage.py": 16, "test_backup.py": 30, "test_load.py": 14, "test_inbox_sensor.py": 10,
    "test_translations.py": 9, "test_transcripts.py": 8, "test_search.py": 7, "test_inspect.py": 7,
    "test_rerank.py": 12, "test_modal_apps.py": 7, "test_x_graphql.py": 6, "test_fetch_guard.py": 40,
    "test_wiki_remote.py": 8, "test_folders_threads.py": 45, "test_first_hour.py": 10, "test_red_team.py": 60,
    "test_page_types.py": 8,
}


def pytest_collection_modifyitems(items):
    # Stable: the tests of a file keep their order.
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))
