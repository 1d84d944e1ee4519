"""kb-mcp as a thin relay to the search service (mcp_server/front.py and
mcp_server/service.py), through real processes.

`kb web` runs as a subprocess on a small real LanceDB index (hash
embedder, so no model loads) and serves kb-mcp's tools on its Unix socket.
Each kb-mcp is the console command, spoken to over its stdin and stdout with
JSON-RPC, as an agent client does. The attacker tests plant a socket of
their own, and connect as another user."""

from __future__ import annotations

import json
import os
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.loopback import free_port

from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.index.search import search
from kb.settings import Settings
from mcp_server.front import relay, safe_socket
from mcp_server.service import ServiceError, bind_socket

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The other user cannot run the venv's interpreter (it lies under /root).
SYSTEM_PYTHON = "/usr/bin/python3"
T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
TOPICS = ["rust borrow checker and lifetimes", "sourdough starter and the loaf", "kubernetes operators reconcile",
          "vector database index build", "espresso grind size and pressure"]


def corpus() -> list[dict]:
    rows = []
    for number in range(40):
        tweet_id = str(1000 + number)
        url = f"https://x.com/user{number % 4}/status/{tweet_id}"
        rows.append({"chunk_id": f"{tweet_id}-post-0", "tweet_id": tweet_id, "url": url,
                     "author": f"user{number % 4}", "created_at": T0 + timedelta(days=number), "source": "post",
                     "ref": url, "position": 0, "text": f"Note {number}: {TOPICS[number % len(TOPICS)]}"})
    return rows


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    return {**env, "KB_HOME": str(home), "KB_EMBED_BACKEND": "hash", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("front") / "h"
    settings = Settings(kb_home=home)
    index = ChunkIndex.from_settings(settings)
    rows = corpus()
    index.replace_chunks(sorted({r["tweet_id"] for r in rows}), rows,
                         Embedder.from_settings(backend="hash", cache_dir=str(settings.lancedb_dir)))
    return home


@pytest.fixture(scope="module")
def service(home):
    """`kb web` on a free port; yields its process once its socket answers."""
    web = subprocess.Popen([str(BIN / "kb"), "web", "--port", str(free_port())], env=env_for(home),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sock_path = Settings(kb_home=home).mcp_socket
    deadline = time.monotonic() + 120
    while not _answers(sock_path):
        assert web.poll() is None, f"kb web stopped: {web.stderr.read()}"
        assert time.monotonic() < deadline, "kb web did not open its socket in 120 s"
        time.sleep(0.1)
    yield web
    if web.poll() is None:
        web.terminate()
        web.wait(20)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class Client:
    """kb-mcp (the console command) over its stdin and stdout."""

    def __init__(self, home: Path):
        self.process = subprocess.Popen([str(BIN / "kb-mcp")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env_for(home), text=True, bufsize=1)
        self.log: list[str] = []
        self._ident = 0
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        for line in self.process.stderr:
            self.log.append(line.rstrip())

    def rpc(self, method: str, params: dict) -> dict:
        self._ident += 1
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self._ident, "method": method,
                                             "params": params}) + "\n")
        self.process.stdin.flush()
        while True:
            line = self.process.stdout.readline()
            assert line, f"kb-mcp closed its stdout; its log: {self.log}"
            message = json.loads(line)
            if message.get("id") == self._ident:
                return message

    def start(self) -> Client:
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "test", "version": "1"}})
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        self.process.stdin.flush()
        return self

    def search(self, query: str, **arguments) -> dict:
        answer = self.rpc("tools/call", {"name": "search_bookmarks", "arguments": {"query": query, **arguments}})
        assert not answer["result"].get("isError"), answer
        return answer["result"]["structuredContent"]

    def close(self) -> int:
        self.process.stdin.close()
        return self.process.wait(20)


def in_process_ids(home: Path, query: str, **filters) -> list[str]:
    """The hits of the in-process search, as search_bookmarks searches by
    default: the deep search."""
    settings = Settings(kb_home=home)
    index = ChunkIndex.from_settings(settings)
    embedder = Embedder.from_settings(backend="hash", cache_dir=str(settings.lancedb_dir))
    return [h.tweet_id for h in search(query, index=index, embedder=embedder, rerank=True, **filters).hits]


def mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.slow  # a `kb-mcp` process, and a `kb web` for the first two
def test_kb_mcp_relays_to_the_service_and_loads_no_index(home, service):
    """Two agent clients at once: each kb-mcp relays to kb web, gets the
    answers of the in-process search, and maps no Lance or ONNX library
    (the service holds them). When the client closes stdin, kb-mcp ends
    with 0."""
    first, second = Client(home).start(), Client(home).start()
    try:
        for client in (first, second):
            for query, filters in (("borrow checker", {}), ("sourdough loaf", {"author": "user1"})):
                answer = client.search(query, **filters)
                assert [h["tweet_id"] for h in answer["hits"]] == in_process_ids(home, query, **filters)
                assert answer["hits"], query
                assert answer["search_mode"] == "deep"
        assert any("relays to the search service" in line for line in first.log), first.log
        maps = mapped_files(first.process.pid)
        assert "/lance/" not in maps and "onnxruntime" not in maps and "pyarrow" not in maps
    finally:
        assert first.close() == 0
        assert second.close() == 0


@pytest.mark.slow  # a `kb-mcp` process, and a `kb web` for the first two
def test_kb_mcp_serves_alone_when_the_service_stopped(home, service, tmp_path):
    """kb web stops (kb up ended): its socket goes, and a new kb-mcp serves
    the index itself, with the same answers. A session that relayed when the
    service stopped ends with a message and exit code 1."""
    relayed = Client(home).start()
    relayed.search("kubernetes operators")
    service.terminate()
    service.wait(20)
    assert relayed.process.wait(20) == 1
    assert any("search service closed the session" in line for line in relayed.log)
    assert not Settings(kb_home=home).mcp_socket.exists(), "kb web left its socket behind"
    alone = Client(home)
    try:
        answer = alone.start().search("espresso grind")
        assert [h["tweet_id"] for h in answer["hits"]] == in_process_ids(home, "espresso grind")
        assert any("kb-mcp serves" in line for line in alone.log), alone.log
        assert not any("relays" in line for line in alone.log)
    finally:
        alone.close()


# --- attackers ------------------------------------------------------------------------
class Listener:
    """A socket that an attacker planted: it records every byte it gets."""

    def __init__(self, path: Path):
        self.received = b""
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.sock.settimeout(0.2)
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(0.2)
            while not self.done.is_set():
                try:
                    data = conn.recv(4096)
                except OSError:
                    continue
                if not data:
                    break
                self.received += data

    def close(self) -> None:
        self.done.set()
        self.sock.close()


@pytest.mark.slow  # a `kb-mcp` process, and a `kb web` for the first two
@pytest.mark.parametrize("planted", ["folder_open_to_all", "socket_of_another_user"])
def test_kb_mcp_never_relays_to_a_socket_that_another_user_can_plant(tmp_path, planted):
    """The queries of the agent must not reach another user's socket: kb-mcp
    relays only to a socket of this user in a folder that only this user can
    write. Else it serves alone, and the planted socket gets no byte."""
    home = tmp_path / "h"
    settings = Settings(kb_home=home)
    run = settings.mcp_socket.parent
    run.mkdir(parents=True)
    listener = Listener(settings.mcp_socket)
    if planted == "folder_open_to_all":
        os.chmod(run, 0o777)
    else:
        if os.getuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chmod(run, 0o700)
        os.chown(settings.mcp_socket, 65534, 65534)
    assert not safe_socket(settings.mcp_socket)
    client = Client(home)
    try:
        answer = client.start().search("anything at all")
        assert answer["count"] == 0 and "empty" in answer["note"]  # served alone: this home has no index
        assert any("is not used" in line for line in client.log), client.log
    finally:
        client.close()
        listener.close()
    assert listener.received == b""


def test_the_service_closes_a_connection_of_another_user(tmp_path):
    """A process of another user that reaches the socket (here the socket is
    opened to all on purpose) gets no answer: the service checks the peer's
    user id before it reads a byte."""
    if os.getuid() != 0 or not Path(SYSTEM_PYTHON).is_file():
        pytest.skip(f"a process of another user needs root and {SYSTEM_PYTHON}")
    from mcp_server.server import build_server
    from mcp_server.service import start_service

    # A folder that the other user can reach (pytest's folders are private).
    folder = Path(tempfile.mkdtemp(prefix="kb-service-"))
    path = folder / "run" / "mcp.sock"
    service = start_service(path, build_server)
    os.chmod(folder, 0o755)
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o666)
    attacker = textwrap_script(path)
    done = subprocess.run([SYSTEM_PYTHON, "-c", attacker], capture_output=True, text=True, timeout=30,
                          user=65534, group=65534, env={"PYTHONPATH": ""})
    service.close()
    shutil.rmtree(folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed without an answer"


def textwrap_script(path: Path) -> str:
    message = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                          "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "x", "version": "1"}}})
    # The service may close before the message is sent (a broken pipe) or
    # after (the end of the stream): both are "no answer".
    return (f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\ns.settimeout(10)\n"
            f"try:\n    s.sendall({(message + chr(10))!r}.encode())\n    data = s.recv(4096)\n"
            "except (BrokenPipeError, ConnectionResetError):\n    data = b''\n"
            "print('closed without an answer' if not data else 'answered: ' + data.decode())\n")


def test_a_stale_socket_is_replaced_and_a_live_one_is_kept(tmp_path):
    """A socket file that no process answers on (a service that was killed)
    is replaced; a service that answers keeps its socket, and the second one
    does not start."""
    path = tmp_path / "run" / "mcp.sock"
    first = bind_socket(path)
    with pytest.raises(ServiceError, match="another search service answers"):
        bind_socket(path)
    first.close()  # the file stays: the process "died"
    assert path.exists()
    second = bind_socket(path)
    try:
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    finally:
        second.close()


def test_relay_copies_both_ways_and_ends_with_the_client(tmp_path):
    """The relay in one process, on socket pairs: bytes of a long line reach
    the service whole, the answer reaches stdout whole, and the end of stdin
    ends the relay with 0."""
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    front_end, service_end = socket.socketpair()
    line = b"x" * 300_000 + b"\n"

    def service_side() -> None:
        got = b""
        while not got.endswith(b"\n"):
            got += service_end.recv(65536)
        service_end.sendall(got.upper())
        assert service_end.recv(1) == b""  # the client closed: shutdown reached the service
        service_end.close()

    thread = threading.Thread(target=service_side)
    thread.start()
    result: list[int] = []
    relaying = threading.Thread(target=lambda: result.append(relay(front_end, stdin_read, stdout_write)))
    relaying.start()
    os.write(stdin_write, line)
    answer = b""
    while len(answer) < len(line):
        answer += os.read(stdout_read, 65536)
    os.close(stdin_write)
    relaying.join(10)
    thread.join(10)
    assert answer == line.upper()
    assert result == [0]
