"""Rules for each connection to kb's HTTP servers (kb web and the Dagster
UI), before any request comes in. The owner guard (kb/apps/owner_guard.py)
reads requests; these rules hold for the connection itself.

Why: uvicorn reads the head of a request for as long as the client sends
it, and it accepts connections without limit. 1,100 connections that each
sent half a head held a server's 1,024 files for more than 60 s, and the
owner's own request was refused (connection reset; 7 December 2026). Every
user of the machine reaches loopback, and the owner guard answers another
user only after a whole request.

The rules:
1. The head of each request must come in within HEAD_TIMEOUT_S, from the
   start of the connection or from the end of the last answer. Else kb
   closes the connection. uvicorn's keep-alive timeout (5 s) holds only
   until the first byte of the next request.
2. Another user of the machine holds at most MAX_STRANGER_CONNECTIONS
   connections at a time to the servers of a process. kb closes the next
   ones at once. The owner's processes have no limit: they are the owner.

How: uvicorn takes the class of its HTTP protocol as a public option
(`http=`). kb extends the class that uvicorn chooses by itself
(httptools, else h11) and uses four of its names: `loop`, `transport`,
`cycle` and `on_response_complete`. pyproject.toml allows one minor
release of uvicorn; tests/test_connection_rules.py checks the rules on
the real server.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from kb.guards.connections import HEAD_TIMEOUT_S, other_user
from kb.guards.rare_warning import RareWarning

# At most one warning a minute: an attack must not fill the log.
warn = RareWarning(logging.getLogger(__name__))

# Another user gets the guard's 403 answer, which names the reason; it needs
# no more connections than a browser opens to one server (6).
MAX_STRANGER_CONNECTIONS = 8


class RuledHTTPProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
    """uvicorn's HTTP protocol with the two rules of this module."""

    # Per process: the count of all the servers in it.
    strangers: ClassVar[int] = 0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._stranger = False
        self._head_timer = None
        uid = other_user(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
        if uid is not None:
            if RuledHTTPProtocol.strangers >= MAX_STRANGER_CONNECTIONS:
                _closed(transport, f"user {uid} of this machine holds {MAX_STRANGER_CONNECTIONS} connections")
                return
            RuledHTTPProtocol.strangers += 1
            self._stranger = True
        self._waiting_since = self.loop.time()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._check_head)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._stranger:
            RuledHTTPProtocol.strangers -= 1
            self._stranger = False
        super().connection_lost(exc)

    def _check_head(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # closed, or a WebSocket now (it has its own protocol)
        waiting_for_head = self.cycle is None or self.cycle.response_complete
        if not waiting_for_head:
            # A request runs: its head came in. Look again after it.
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._check_head)
            return
        waited = self.loop.time() - self._waiting_since
        if waited >= HEAD_TIMEOUT_S:
            _closed(self.transport, f"no whole request head in {HEAD_TIMEOUT_S:g} s")
            return
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S - waited, self._check_head)


def _closed(transport, why: str) -> None:
    transport.close()
    warn("kb closed a connection from %s: %s", transport.get_extra_info("peername"), why)
