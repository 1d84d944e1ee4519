"""A warning for an event that an attacker can repeat at will (a connection
that kb closes or refuses): at most one log line per interval, with the
count of events since the last line. A flood must not fill the log."""

from __future__ import annotations

import logging
import threading
import time


class RareWarning:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0):
        self.logger = logger
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._count = 0
        self._last = float("-inf")

    def __call__(self, message: str, *args) -> None:
        """Count the event; write `message % args` with the count when the
        last line is older than the interval."""
        with self._lock:
            self._count += 1
            now = time.monotonic()
            if now - self._last < self.interval_s:
                return
            count, self._count, self._last = self._count, 0, now
        self.logger.warning(message + " (%d such events since the last warning)", *args, count)
