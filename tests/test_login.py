"""`kb login`: what can run with no display. The headed sign-in itself needs
the owner at a keyboard; the saving of the state is tested here for real."""

from __future__ import annotations

import json
import os
import stat

import pytest

from kb.apps.login import (
    LoginStatePathRefused,
    check_state_path,
    has_x_session,
    project_root,
    run_login,
    save_login_state,
)
from kb.settings import get_settings

STATE = {"cookies": [{"name": "auth_token", "value": "TEST-SECRET-auth-token", "domain": ".x.com", "path": "/",
                      "expires": -1, "httpOnly": True, "secure": True, "sameSite": "None"}],
         "origins": []}


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    """A umask that would leave files readable by all, to show that the
    modes do not depend on it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_state_is_saved_with_private_modes(tmp_path, monkeypatch, open_umask):
    path = tmp_path / "fresh" / "kb" / "state.json"
    monkeypatch.setenv("KB_X_STATE", str(path))

    saved = save_login_state(STATE, get_settings())

    assert saved == path.resolve()
    assert json.loads(path.read_text()) == STATE
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert mode(path.parent.parent) == 0o700  # a missing parent is made private too
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temp file left


def test_an_existing_wide_folder_is_tightened_and_the_old_state_replaced(tmp_path, monkeypatch, open_umask):
    folder = tmp_path / "config"
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    path = folder / "state.json"
    path.write_text('{"cookies": []}')
    os.chmod(path, 0o644)
    monkeypatch.setenv("KB_X_STATE", str(path))

    save_login_state(STATE, get_settings())

    assert mode(folder) == 0o700
    assert mode(path) == 0o600
    assert json.loads(path.read_text()) == STATE


def test_a_path_inside_kb_home_is_refused(kb_home, monkeypatch):
    path = kb_home / "secrets" / "state.json"
    monkeypatch.setenv("KB_X_STATE", str(path))

    with pytest.raises(LoginStatePathRefused, match="inside KB_HOME"):
        save_login_state(STATE, get_settings())
    assert not path.parent.exists()


def test_a_path_inside_the_repo_is_refused(monkeypatch):
    root = project_root()
    assert root is not None and (root / "kb" / "apps" / "login.py").exists()
    path = root / ".kb-state" / "state.json"
    monkeypatch.setenv("KB_X_STATE", str(path))

    with pytest.raises(LoginStatePathRefused, match="source tree"):
        save_login_state(STATE, get_settings())
    assert not path.parent.exists()


def test_login_refuses_a_bad_path_before_it_opens_a_browser(kb_home, monkeypatch):
    monkeypatch.setenv("KB_X_STATE", str(kb_home / "state.json"))
    monkeypatch.delenv("DISPLAY", raising=False)
    # The refusal comes first: no browser, and not the "no display" error.
    with pytest.raises(LoginStatePathRefused):
        run_login(get_settings())


def test_the_default_path_is_accepted(tmp_path):
    settings = get_settings()
    assert check_state_path(settings.x_state_path, settings) == settings.x_state_path.resolve()


def test_has_x_session_needs_the_auth_cookie_of_x():
    assert has_x_session(STATE, "x.com")
    assert not has_x_session({"cookies": [{**STATE["cookies"][0], "domain": "example.com"}]}, "x.com")
    assert not has_x_session({"cookies": [{**STATE["cookies"][0], "name": "guest_id"}]}, "x.com")
    assert not has_x_session({"cookies": []}, "x.com")
