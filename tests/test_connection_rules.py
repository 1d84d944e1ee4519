"""The rules of each connection to kb's HTTP servers (kb/apps/connection_rules.py),
played by an attacker on the real uvicorn server: clients that send half a
head, and another user of the machine who opens many connections."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from urllib.parse import urlsplit

import httpx
import pytest

import kb.apps.connection_rules as rules
from tests.loopback import serve_asgi


async def slow_app(scope, receive, send):
    """Answers "ok"; /slow answers after 1.5 s, longer than the test's head timeout."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(1.5)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain"),
                                                                           (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(rules, "HEAD_TIMEOUT_S", 1.0)
    with serve_asgi(slow_app, "the test app") as url:
        yield urlsplit(url)


def half_heads(address, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        client = socket.create_connection((address.hostname, address.port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no empty line: the head never ends
        sockets.append(client)
    return sockets


def closed_by_server(client: socket.socket, within_s: float) -> bool:
    client.settimeout(within_s)
    try:
        return client.recv(100) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_head_that_does_not_come_in_closes_its_connection(server):
    """Uvicorn waited for a head as long as the client sent nothing more:
    1,100 such connections held all the 1,024 files of a server for more
    than 60 s, and the owner's request was reset. Now each goes after the
    head timeout; the owner is answered meanwhile."""
    attackers = half_heads(server, 30)
    try:
        assert httpx.get(f"http://{server.netloc}/", timeout=5).text == "ok"
        started = time.monotonic()
        assert all(closed_by_server(client, 3.0) for client in attackers)
        assert time.monotonic() - started < 3.0
    finally:
        for client in attackers:
            client.close()


def test_a_second_head_sent_slowly_after_an_answer_is_cut_but_a_long_answer_is_not(server):
    """Keep-alive: uvicorn's own timeout stops at the first byte of the next
    request, so a client could trickle its second head for ever. A request
    whose answer takes longer than the head timeout is answered whole."""
    with socket.create_connection((server.hostname, server.port)) as client:
        client.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        client.settimeout(5)
        answer = b""
        while not answer.endswith(b"ok"):
            part = client.recv(1000)
            assert part, answer  # the server closed the connection before its answer
            answer += part
        assert answer.startswith(b"HTTP/1.1 200")
        client.sendall(b"GET / HTTP/1.1\r\n")
        for _ in range(4):  # a byte each 0.4 s: the connection is never idle for uvicorn
            time.sleep(0.4)
            try:
                client.sendall(b"X")
            except OSError:
                break
        assert closed_by_server(client, 3.0)


ATTACKER = """
import socket, sys, time
port = int(sys.argv[1])
clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
time.sleep(0.5)
open_ = 0
for client in clients:
    client.setblocking(False)
    try:
        open_ += client.recv(10) != b""
    except BlockingIOError:
        open_ += 1
    except OSError:
        pass
print(open_, flush=True)
sys.stdin.read()  # holds the connections until the test lets go
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv needs root to act as another user")
def test_another_user_holds_at_most_eight_connections(monkeypatch):
    """As `nobody`, 20 connections: 8 stay open (the owner guard answers
    them with its 403), the server closes the others at once. The owner's
    own connections have no such limit."""
    monkeypatch.setattr(rules, "HEAD_TIMEOUT_S", 30.0)  # the limit holds, not the timeout
    with serve_asgi(slow_app, "the test app") as url:
        port = urlsplit(url).port
        attacker = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                     "/usr/bin/python3", "-c", ATTACKER, str(port)], cwd="/", text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            # 20 connections, of which this many stay open ("" if the attacker failed: see its stderr below)
            still_open = attacker.stdout.readline().strip()
            assert still_open == str(rules.MAX_STRANGER_CONNECTIONS)
            owners = half_heads(urlsplit(url), 20)
            try:
                time.sleep(0.3)
                assert not any(closed_by_server(client, 0.001) for client in owners)
                assert httpx.get(f"{url}/", timeout=5).text == "ok"
            finally:
                for client in owners:
                    client.close()
        finally:
            _, errors = attacker.communicate("", timeout=10)
            assert attacker.returncode == 0, errors
        # The attacker's connections are gone: the count is free again.
        deadline = time.monotonic() + 5
        while rules.RuledHTTPProtocol.strangers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rules.RuledHTTPProtocol.strangers == 0


def test_kb_web_serves_with_the_rules(monkeypatch):
    """`kb web` gives uvicorn kb's protocol (the Dagster UI: tests/test_control_plane.py)."""
    from types import SimpleNamespace

    import uvicorn

    from kb.apps.web import app as web_app

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(options))
    monkeypatch.setattr(web_app, "create_app", lambda *args, **kwargs: SimpleNamespace(state=SimpleNamespace()))
    monkeypatch.setattr(web_app, "start_search_service", lambda app: None)
    web_app.serve(port=1)
    assert seen["http"] is rules.RuledHTTPProtocol


def test_a_flood_of_closed_connections_writes_one_warning_a_minute(caplog):
    """An attacker repeats the event at will: 1,000 closed connections give
    one log line; the next line, after the interval, counts the rest."""
    import logging

    from kb.guards.rare_warning import RareWarning

    warn = RareWarning(logging.getLogger("kb.test.rare"), interval_s=0.2)
    caplog.set_level(logging.WARNING, logger="kb.test.rare")
    for n in range(1000):
        warn("closed connection %d", n)
    assert [r.getMessage() for r in caplog.records] == ["closed connection 0 (1 such events since the last warning)"]
    time.sleep(0.25)
    warn("closed connection %d", 1000)
    assert caplog.records[-1].getMessage() == "closed connection 1000 (1000 such events since the last warning)"
