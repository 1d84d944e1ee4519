"""The stdio channel of kb-mcp on the event loop, without worker threads.

The MCP package reads stdin and writes stdout through anyio's file wrapper:
each line read, each write and each flush is a call on a worker thread. A
profile of kb-mcp showed many such calls and turns of the event loop per
tool call, a large part of a warm search_bookmarks (the figures:
benchmarks/index_and_retrieval.md). When stdin and stdout are pipes or
sockets (an agent client starts the server so), this module reads and
writes them with asyncio's pipe transports on the event loop itself, and
gives them to the package's own stdio_server(), which does the JSON-RPC
framing as before.

The package also moves fd 0 and fd 1 away from the wire while it serves, so
that a library that prints to stdout cannot break the channel. With its own
streams it does not do that, so claim_wire() does the same here.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from contextlib import contextmanager

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

# A JSON-RPC message is one line. asyncio's reader stops at 64 KiB per line
# by default; a client may send more (a long query, a large result of a
# sampling call), so the limit is high.
LINE_LIMIT = 64 * 1024 * 1024


def pipes_on_both_ends() -> bool:
    """True when fd 0 and fd 1 are pipes or sockets. asyncio's pipe
    transports make the descriptor non-blocking: on a terminal that would also
    change stderr (the same terminal), and a regular file is not supported."""
    try:
        return all(_pipe_or_socket(os.fstat(fd).st_mode) for fd in (0, 1))
    except OSError:
        return False


def _pipe_or_socket(mode: int) -> bool:
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextmanager
def claim_wire():
    """Private copies of fd 0 and fd 1 for the channel; fd 0 reads the null
    device and fd 1 writes to stderr until the end. Why: a library that
    prints to stdout (or reads stdin) would break the JSON-RPC stream."""
    sys.stdout.flush()
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        sys.stdout.flush()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


class LineReader:
    """The async line iterator that stdio_server() reads (as anyio's file
    wrapper gives it): str lines, the end of the pipe ends the iteration."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> LineReader:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class LineWriter:
    """The async write and flush that stdio_server() calls. A write goes into
    the transport's buffer; flush waits until the pipe takes it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()


async def open_pipes(wire_in: int, wire_out: int) -> tuple[LineReader, LineWriter]:
    """Streams on the event loop of this task for the two descriptors."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        os.fdopen(wire_out, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return LineReader(reader), LineWriter(writer)


def serve_stdio(server: MCPServer) -> None:
    """Serve `server` on stdin and stdout until the client closes stdin: on
    the event loop when both are pipes or sockets, else with the MCP
    package's own transport (a terminal, a file)."""
    lowlevel = getattr(server, "_lowlevel_server", None)  # mcp 2.x gives it no public name
    if lowlevel is None or not pipes_on_both_ends():
        server.run("stdio")
        return

    async def serve() -> None:
        with claim_wire() as (wire_in, wire_out):
            stdin, stdout = await open_pipes(wire_in, wire_out)
            async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
                await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())

    anyio.run(serve)
