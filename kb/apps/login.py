"""`kb login`: the owner signs in to X by hand; kb keeps the login state.

The state (cookies and local storage of x.com) is a secret: with it, anyone
acts as the owner on X. So:
- it goes to settings.x_state_path (~/.config/kb/state.json), file mode
  0600 in a folder of mode 0700;
- never into KB_HOME (backups, sync folders, the Dagster UI can show it) and
  never into the repo (a commit would publish it);
- it is never printed or logged; messages name the path only.

The sign-in runs in a plain headed context, not in the guarded X context:
the owner may sign in through Google or Apple, which are other sites.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

from kb.x.browser import BrowserNotFound, chromium_launch_options, is_x_host
from kb.store.atomic_files import write_atomic
from kb.store.private_files import FILE_MODE, make_private_folder
from kb.settings import Settings

# The cookie that X sets when a sign-in succeeds.
X_SESSION_COOKIE = "auth_token"


class LoginStatePathRefused(ValueError):
    """The login state must not go to this path."""


class LoginNotFinished(RuntimeError):
    """The browser holds no X session: the sign-in did not finish."""


def project_root() -> Path | None:
    """The source tree of kb (the folder with pyproject.toml next to
    kb_assets/), or None when kb runs from an installed package."""
    folder = Path(__file__).resolve().parents[2]
    if (folder / "pyproject.toml").exists() and (folder / "kb_assets").is_dir():
        return folder
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_state_path(path: Path, settings: Settings) -> Path:
    """The resolved path, or LoginStatePathRefused when it is in KB_HOME or the repo."""
    resolved = path.expanduser().resolve()
    home = settings.home
    if _inside(resolved, home):
        raise LoginStatePathRefused(
            f"KB_X_STATE={resolved} is inside KB_HOME ({home}). The X login is a secret and must not be "
            "stored with the data. Set KB_X_STATE to a path outside KB_HOME, e.g. ~/.config/kb/state.json."
        )
    root = project_root()
    if root is not None and _inside(resolved, root):
        raise LoginStatePathRefused(
            f"KB_X_STATE={resolved} is inside the kb source tree ({root}). A commit could publish the X login. "
            "Set KB_X_STATE to a path outside the repo, e.g. ~/.config/kb/state.json."
        )
    if resolved.parent in (Path.home().resolve(), Path("/")):
        raise LoginStatePathRefused(
            f"KB_X_STATE={resolved}: the login state needs a folder of its own (kb makes it mode 0700), "
            "e.g. ~/.config/kb/state.json."
        )
    return resolved


def save_login_state(state: dict, settings: Settings) -> Path:
    """Write the storage state to settings.x_state_path: atomic, file 0600,
    folder 0700. Refuses KB_HOME and the repo. Returns the path."""
    path = check_state_path(settings.x_state_path, settings)
    make_private_folder(path.parent)
    # write_atomic writes a mkstemp file (mode 0600 from the start, so the
    # secret is never readable by others, not even for a moment), then renames.
    write_atomic(path, json.dumps(state).encode())
    os.chmod(path, FILE_MODE)
    return path


def has_x_session(state: dict, x_host: str) -> bool:
    return any(
        cookie.get("name") == X_SESSION_COOKIE and is_x_host(str(cookie.get("domain", "")).lstrip("."), x_host)
        for cookie in state.get("cookies", [])
    )


def _wait_for_sign_in(context, settings: Settings) -> None:
    """Return when the owner presses Enter, or when a page reaches /home."""
    pressed = threading.Event()

    def wait_for_enter() -> None:
        try:
            sys.stdin.readline()
        finally:
            pressed.set()

    threading.Thread(target=wait_for_enter, daemon=True).start()
    while not pressed.is_set():
        pages = [p for p in context.pages if not p.is_closed()]
        if not pages:
            raise LoginNotFinished("The browser window was closed before the sign-in finished. Nothing was saved.")
        for page in pages:
            url = urlsplit(page.url)
            if is_x_host(url.hostname or "", settings.x_host) and url.path.rstrip("/") == "/home":
                return
        pages[0].wait_for_timeout(500)


def run_login(settings: Settings) -> Path:
    """Open a headed browser on X, let the owner sign in, save the state."""
    from playwright.sync_api import sync_playwright

    check_state_path(settings.x_state_path, settings)  # refuse before the owner types a password
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise RuntimeError("`kb login` opens a browser window, but there is no display (DISPLAY is not set).")
    try:
        options = chromium_launch_options(settings.chromium_executable(), headless=False)
    except BrowserNotFound as exc:
        raise RuntimeError(str(exc)) from exc
    login_url = settings.kb_x_base_url.rstrip("/") + "/login"
    print(f"A browser opens on {login_url}. Sign in to X there.")
    print("Then press Enter here (kb also goes on when X shows your home timeline).")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**options)
        try:
            context = browser.new_context()
            context.new_page().goto(login_url)
            _wait_for_sign_in(context, settings)
            state = context.storage_state()
        finally:
            browser.close()
    if not has_x_session(state, settings.x_host):
        raise LoginNotFinished(
            f"The browser has no X session cookie ({X_SESSION_COOKIE} for {settings.x_host}): "
            "the sign-in did not finish. Nothing was saved. Run `kb login` again."
        )
    path = save_login_state(state, settings)
    print(f"Saved the X login to {path} (mode 0600). kb never prints it.")
    return path
