"""kb-mcp's stdio channel (mcp_server/stdio_channel.py), with a real MCP client.

A small MCP server runs as a subprocess through serve_stdio(): the same
channel as kb-mcp, without the index, so that the tests do not wait for a
model. The client is the MCP package's own stdio client (pipes on both ends).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

pytestmark = pytest.mark.slow  # slow: kb or a server in another process

REPO = Path(__file__).resolve().parents[1]

SERVER = textwrap.dedent("""
    import os, sys
    from mcp.server.mcpserver import MCPServer
    from mcp_server.stdio_channel import pipes_on_both_ends, serve_stdio

    server = MCPServer("pipes-test")

    @server.tool()
    def length(text: str) -> int:
        return len(text)

    @server.tool()
    def noisy() -> str:
        # A library that prints: the line must not reach the channel.
        print("stray line on stdout", flush=True)
        os.write(1, b"stray bytes on fd 1\\n")
        return "ok"

    print(f"pipes on both ends: {pipes_on_both_ends()}", file=sys.stderr, flush=True)
    serve_stdio(server)
    print("served to the end", file=sys.stderr, flush=True)
""")


@pytest.fixture()
def server_script(tmp_path: Path) -> Path:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    return script


async def _session_calls(script: Path, errlog: Path, calls: list[tuple[str, dict]]) -> list:
    params = StdioServerParameters(command=sys.executable, args=[str(script)], cwd=str(REPO),
                                   env={"PYTHONPATH": str(REPO)})
    stray: list[Exception] = []

    async def on_message(message) -> None:
        if isinstance(message, Exception):
            stray.append(message)

    with errlog.open("w") as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                await session.initialize()
                results = [await session.call_tool(name, args) for name, args in calls]
    assert not stray, f"lines on the channel that are not MCP messages: {stray}"
    return results


def test_the_channel_on_pipes(server_script: Path, tmp_path: Path):
    """One session (a server start costs about 3 s): plain calls, a line
    longer than asyncio's default limit of 64 KiB, and a tool that prints to
    stdout, whose lines must go to stderr, not to the channel."""
    errlog = tmp_path / "stderr.txt"
    calls = [("length", {"text": "abc"}), ("length", {"text": "x" * 300_000}), ("noisy", {}),
             ("length", {"text": "ab"})]
    results = asyncio.run(_session_calls(server_script, errlog, calls))
    assert [r.structured_content for r in results] == [{"result": 3}, {"result": 300_000}, {"result": "ok"},
                                                        {"result": 2}]
    err = errlog.read_text()
    assert "pipes on both ends: True" in err
    assert "stray line on stdout" in err and "stray bytes on fd 1" in err


def _request(message_id: int, method: str, params: dict | None = None) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": message_id, "method": method, "params": params or {}}) + "\n"


INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {},
              "clientInfo": {"name": "test", "version": "1"}}


def test_the_server_ends_when_the_client_closes_stdin(server_script: Path):
    process = subprocess.Popen([sys.executable, str(server_script)], cwd=REPO, env={"PYTHONPATH": str(REPO)},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(_request(1, "initialize", INITIALIZE), timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out.splitlines()[0])["result"]["serverInfo"]["name"] == "pipes-test"
    assert "served to the end" in err


def test_a_file_on_stdin_uses_the_package_transport(server_script: Path, tmp_path: Path):
    # asyncio's pipe transports refuse a regular file: the package's own
    # transport serves it.
    requests = tmp_path / "requests.jsonl"
    requests.write_text(_request(1, "initialize", INITIALIZE))
    with requests.open() as stdin:
        done = subprocess.run([sys.executable, str(server_script)], cwd=REPO, env={"PYTHONPATH": str(REPO)},
                              stdin=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pipes on both ends: False" in done.stderr
    assert json.loads(done.stdout.splitlines()[0])["result"]["serverInfo"]["name"] == "pipes-test"
