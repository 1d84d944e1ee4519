"""`kb-mcp`: a thin relay to the search service when it runs, else the
whole MCP server in this process.

An agent client starts one kb-mcp per session. When the search service runs
(`kb web`, which `kb up` starts: mcp_server/service.py), kb-mcp copies the
bytes between its stdin and stdout and the service's Unix socket, and loads
no model, no index and no MCP package: the service holds them once for all
clients (the memory per client: benchmarks/index_and_retrieval.md). The
service runs the same tools, so
the answers are the same. When no service answers, kb-mcp serves alone, as
before (mcp_server/server.py).

The relay connects only to a socket that this user owns, in a folder that
this user owns and that no other user can write: else another user could
put a socket of their own there and read the agent's queries.

The settings of the service apply to a relayed session (its KB_HOME is the
same: the socket is in it).
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
from pathlib import Path

CHUNK = 1 << 16


def _say(message: str) -> None:
    # stdout is the MCP channel: messages go to stderr only.
    print(message, file=sys.stderr, flush=True)


def safe_socket(path: Path) -> bool:
    """True when `path` is a socket of this user in a folder of this user
    that no other user can write (see the module text)."""
    try:
        folder, entry = path.parent.lstat(), path.lstat()
    except OSError:
        return False
    uid = os.getuid()
    return (stat.S_ISDIR(folder.st_mode) and folder.st_uid == uid and not folder.st_mode & 0o022
            and stat.S_ISSOCK(entry.st_mode) and entry.st_uid == uid)


def connect_service(path: Path) -> socket.socket | None:
    """A connection to the search service, or None when none answers or
    its socket is not safe to use."""
    if not path.exists():
        return None
    if not safe_socket(path):
        _say(f"kb-mcp: the socket {path} is not a socket of this user in a private folder: it is not used")
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None  # a socket left by a service that stopped
    return sock


def relay(sock: socket.socket, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Copy stdin to the socket and the socket to stdout until the service
    ends the session. 0 when the client ended it (closed stdin), 1 when the
    service went away first."""
    client_done = threading.Event()

    def upstream() -> None:
        try:
            while data := os.read(stdin_fd, CHUNK):
                sock.sendall(data)
        except OSError:
            pass
        client_done.set()
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, name="kb-mcp-upstream", daemon=True).start()
    try:
        while data := sock.recv(CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(stdout_fd, view):]
    except OSError:
        pass
    finally:
        sock.close()
    if client_done.is_set():
        return 0
    _say("kb-mcp: the search service closed the session (did kb web stop?). Start the session again.")
    return 1


def main() -> None:
    """The console command `kb-mcp`."""
    from kb.store.private_files import private_process
    from kb.settings import get_settings

    private_process()  # what it writes in KB_HOME is the owner's only (kb/store/private_files.py)

    path = get_settings().mcp_socket
    sock = connect_service(path)
    if sock is None:
        from mcp_server.server import main as serve_alone

        serve_alone()
        return
    _say(f"kb-mcp relays to the search service at {path}")
    sys.exit(relay(sock))


if __name__ == "__main__":
    main()
