"""The secrets that must never leave the machine in the wiki, and the scan
that finds them in a text.

A secret here is the value of a configured key or token (every SecretStr
setting), the password part of the wiki remote's address, and the value of
each cookie of the X login. The wiki goes into the search index, the MCP
server and a remote, so the worker scans every change of the agent before
it commits, and every commit before a push (kb/wiki/repo.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from kb.settings import Settings, get_settings, named_secret_values

# Shorter values would match common words and numbers. Real keys, tokens
# and X's session cookies (auth_token, ct0, twid) are longer.
MIN_SECRET_LENGTH = 8


def guarded_secrets(settings: Settings | None = None) -> dict[str, str]:
    """Each secret value, by a name that a notice may show (never the value)."""
    settings = settings or get_settings()
    found = named_secret_values(settings)
    for cookie, value in x_login_cookies(settings.x_state_path).items():
        found[f"X login cookie {cookie}"] = value
    return {name: value for name, value in found.items() if len(value) >= MIN_SECRET_LENGTH}


def x_login_cookies(path: Path) -> dict[str, str]:
    """The cookies of the X login state file (Playwright's storage state).
    A missing or unreadable file has none."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    cookies = state.get("cookies") if isinstance(state, dict) else None
    return {str(c.get("name")): str(c.get("value")) for c in cookies or []
            if isinstance(c, dict) and c.get("value")}


def secrets_in(text: str, secrets: dict[str, str], *, already: str = "") -> list[str]:
    """The names of the secrets whose value is in `text` and was not in
    `already` (the text before the change)."""
    return sorted(name for name, value in secrets.items() if value in text and value not in already)
