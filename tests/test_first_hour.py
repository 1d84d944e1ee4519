"""A new user's first hour: every command that the demo and the README
print works when it is typed as printed, in the folder where the user
stands, with the venv not on PATH (as after README command 1).

The lines go through bash, as a user types them. A command that starts a
server (`kb web`, `kb up`) runs with --help appended: the shell finds the
program and the variables before it parse, and no port is taken. The slow
test in tests/test_demo.py runs the searches and `kb status` in full."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kb.apps.demo import next_commands

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def shell_env() -> dict[str, str]:
    """The environment of a new shell: the venv is not on PATH."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != VENV_BIN.resolve()] or ["/usr/bin", "/bin"]
    return {**os.environ, "PATH": os.pathsep.join(path)}


def typed(line: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=shell_env(), capture_output=True, text=True,
                          timeout=120)


def demo_command_lines(text: str) -> list[str]:
    """The command lines of the demo's last block (indented, after the first line)."""
    return [line.strip() for line in text.splitlines()[1:] if line.startswith("  ")]


def test_the_commands_that_the_demo_prints_work_as_typed(tmp_path, monkeypatch):
    cwd = tmp_path / "where-the-user-stands"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    text = next_commands(cwd / "kb-demo", "vector database")
    lines = demo_command_lines(text)
    assert lines and all(line.startswith("KB_HOME=kb-demo ") for line in lines), text
    for line in lines:
        result = typed(line + " --help", cwd)
        assert result.returncode == 0 and "Usage:" in result.stdout, (line, result.stderr[-500:])
    # The way to type `kb` alone, as the demo tells it, works too.
    [tip] = [line for line in text.splitlines() if "put the venv on PATH" in line]
    export = tip.split(": ", 1)[1]
    result = typed(f"{export} && kb --help", cwd)
    assert result.returncode == 0 and "Usage:" in result.stdout, (export, result.stderr[-500:])


def test_the_bare_name_is_printed_only_when_the_shell_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    text = next_commands(tmp_path / "kb-demo", "vector database")
    assert all(" kb " in line for line in demo_command_lines(text)), text
    assert "put the venv on PATH" not in text


def readme_command_lines() -> list[str]:
    """The lines of the README that a user types: each line of a ```sh block,
    and each inline `...` that starts with KB_HOME= or .venv/bin/."""
    text = (REPO / "README.md").read_text()
    lines = [line.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)
             for line in block.splitlines() if line.strip()]
    # "`.venv/bin/kb ...`" is a pattern in a sentence, not a line to type.
    lines += [line for line in re.findall(r"`((?:KB_HOME=|\.venv/bin/)[^`]+)`", text) if "..." not in line]
    return lines


# What a test cannot run, and why. Every other line of the README runs.
NOT_RUN_HERE = {
    "python3 -m venv": "installs kb: the test runs in that venv",
    "bash .ci/run": "runs the whole suite",
    "cp deploy/kb-up.service": "installs a systemd unit of the owner",
    "claude mcp add": "needs Claude Code; the path that it registers is checked below",
    "codex mcp add": "needs Codex; the path that it registers is checked below",
}


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "kb").exists(), reason="the README's venv is .venv in the clone")
def test_the_commands_that_the_readme_prints_work_as_typed():
    lines = readme_command_lines()
    assert any("KB_HOME=kb-demo" in line for line in lines)
    ran = 0
    for line in lines:
        if any(line.startswith(start) for start in NOT_RUN_HERE):
            for path in re.findall(r'"\$PWD/([^"]+)"', line):
                assert (REPO / path).exists(), (line, path)
            continue
        if line.startswith("export PATH="):
            result = typed(f"{line} && kb --help", REPO)
        else:
            # Servers and stores: the program is found and the line parses.
            result = typed(line + " --help", REPO)
        assert result.returncode == 0 and "usage:" in result.stdout.lower(), (line, result.stderr[-500:])
        ran += 1
    assert ran >= 3


def test_the_model_preparation_is_made_once_per_install_and_says_nothing_to_the_owner(tmp_path, monkeypatch,
                                                                                    caplog):
    """The int8 query model is made at the first search. A second HOME (a
    service, an agent's MCP client) finds it in the install's folder, and
    ONNX Runtime's advice to developers never reaches the owner (issue 48)."""
    import logging
    import shutil

    from kb.index.embed_local import local_model_path
    from kb.index.embed_onnx import onnx_int8_file, onnx_model_file

    path = local_model_path("all-MiniLM-L6-v2")
    full = onnx_model_file(path)  # made once for the suite (tests/conftest.py): not the subject here
    install = tmp_path / "venv-share"
    install.mkdir()
    try:
        os.link(full, install / full.name)
    except OSError:
        shutil.copy(full, install / full.name)
    monkeypatch.setenv("KB_ONNX_SHARED_DIR", str(install))
    caplog.set_level(logging.INFO)
    for home in ("first-home", "second-home"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / home / ".cache"))
        assert onnx_int8_file(path) == install / f"{full.stem}-int8.onnx"
    assert sorted(p.name for p in install.iterdir()) == sorted([full.name, f"{full.stem}-int8.onnx"])
    assert not list(tmp_path.glob("*-home/**/*.onnx"))  # no copy in either HOME
    made = [r for r in caplog.records if "Made the int8 ONNX file" in r.getMessage()]
    assert len(made) == 1  # once for both HOMEs
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()], caplog.text


def test_a_model_file_that_another_user_could_plant_in_the_shared_folder_is_not_used(tmp_path, monkeypatch):
    """The attacker: a shared folder that every user may write (mode 777)
    holds a model file. kb does not load it, and writes none there."""
    from kb.index import onnx_cache

    shared = tmp_path / "share"
    shared.mkdir()
    (shared / "model-x-int8.onnx").write_bytes(b"planted")
    shared.chmod(0o777)
    monkeypatch.setenv("KB_ONNX_SHARED_DIR", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert onnx_cache.existing("model-x-int8.onnx") is None
    assert onnx_cache.new_path("model-y.onnx") == tmp_path / "cache" / "kb" / "onnx" / "model-y.onnx"

    shared.chmod(0o755)  # only its owner writes it: trusted
    (shared / "model-x-int8.onnx").chmod(0o666)  # but the file itself may be changed by anyone
    assert onnx_cache.existing("model-x-int8.onnx") is None
    (shared / "model-x-int8.onnx").chmod(0o644)
    assert onnx_cache.existing("model-x-int8.onnx") == shared / "model-x-int8.onnx"
