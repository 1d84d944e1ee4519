"""The owner's own browser, for tests: Chromium on the host's network.

kb's browser runs in a room without network (kb/x/browser_room.py), so it
cannot play the browser in which the owner opens the Dagster UI and
`kb web` on loopback, and in which a stranger's page attacks them. This
Chromium runs as the owner's browser does: on the host's network, with
Chromium's own sandbox where it can run (not as root).
"""

from __future__ import annotations

import os


def owner_browser_options(chromium: str | None) -> dict:
    """Playwright's launch options for the owner's browser."""
    options = {"headless": True, "chromium_sandbox": os.geteuid() != 0}
    if chromium:
        options["executable_path"] = chromium
    return options
