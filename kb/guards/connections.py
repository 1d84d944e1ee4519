"""The rules for a connection from a process of this machine, one copy for
kb's servers (kb/apps/owner_guard.py, kb/apps/connection_rules.py) and for
the fetch guard's proxy (kb/guards/fetch_guard.py).

Every user of the machine reaches loopback, and neither kb's servers nor
its proxy have a login: only the owner's processes may use them. And a
client must send the head of a request in time: a server that waits for it
without end gives its files and threads to whoever opens connections and
sends nothing (7 December 2026)."""

from __future__ import annotations

import os

from kb.guards.peer_user import peer_uid

# The time for the whole head of a request. A client of this machine sends
# its head at once. A browser can keep a connection that it opened in
# advance a few seconds without a request: it opens a new one if kb closed it.
HEAD_TIMEOUT_S = 10.0


def other_user(client, server) -> int | None:
    """The user id of the process at the client end of a loopback TCP
    connection when it is another user's; None for the owner's processes,
    for a Unix socket (its folder lets only the owner in) and for a client
    that the kernel does not show here (peer_uid)."""
    if not isinstance(client, tuple | list) or not isinstance(server, tuple | list):
        return None
    uid = peer_uid(tuple(client[:2]), tuple(server[:2]))
    return uid if uid is not None and uid != os.getuid() else None


def other_user_refusal(uid: int, server: str) -> str:
    """The reason that `server` gives to a process of user `uid`."""
    return (f"the connection comes from another user of this machine (uid {uid}). {server} answers only its "
            f"owner (uid {os.getuid()}).")
