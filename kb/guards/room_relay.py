"""The one way out of a room that has no network of its own.

Both bubblewrap rooms of kb (the wiki agent's, kb/wiki/sandbox.py, and the
browser's, kb/x/browser_room.py) run with `--unshare-net`: a new network
namespace that holds only its own loopback. No process in the room reaches
a port of the host's loopback (the Dagster UI on 127.0.0.1:3000 has no
login and launches runs; the code server's gRPC; `kb web`), the local
network, a cloud metadata address or DNS.

The room still needs one way out: the agent's CLI to its model endpoint,
Chromium to kb's fetch-guard proxy. So kb listens on Unix sockets in a
private folder (mode 0700) that the room gets read-only, and a small
program in the room (the relay, relay_program()) listens on the room's
loopback and passes each connection to one of these sockets. A socket that
kb made after the room started is in the room too (a bind mount shows the
folder as it is now).

The relay chooses the socket by the local address of the connection:
`{address}` in the socket path is the room's loopback address that the
client connected to (127.0.0.1 ... 127.255.255.254). So one relay serves
many sockets on one port: the browser gives each of its contexts its own
address and its own proxy. A connection to an address without a socket is
closed.

The relay runs before the room's program: it opens its port, starts its
copy loop in a child process, and then replaces itself with the program
(`execv`). So the port is open before the program starts, and the program
keeps the relay's process id and file descriptors (Playwright talks to
Chromium over fds 3 and 4).
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
from pathlib import Path

from kb.guards.room_binds import SYSTEM_DIRS

RELAY_TEMPLATE = '''# Written by kb (kb/guards/room_relay.py). It runs in a room that has no
# network: it listens on the room's loopback, passes each connection to a
# Unix socket of kb, then replaces itself with the room's program.
import os, socket, sys, threading

address, port, pattern, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5:]
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((address, port))
listener.listen(64)


{pipe}

if os.fork() == 0:
    # The relay holds no file of the program: not its stdin and stdout
    # (the caller waits for their end), not Playwright's pipe (fds 3, 4).
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2 and fd != listener.fileno():
            try:
                os.close(fd)
            except OSError:
                pass
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(pattern.replace("{address}", client.getsockname()[0]))
        except OSError:
            client.close()
            upstream.close()
            continue
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
listener.close()
os.execv(argv[0], argv)
'''


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    for end in (source, target):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def relay_program() -> str:
    """The relay program of a room. It cannot import kb (kb is not in the
    room), so kb writes the one copy of `_pipe` into it."""
    return RELAY_TEMPLATE.replace("{pipe}", inspect.getsource(_pipe))


def relay_python() -> str:
    """The Python that runs the relay: kb's own interpreter (the relay needs
    the standard library only; `-I -S` keeps out the environment and
    site-packages)."""
    return os.path.realpath(sys.executable)


def relay_python_binds() -> list[str]:
    """bwrap arguments that put the relay's Python into the room: nothing
    when it is in the system folders (Debian's, the Docker image's); else
    its installation folder, read-only (pyenv, uv)."""
    if any(Path(sys.base_prefix).is_relative_to(folder) for folder in SYSTEM_DIRS):
        return []
    return ["--ro-bind", sys.base_prefix, sys.base_prefix]


def relay_command(script: str, address: str, port: int, socket_pattern: str) -> list[str]:
    """The command in the room in front of its program (which follows
    `--`): the relay listens on address:port of the room and passes each
    connection to `socket_pattern` (`{address}`: the local address of the
    connection). All paths are the room's."""
    return [relay_python(), "-IS", script, address, str(port), socket_pattern, "--"]
