"""KB_AGENT_SANDBOX=auto in a container: the agent runs in its bubblewrap
room or not at all (kb/wiki/sandbox.py, container_refusal). On the owner's
machine, `auto` keeps its fallback with a notice. No container engine is
needed: the test sets the signs of a container and the probe's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

import kb.guards.room_binds as room_binds
import kb.wiki.sandbox as sandbox
from kb.wiki.agent import WikiAgent

NO_ROOM = "bwrap cannot make a room here: bwrap: Can't mount proc on /newroot/proc: Operation not permitted"


@pytest.fixture
def room_fails(monkeypatch):
    """bubblewrap cannot make a room, as in a container with a masked /proc."""
    monkeypatch.setattr(sandbox, "bubblewrap_works", lambda: (False, NO_ROOM))


@pytest.fixture
def outside(monkeypatch, tmp_path):
    """No sign of a container."""
    monkeypatch.setattr(room_binds, "CONTAINER_FILES", (str(tmp_path / "no-containerenv"),))
    for name in room_binds.CONTAINER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def inside(outside, monkeypatch, tmp_path):
    """The file that podman writes into each container."""
    marker = tmp_path / ".containerenv"
    marker.write_text("engine=\"podman-4.3.1\"\n")
    monkeypatch.setattr(room_binds, "CONTAINER_FILES", (str(marker),))
    return marker


def test_auto_in_a_container_without_a_room_refuses_and_says_why(room_fails, inside):
    with pytest.raises(sandbox.SandboxError) as refused:
        sandbox.sandbox_choice("auto")
    message = str(refused.value)
    assert f"KB_AGENT_SANDBOX=auto in a container ({inside} exists)" in message
    assert "Can't mount proc" in message and "only in its bubblewrap room" in message
    ready, detail = sandbox.sandbox_status("auto")
    assert not ready and detail.endswith("each agent run fails") and "in a container" in detail
    assert sandbox.sandbox_notice("auto") is None  # no "runs without its room" notice: it does not run


@pytest.mark.parametrize("variable", ["container", "KUBERNETES_SERVICE_HOST"])
def test_the_variables_of_container_engines_are_signs_too(room_fails, outside, monkeypatch, variable):
    monkeypatch.setenv(variable, "podman" if variable == "container" else "10.0.0.1")
    with pytest.raises(sandbox.SandboxError, match=f"in a container \\({variable} is set\\)"):
        sandbox.sandbox_choice("auto")


def test_the_agent_run_fails_before_its_cli_starts(room_fails, inside, tmp_path, monkeypatch):
    """The run records the refusal as its error; no launcher is written, so
    the CLI cannot start without the room."""
    monkeypatch.setattr("kb.wiki.agent.bundled_cli", lambda: "/bin/false")
    agent = WikiAgent(base_url="http://127.0.0.1:9", model="m", agent_dir=str(tmp_path / "agent"), sandbox="auto")
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    run = agent.run("ingest", cwd=wiki)
    assert run.error.startswith("SandboxError: KB_AGENT_SANDBOX=auto in a container"), run.error
    assert not list(Path(tmp_path / "agent").rglob("launch-cli"))


def test_outside_a_container_auto_keeps_its_fallback_with_a_notice(room_fails, outside):
    assert sandbox.sandbox_choice("auto") == (False, f"the agent's CLI runs without bubblewrap: {NO_ROOM}")
    assert "runs without its bubblewrap room" in sandbox.sandbox_notice("auto")


def test_in_a_container_with_a_working_room_auto_uses_it(inside, monkeypatch):
    monkeypatch.setattr(sandbox, "bubblewrap_works", lambda: (True, "/usr/bin/bwrap"))
    assert sandbox.sandbox_choice("auto") == (True, "bubblewrap")


def test_the_owners_explicit_choices_stay(room_fails, inside):
    assert sandbox.sandbox_choice("none")[0] is False  # the owner's own setting, named in kb status
    with pytest.raises(sandbox.SandboxError, match="KB_AGENT_SANDBOX=bwrap"):
        sandbox.sandbox_choice("bwrap")
