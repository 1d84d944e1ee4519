"""The search service: kb-mcp's tools on a Unix socket, in a process that
holds the query model and the passages once (`kb web`, which `kb up` runs).

Why: an agent client starts one kb-mcp per session. A kb-mcp that loads the
model, the libraries and the passages costs more than a hundred MB per
client (benchmarks/index_and_retrieval.md). When the service runs, kb-mcp is a thin
relay between its stdio and this socket (mcp_server/front.py): each
connection is one MCP session of the same server (build_server()), with the
same tools and answers.

The socket is $KB_HOME/run/mcp.sock. Only the owner may use it, by an
allowlist of one user:
- the folder is made with mode 0700 and the socket gets mode 0600;
- each connection must come from a process of the user that runs the
  service (SO_PEERCRED); the service closes any other connection before it
  reads a byte.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import struct
import threading
from pathlib import Path

import anyio
from mcp.server.stdio import stdio_server

from mcp_server.stdio_channel import LINE_LIMIT, LineReader, LineWriter

log = logging.getLogger("kb.mcp.service")

# The longest path that a Unix socket address holds on Linux (108 bytes with
# the final zero byte).
MAX_SOCKET_PATH = 107


class ServiceError(RuntimeError):
    """The service cannot listen on its socket."""


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def private_folder(folder: Path) -> None:
    """Make the socket's folder, owned by this user, mode 0700. Raise
    ServiceError when it exists with another owner or with access for
    others: a socket there could be replaced."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = folder.lstat()
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
        raise ServiceError(f"{folder} is not a folder of this user: the search service does not use it")
    if status.st_mode & 0o077:
        os.chmod(folder, 0o700)


def socket_answers(path: Path) -> bool:
    """True when a process listens on the socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def bind_socket(path: Path) -> socket.socket:
    """A listening socket at `path`, mode 0600. A socket file that no process
    answers on is left from a service that stopped: it is replaced. Raise
    ServiceError when another service answers there."""
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH:
        raise ServiceError(f"the socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
    private_folder(path.parent)
    if path.exists() or path.is_symlink():
        if socket_answers(path):
            raise ServiceError(f"another search service answers on {path}")
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # the socket file is born 0600
    try:
        server.bind(str(path))
    finally:
        os.umask(old_mask)
    os.chmod(path, 0o600)
    server.listen(16)
    server.setblocking(False)
    return server


class Service:
    """A running search service: close() removes its socket file, when it is
    still the one that this service made (a newer service may have replaced
    it). kb's commands end with os._exit (kb/apps/quick_exit.py), so no
    exit hook would run: the caller closes the service."""

    def __init__(self, path: Path, thread: threading.Thread):
        self.path, self.thread = path, thread
        self._inode = path.stat().st_ino

    def close(self) -> None:
        try:
            if self.path.is_socket() and self.path.stat().st_ino == self._inode:
                self.path.unlink()
        except OSError:
            pass


def start_service(path: Path, make_server) -> Service:
    """Serve MCP sessions of make_server() on the socket at `path`, on a
    thread of its own (its own event loop). Raise ServiceError when the
    socket cannot be made."""
    listener = bind_socket(path)
    mcp = make_server()
    lowlevel = mcp._lowlevel_server  # mcp 2.x gives it no public name (as stdio_channel.py)
    own_uid = os.getuid()

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("socket")
        try:
            uid = peer_uid(peer)
        except OSError:
            uid = -1
        if uid != own_uid:
            log.warning("The search service refused a connection of user id %s (it serves user id %s only)",
                        uid, own_uid)
            writer.close()
            return
        try:
            async with stdio_server(stdin=LineReader(reader), stdout=LineWriter(writer)) as (read, write):
                await lowlevel.run(read, write, lowlevel.create_initialization_options())
        except (ConnectionError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the client went away
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_unix_server(session, sock=listener, limit=LINE_LIMIT)
        async with server:
            await server.serve_forever()

    def run() -> None:
        asyncio.run(serve())

    thread = threading.Thread(target=run, name="kb-mcp-service", daemon=True)
    thread.start()
    log.info("The search service serves kb-mcp sessions on %s", path)
    return Service(path, thread)
