"""The one door to Playwright's private modules (`playwright._impl`).

Every other module of kb uses Playwright's public API (`playwright.sync_api`).
tests/test_browser_room.py checks that no other module of the product
imports `playwright._`, that the hook below is in place, and that the
running driver's environment holds no key. pyproject.toml allows one minor
release of Playwright; try a new one with that test first.

The one private name, and why no public one does its job:

1. `playwright._impl.transport.get_driver_env`: the environment of the
   Playwright driver (the Node.js process between kb and Chromium). The
   driver starts with a copy of os.environ, and Playwright has no option for
   another environment (transport.py, PipeTransport.connect()). The
   resources of kb write their keys into os.environ, so without the hook
   every key reaches the driver. kb cannot take its keys out of os.environ
   for the time of the start: other threads read it. So kb wraps the one
   function that builds the driver's environment.

   The other way, PLAYWRIGHT_NODEJS_PATH (the Node.js that Playwright
   starts) pointing at a launcher that drops the keys, was worse: kb would
   set a variable in os.environ for the whole process, and the keys would
   still reach the launcher's process.

Chromium itself needs no private name: kb gives it its whole environment
with the public launch option `env`, and the room's launcher with
`executable_path` (kb/x/browser_room.py).
"""

from __future__ import annotations

from collections.abc import Callable

from playwright._impl import transport as _transport


def filter_driver_env(keep: Callable[[dict[str, str]], dict[str, str]]) -> None:
    """From now on, the driver's environment is `keep(environment that
    Playwright built)`. A second call changes nothing: the first filter stays."""
    if driver_env_filtered():
        return
    original = _transport.get_driver_env

    def get_driver_env() -> dict:
        return keep(original())

    get_driver_env.kb_allowlist = True  # driver_env_filtered() and the tests look for it
    _transport.get_driver_env = get_driver_env


def driver_env_filtered() -> bool:
    """True when the filter is in place."""
    return bool(getattr(_transport.get_driver_env, "kb_allowlist", False))


def next_driver_env() -> dict[str, str]:
    """The environment that the next driver gets (for tests and `kb status`)."""
    return _transport.get_driver_env()
