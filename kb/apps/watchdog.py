"""The watchdog of `kb up`: it tells the owner when the Dagster daemon or
the stuck check stops (the owner's specification: a watchdog of the daemon
and of the sweeper).

kb up already tells the owner when a part's process dies. This watchdog
covers what a living process can hide:
- the daemon: its process lives, but it writes no heartbeat (it hangs, or
  its storage fails). Then no sensor, schedule, run queue or run retry works;
- the stuck check (sensors/stuck_steps.py): the daemon runs, but the sensor
  does not tick (it was stopped in the UI, or each tick fails). Then a
  wedged try holds the wiki's pool for ever. The sensor writes the time of
  each tick into KB_HOME/run/stuck-check.beat (kb/store/beats.py); the
  watchdog reads its age.

One notice per stop; after the part works again, a new stop gets a new
notice. The first look waits FIRST_LOOK_S: the code server and the daemon
need minutes to start on two busy cores.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from kb.store.beats import STUCK_CHECK, last_beat

# Dagster's daemon writes a heartbeat about every 20 s.
DAEMON_SILENT_S = 300.0
# The stuck check ticks every 60 s (its minimum_interval_seconds).
STUCK_CHECK_SILENT_S = 600.0
FIRST_LOOK_S = 600.0
LOOK_EVERY_S = 60.0


def silent_parts(heartbeat: Callable[[], datetime | None], home: Path, now: float) -> dict[str, str]:
    """{what: the notice} for each watched part that has stopped."""
    found = {}
    beat = heartbeat()
    if beat is None or now - beat.timestamp() > DAEMON_SILENT_S:
        since = "no heartbeat" if beat is None else f"no heartbeat for {(now - beat.timestamp()) / 60:.0f} minutes"
        found["daemon"] = (f"The Dagster daemon stopped: {since}. Sensors, schedules, the run queue and the "
                           "stuck check do not run, so no new source moves. Read the daemon's log in "
                           "KB_HOME/logs, and start kb up again.")
    checked = last_beat(home, STUCK_CHECK)
    if checked is None or now - checked > STUCK_CHECK_SILENT_S:
        since = "it has not run" if checked is None else f"its last run was {(now - checked) / 60:.0f} minutes ago"
        found["stuck-check"] = (f"The stuck check (stuck_steps_sensor) stopped: {since}. A try that hangs is not "
                                "stopped, and it holds the wiki for ever. Start the sensor in the Dagster UI "
                                "(Automation), or read the daemon's log.")
    return found


class Watchdog:
    """Looks at the daemon and the stuck check every LOOK_EVERY_S, and tells
    each stop once through `tell(what, text)`."""

    def __init__(self, heartbeat: Callable[[], datetime | None], home: Path, tell: Callable[[str, str], None],
                 started: float | None = None):
        self.heartbeat, self.home, self.tell = heartbeat, home, tell
        self.next_look = (time.time() if started is None else started) + FIRST_LOOK_S
        self.told: set[str] = set()

    def look(self, now: float | None = None) -> list[str]:
        """Look if it is time; returns what it told now."""
        now = time.time() if now is None else now
        if now < self.next_look:
            return []
        self.next_look = now + LOOK_EVERY_S
        try:
            silent = silent_parts(self.heartbeat, self.home, now)
        except Exception as exc:  # the instance cannot be read: that is a stop of the daemon's storage too
            silent = {"daemon": f"kb up cannot read the Dagster instance: {type(exc).__name__}: {exc}"}
        told = []
        for what, text in silent.items():
            if what not in self.told:
                self.tell(what, text)
                told.append(what)
        self.told = set(silent)  # a part that works again can be told again
        return told
