"""Shared test set-up: every test gets its own KB_HOME in a temp folder, and
no test reads the owner's ~/.config/kb."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
