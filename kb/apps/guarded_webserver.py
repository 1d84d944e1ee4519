"""dagster-webserver behind kb's guard (kb/apps/owner_guard.py), in the
same process and on the same port.

    python -m kb.apps.guarded_webserver /path/to/dagster-webserver -h 127.0.0.1 -p 3000 -w workspace.yaml

Why in the process: Dagster's webserver has no option for a Host or Origin
check. A proxy in front of it would leave the real webserver on a second
loopback port, and a web page can reach every loopback port. Dagster's
command line ends in `uvicorn.run(app, host=..., port=...)`, and
uvicorn.run builds a `uvicorn.Config` from the app. This module wraps
`uvicorn.Config` before the console script runs, so each server that
uvicorn builds in this process serves Dagster's own app through the guard.
Each answer also carries the frame headers of NoFraming: no page may frame
the UI. Each connection follows kb/apps/connection_rules.py. It uses no
private part of Dagster. If a later Dagster builds its server in another
way, uvicorn.Server refuses a config without the guard and the process
stops: the webserver never runs without the guard.

Like kb.apps.quick_exit, the process skips Python's last garbage collection.
"""

from __future__ import annotations

import sys

from kb.apps.owner_guard import NoFraming, OwnerOnly
from kb.apps.quick_exit import run_console_script


class GuardMissing(RuntimeError):
    pass


def install_guard() -> None:
    """Put the guard around the app of each uvicorn server of this process.
    A second call does nothing."""
    import uvicorn
    import uvicorn.config

    from kb.apps.connection_rules import RuledHTTPProtocol

    original = uvicorn.config.Config
    if getattr(original, "kb_guarded", False):
        return

    class GuardedConfig(original):
        kb_guarded = True

        def __init__(self, app, host: str = "127.0.0.1", port: int = 8000, *args, **kwargs):
            if isinstance(app, str):
                # An import string loads the app later, around the guard: refuse it.
                raise GuardMissing(f"uvicorn got the app {app!r} as an import string; kb cannot guard it.")
            # No page may frame the UI (its launchpad), and the guard's own refusals neither.
            # Each connection follows kb's rules (kb/apps/connection_rules.py).
            kwargs["http"] = RuledHTTPProtocol
            super().__init__(NoFraming(OwnerOnly(app, bound_host=host, port=port)), host, port, *args, **kwargs)

    # uvicorn.run looks up Config in the module uvicorn.main (the name
    # uvicorn.main is the function main: take the module from sys.modules);
    # `from uvicorn import Config` reads the package.
    uvicorn.config.Config = GuardedConfig
    uvicorn.Config = GuardedConfig
    sys.modules["uvicorn.main"].Config = GuardedConfig
    original_server_init = uvicorn.Server.__init__

    def server_init(self, config, *args, **kwargs):
        # The last line of defence: a server whose app has no guard does not start.
        if not getattr(config, "kb_guarded", False):
            raise GuardMissing("a uvicorn server without kb's guard tried to start; "
                               "the Dagster webserver serves only through kb.apps.owner_guard.")
        original_server_init(self, config, *args, **kwargs)

    uvicorn.Server.__init__ = server_init


def main() -> None:
    """Run the dagster-webserver console script in argv[1] with the arguments
    after it: with the lifeline to kb up, as every part, and with the guard."""
    run_console_script(before_run=install_guard)


if __name__ == "__main__":
    main()
