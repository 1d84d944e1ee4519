"""kb up's watchdog tells the owner when the daemon or the stuck check stops
while its process lives (kb/apps/watchdog.py): once per stop."""

from __future__ import annotations

from datetime import datetime, timezone

import dagster as dg

from kb.apps.watchdog import DAEMON_SILENT_S, FIRST_LOOK_S, LOOK_EVERY_S, STUCK_CHECK_SILENT_S, Watchdog
from kb.store.beats import STUCK_CHECK, last_beat, note_beat

START = 1_000_000.0


def test_each_stop_is_told_once_and_again_after_it_worked(kb_home):
    beats = {"daemon": START}
    told = []
    dog = Watchdog(lambda: datetime.fromtimestamp(beats["daemon"], timezone.utc), kb_home,
                   lambda what, text: told.append((what, text)), started=START)
    note_beat(kb_home, STUCK_CHECK, now=START)
    assert dog.look(START + 1) == []  # kb up has just started: no look yet
    now = START + FIRST_LOOK_S
    beats["daemon"] = now - 20
    note_beat(kb_home, STUCK_CHECK, now=now - 60)
    assert dog.look(now) == []  # both work
    # The daemon's process lives, but it writes no heartbeat, and no sensor ticks.
    now += max(DAEMON_SILENT_S, STUCK_CHECK_SILENT_S) + LOOK_EVERY_S
    assert dog.look(now) == ["daemon", "stuck-check"]
    assert "The Dagster daemon stopped: no heartbeat for" in told[0][1]
    assert told[1][1].startswith("The stuck check (stuck_steps_sensor) stopped")
    assert dog.look(now + LOOK_EVERY_S) == []  # told once
    # Both work again; a later stop of the stuck check alone is told again.
    now += 2 * LOOK_EVERY_S
    beats["daemon"] = now
    note_beat(kb_home, STUCK_CHECK, now=now)
    assert dog.look(now) == []
    now += STUCK_CHECK_SILENT_S + LOOK_EVERY_S
    beats["daemon"] = now
    assert dog.look(now) == ["stuck-check"]
    assert len(told) == 3


def test_the_stuck_check_writes_its_beat_at_each_tick(kb_home):
    from sensors.stuck_steps import stuck_steps_sensor

    assert last_beat(kb_home, STUCK_CHECK) is None
    with dg.DagsterInstance.ephemeral() as instance:
        stuck_steps_sensor(dg.build_sensor_context(instance=instance))
    assert last_beat(kb_home, STUCK_CHECK) is not None
