"""The container deployment, built, started and attacked with podman
(docker-compose.yml, Dockerfile, docs/deploy.md; section 13 of the
specification).

One module fixture builds the image (deploy/podman/build-image.sh: the
layers stay in podman's cache, so a build after a change of the code takes
seconds), starts the five parts with podman-compose under a project name
of its own, and stops them with `podman-compose down` at the end. From
inside each container an attack script tries to write `/` and the data, to
gain a capability, to reach the code server's gRPC, to reach what the part
must not reach, and to find the secrets of another part. The honest path:
the UI and the search page answer on loopback, a file dropped in the inbox
becomes searchable, and the wiki agent's room starts in `code`.

Egress: `code` and `bot` have no route out but their proxy (kb's fetch
guard, kb/guards/egress_proxy.py). A stand-in of the Bot API runs in this
process, on the machine's own address (the proxies reach it; it is
TELEGRAM_API_BASE). This machine reaches no internet but package
registries: deb.debian.org stands in for a public site. Its name resolves
here to a documentation address (203.0.113.0/24), which the guard refuses
as not public, so the test allows it by name (KB_FETCH_ALLOW_HOSTS).

Without podman the test skips and says why; with CI=true it fails instead
(.ci/run installs podman)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.fake_telegram import FakeTelegram, command_fields, message_update

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parent.parent
SERVICES = ("code", "daemon", "webserver", "bot", "web", "egress", "egress-bot")
CODE_SECRET = "sk-CODE-SECRET-containers-0001"  # only in deploy/secrets/code.env
BOT_SECRET = "123456:BOT-SECRET-containers-0002"  # in bot.env and code.env (the code sends notices)
WORD = "zorblattquen"  # the word of the source that the test drops in the inbox

ATTACK = r'''
import errno, json, os, socket, sys
secrets = sys.stdin.read().split(",")  # not in argv: this process's own cmdline would hold them
result = {"uid": os.getuid(), "gid": os.getgid()}

def attempt(action):
    try:
        action()
        return "done"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))

def connect(address, family=socket.AF_INET):
    with socket.socket(family) as s:
        s.settimeout(4)
        s.connect(address)

result["write /"] = attempt(lambda: open("/kb-attack", "w").close())
result["write /usr"] = attempt(lambda: open("/usr/kb-attack", "w").close())
for folder in ("/data", "/data/wiki", "/data/raw", "/data/lancedb", "/data/inbox", "/data/dagster", "/run/kb-grpc"):
    if os.path.isdir(folder):
        path = os.path.join(folder, ".kb-attack")
        result[f"write {folder}"] = attempt(lambda: open(path, "w").close())
        if result[f"write {folder}"] == "done":
            os.unlink(path)
    else:
        result[f"write {folder}"] = "absent"
result["setuid(0)"] = attempt(lambda: os.setuid(0))
result["chown to root"] = attempt(lambda: os.chown("/tmp", 0, 0))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/tmp/kb-mnt", exist_ok=True)
rc = libc.mount(b"none", b"/tmp/kb-mnt", b"tmpfs", 0, None)
result["mount"] = "done" if rc == 0 else errno.errorcode[ctypes.get_errno()]
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
result["caps"] = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
result["NoNewPrivs"] = status["NoNewPrivs"].strip()
result["grpc socket"] = attempt(lambda: connect("/run/kb-grpc/code.sock", socket.AF_UNIX))
result["grpc code:4000"] = attempt(lambda: connect(("code", 4000)))
for name, address in json.loads(sys.argv[1]).items():
    result[f"reach {name}"] = attempt(lambda: connect(tuple(address)))
found = set()
for text in [json.dumps(dict(os.environ))]:
    found |= {s for s in secrets if s in text}
for root in ("/data", "/run", "/tmp", "/proc", "/home", "/etc", "/app"):
    for folder, dirs, files in os.walk(root):
        if folder == "/proc":
            dirs[:] = [d for d in dirs if d.isdigit()]
            continue
        if folder.startswith("/proc/"):
            dirs[:] = []
            files = [f for f in files if f in ("environ", "cmdline")]
        for name in files:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    data = f.read(20_000_000)
            except OSError:
                continue
            found |= {s for s in secrets if s.encode() in data}
result["secrets found"] = sorted(found)
print(json.dumps(result))
'''

# From `code` or `bot`: a tunnel through the part's proxy (KB_EGRESS_PROXY) to
# each target, with kb's own client (no check before the proxy), then one
# request. "reached HTTP/1.1 ..." or "refused <the proxy's reason>".
THROUGH_PROXY = r'''
import json, os, sys
from kb.guards.fetch_guard import PrivateAddress, open_tunnel, parse_proxy
proxy = parse_proxy(os.environ["KB_EGRESS_PROXY"])
result = {}
for host, port in json.loads(sys.argv[1]):
    try:
        with open_tunnel(proxy, host, port, 10) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            s.settimeout(10)
            result[f"{host}:{port}"] = "reached " + s.recv(200).split(b"\r\n")[0].decode()
    except PrivateAddress as exc:
        result[f"{host}:{port}"] = "refused " + exc.why
    except OSError as exc:
        result[f"{host}:{port}"] = f"error {exc}"
print(json.dumps(result))
'''

# In `code`: kb's link fetch (the guard's httpx client), a client that reads
# HTTP_PROXY (httpx: the model endpoints), and the wiki agent's relay.
CODE_CLIENTS = r'''
import json, os, socket, sys, tempfile
from pathlib import Path
import httpx
from kb.guards.fetch_guard import FetchGuard, PrivateAddress, parse_proxy
from kb.wiki.sandbox import EndpointRelay
bot_host, bot_port = sys.argv[1], int(sys.argv[2])
result = {}
with FetchGuard.from_settings().httpx_client(timeout=10) as http:
    result["guard client deb.debian.org"] = http.get("http://deb.debian.org/debian/").status_code
    try:
        http.get("http://metadata.google.internal/")
    except PrivateAddress as exc:
        result["guard client metadata"] = "refused " + exc.why
result["HTTP_PROXY client deb.debian.org"] = httpx.get("http://deb.debian.org/debian/", timeout=10).status_code
result["HTTP_PROXY client 10.0.0.1"] = httpx.get("http://10.0.0.1/", timeout=10).status_code
path = Path(tempfile.mkdtemp()) / "relay.sock"
relay = EndpointRelay(path, bot_host, bot_port, parse_proxy(os.environ["KB_EGRESS_PROXY"]))
with socket.socket(socket.AF_UNIX) as room:
    room.settimeout(10)
    room.connect(str(path))
    room.sendall(f"GET / HTTP/1.1\r\nHost: {bot_host}\r\nConnection: close\r\n\r\n".encode())
    result["agent relay to the Bot API"] = room.recv(200).split(b"\r\n")[0].decode()
relay.close()
print(json.dumps(result))
'''

ROOM = r'''
from pathlib import Path
import subprocess, sys
from kb.wiki.sandbox import SandboxError, bubblewrap_args, sandbox_choice, sandbox_status
try:
    print("choice", sandbox_choice("auto"))
except SandboxError as exc:
    print("refused", exc)
print("status", sandbox_status("auto"))
wiki = Path("/tmp/room-wiki")
(wiki / "raw").mkdir(parents=True, exist_ok=True)
args = bubblewrap_args("/usr/bin/bwrap", wiki=wiki, writable=[], readable=[])
room = subprocess.run(args + ["/bin/sh", "-c", "touch raw/x 2>&1; ls /data 2>&1; id -u"], capture_output=True,
                      text=True)
print("room", room.returncode, room.stdout.strip().replace("\n", " | "), room.stderr.strip()[:200])
'''


def _podman_missing() -> str | None:
    for program in ("podman", "podman-compose"):
        if not shutil.which(program):
            return f"{program} is not installed (apt-get install podman podman-compose runc debootstrap)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host_address() -> str:
    """This machine's address on its network: not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet leaves: the kernel only picks the source address
        return s.getsockname()[0]


class Deployment:
    def __init__(self, folder: Path, project: str, env: dict[str, str], ui_port: int, web_port: int):
        self.folder, self.project, self.env = folder, project, env
        self.ui_port, self.web_port = ui_port, web_port
        self.figures: dict[str, float] = {}
        self.telegram: FakeTelegram | None = None

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["podman-compose", "-p", self.project, *args], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def exec(self, service: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", "exec", self.container(service), *argv], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def running(self) -> list[str]:
        out = subprocess.run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}",
                              "--format", "{{.Names}} {{.State}}"], env=self.env, capture_output=True, text=True)
        return out.stdout.split("\n")[:-1]

    def log(self, service: str) -> str:
        done = subprocess.run(["podman", "logs", self.container(service)], env=self.env, capture_output=True,
                              text=True)
        return done.stdout + done.stderr

    def logs(self) -> str:
        return "\n".join(f"--- {s}\n" + subprocess.run(["podman", "logs", "--tail", "30", self.container(s)],
                                                        env=self.env, capture_output=True, text=True).stdout[-3000:]
                         + subprocess.run(["podman", "logs", "--tail", "30", self.container(s)], env=self.env,
                                          capture_output=True, text=True).stderr[-3000:] for s in SERVICES)


def _wait(what: str, check, deployment: Deployment, timeout: float):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        time.sleep(2)
    raise AssertionError(f"no {what} after {timeout} s (last: {last!r}); the logs:\n{deployment.logs()}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, request):
    missing = _podman_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, but {missing}: .ci/run installs it")
        pytest.skip(missing)
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "deploy/podman/containers.conf")}
    started = time.monotonic()
    build = subprocess.run([str(REPO / "deploy/podman/build-image.sh")], env=env, capture_output=True, text=True,
                           timeout=3600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    build_s = time.monotonic() - started

    telegram = FakeTelegram(BOT_SECRET).start(host=_host_address())
    request.addfinalizer(telegram.stop)
    folder = tmp_path_factory.mktemp("compose")
    shutil.copy(REPO / "docker-compose.yml", folder)
    (folder / "deploy/secrets").mkdir(parents=True)
    settings = (REPO / "deploy/settings.env").read_text()
    # Faster looks at the inbox; no link fetches (no internet here); no bot users.
    settings += "KB_INBOX_SENSOR_INTERVAL_S=2\nKB_EXCLUDE=link\nALLOWED_USER_IDS=1\n"
    # The Bot API stand-in; deb.debian.org stands in for a public site (see the module's text).
    settings += f"TELEGRAM_API_BASE={telegram.base_url}\nKB_FETCH_ALLOW_HOSTS=deb.debian.org:80\n"
    (folder / "deploy/settings.env").write_text(settings)
    (folder / "deploy/secrets/code.env").write_text(
        f"ANTHROPIC_AUTH_TOKEN={CODE_SECRET}\nANTHROPIC_BASE_URL=http://127.0.0.1:9\nTELEGRAM_BOT_TOKEN={BOT_SECRET}\n")
    (folder / "deploy/secrets/bot.env").write_text(f"TELEGRAM_BOT_TOKEN={BOT_SECRET}\n")
    project = f"kbtest{os.getpid()}"
    ui_port, web_port = _free_port(), _free_port()
    env.update(KB_UI_PORT=str(ui_port), KB_WEB_PORT=str(web_port))
    d = Deployment(folder, project, env, ui_port, web_port)
    d.telegram = telegram
    d.figures["build_s"] = build_s
    try:
        started = time.monotonic()
        up = d.compose("up", "-d")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        d.figures["up_s"] = time.monotonic() - started
        _wait("search page", lambda: httpx.get(f"http://127.0.0.1:{web_port}/api/status", timeout=5).status_code == 200,
              d, 600)
        _wait("Dagster UI", lambda: httpx.get(f"http://127.0.0.1:{ui_port}/server_info", timeout=5).status_code == 200,
              d, 600)
        d.figures["ready_s"] = time.monotonic() - started
        yield d
    finally:
        started = time.monotonic()
        down = d.compose("down", "-v", timeout=300)
        d.figures["down_s"] = time.monotonic() - started
        left = d.running()
        # podman-compose 1.0.3 leaves the project's networks: remove them.
        networks = subprocess.run(["podman", "network", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}"],
                                  env=env, capture_output=True, text=True).stdout.split()
        if networks:
            subprocess.run(["podman", "network", "rm", *networks], env=env, capture_output=True)
        print(f"\ncontainer figures: {json.dumps({k: round(v, 1) for k, v in d.figures.items()})}")
        assert down.returncode == 0, down.stderr[-2000:]
        assert left == [], f"podman-compose down left {left}"


def _attack(d: Deployment, service: str) -> dict:
    targets = {"the host's UI port off loopback": [_host_address(), d.ui_port],
               "the internet (deb.debian.org)": [socket.gethostbyname("deb.debian.org"), 80],
               "the proxy of code": ["egress", 3128], "the proxy of bot": ["egress-bot", 3128]}
    done = subprocess.run(["podman", "exec", "-i", d.container(service), "python", "-c", ATTACK, json.dumps(targets)],
                          input=f"{CODE_SECRET},{BOT_SECRET}", env=d.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nattacks from {service}: {json.dumps(result)}")
    return result


@pytest.mark.parametrize("service", SERVICES)
def test_each_part_is_walled_in(deployment, service):
    r = _attack(deployment, service)
    # Not root, no capability, no way to gain one.
    assert (r["uid"], r["gid"]) == (1000, 1000)
    assert r["caps"] == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000",
                         "CapBnd": "0000000000000000", "CapAmb": "0000000000000000"}
    assert r["NoNewPrivs"] == "1"
    assert r["setuid(0)"] == "EPERM" and r["chown to root"] == "EPERM" and r["mount"] == "EPERM"
    # A read-only root; the data only where the part writes it.
    assert r["write /"] == "EROFS" and r["write /usr"] == "EROFS"
    writes = {"code": {"/data", "/data/wiki", "/data/raw", "/data/lancedb", "/data/inbox", "/data/dagster"},
              "daemon": {"/data/dagster"}, "webserver": {"/data/dagster"}, "bot": {"/data/inbox", "/data/dagster"},
              "web": set(), "egress": set(), "egress-bot": set()}[service]
    for key, outcome in r.items():
        if key.startswith("write /data"):
            folder = key.removeprefix("write ")
            assert (outcome == "done") == (folder in writes), f"{service}: {key}: {outcome}"
    # The socket's folder: the volume in code, read-only where the socket is used. (In bot and web,
    # /run/kb-grpc is the empty folder of the image in podman's own tmpfs on /run: no socket there.)
    assert r["write /run/kb-grpc"] == {"code": "done", "daemon": "EROFS", "webserver": "EROFS"}.get(
        service, r["write /run/kb-grpc"])
    assert r["write /data/wiki"] in (("done",) if service == "code" else ("EROFS", "absent", "EACCES"))
    # The code server's gRPC: its socket for the daemon and the webserver only; no TCP port anywhere.
    assert (r["grpc socket"] == "done") == (service in ("code", "daemon", "webserver")), r["grpc socket"]
    assert r["grpc code:4000"] != "done"
    # The host's services off loopback: the UI is not there.
    assert r["reach the host's UI port off loopback"] != "done"
    # The way out: none for the daemon, `code` and `bot`; the proxies only for their own part.
    if service in ("daemon", "code", "bot"):
        assert r["reach the internet (deb.debian.org)"] == "ENETUNREACH"
    if service in ("egress", "egress-bot"):
        assert r["reach the internet (deb.debian.org)"] == "done"
    if service in ("code", "bot", "daemon", "webserver", "web"):
        assert (r["reach the proxy of code"] == "done") == (service == "code"), r["reach the proxy of code"]
        assert (r["reach the proxy of bot"] == "done") == (service == "bot"), r["reach the proxy of bot"]
    # No part finds another part's secret; the bot and code hold their own.
    own = {"code": {CODE_SECRET, BOT_SECRET}, "bot": {BOT_SECRET}}.get(service, set())
    assert set(r["secrets found"]) <= own, r["secrets found"]


def test_every_part_runs_and_none_restarted(deployment):
    """A part that stops and is restarted is not there for part of the
    time (the bot stopped when the Bot API was out of reach at its start)."""
    states = {}
    for service in SERVICES:
        out = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}} {{.RestartCount}}",
                              deployment.container(service)], env=deployment.env, capture_output=True, text=True)
        states[service] = out.stdout.strip()
    print(f"\nstates: {states}")
    assert states == {s: "running 0" for s in SERVICES}, f"{states}\n{deployment.logs()}"


def test_the_code_server_fetch_guard_refuses_private_addresses(deployment):
    """code reaches the internet for links; kb's fetch guard refuses the
    private addresses, the metadata service and the machine's own UI."""
    script = ("from kb.guards.fetch_guard import FetchGuard, PrivateAddress\n"
              "import sys\n"
              "for host, port in ((sys.argv[1], int(sys.argv[2])), ('169.254.169.254', 80), ('10.0.0.1', 80)):\n"
              "    try:\n        FetchGuard.from_settings().connect(host, port, 3)\n        print('reached', host)\n"
              "    except PrivateAddress as exc:\n        print('refused', host, exc.why)\n")
    done = deployment.exec("code", "python", "-c", script, _host_address(), str(deployment.ui_port))
    print(f"\nfetch guard in code: {done.stdout.strip()}")
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("refused") for line in lines), done.stdout + done.stderr


def test_the_agent_room_starts_in_code_and_nowhere_the_agent_runs_without_it(deployment):
    code = deployment.exec("code", "python", "-c", ROOM)
    print(f"\nroom in code: {code.stdout.strip()} {code.stderr[-500:]}")
    assert "choice (True, 'bubblewrap')" in code.stdout
    room = next(line for line in code.stdout.splitlines() if line.startswith("room"))
    # The room starts; raw/ is read-only in it; KB_HOME is not in it; the CLI is uid 1000.
    assert room.startswith("room 0 ") and "Read-only file system" in room and "No such file" in room, room
    assert room.split(" | ")[-1].split()[0] == "1000", room
    # The search page's container has no room (its /proc stays masked): auto refuses there.
    web = deployment.exec("web", "python", "-c", ROOM)
    print(f"room in web: {web.stdout.strip()}")
    assert "refused KB_AGENT_SANDBOX=auto in a container (" in web.stdout
    assert "each agent run fails" in web.stdout


def test_the_ui_and_the_search_page_answer_on_loopback_only(deployment):
    for port in (deployment.ui_port, deployment.web_port):
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{_host_address()}:{port}/", timeout=5)


def test_a_source_dropped_in_the_inbox_becomes_searchable(deployment):
    note = f"# A note on {WORD}\n\nThe {WORD} is a test word. It goes through the inbox, the runs and the index.\n"
    started = time.monotonic()
    dropped = subprocess.run(["podman", "exec", "-i", deployment.container("bot"), "sh", "-c",
                              f"cat > /data/inbox/.{WORD}.tmp && mv /data/inbox/.{WORD}.tmp /data/inbox/{WORD}.md"],
                             input=note, env=deployment.env, capture_output=True, text=True, timeout=60)
    assert dropped.returncode == 0, dropped.stderr

    def found():
        answer = httpx.get(f"http://127.0.0.1:{deployment.web_port}/api/search",
                           params={"q": WORD, "mode": "bm25"}, timeout=30).json()
        return answer.get("hits")

    hits = _wait(f"hit for {WORD}", found, deployment, 900)
    deployment.figures["inbox_to_search_s"] = time.monotonic() - started
    assert WORD in json.dumps(hits)


def _through_proxy(d: Deployment, service: str, targets: list) -> dict:
    done = d.exec(service, "python", "-c", THROUGH_PROXY, json.dumps(targets))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nthrough the proxy of {service}: {json.dumps(result)}")
    return result


def test_code_and_bot_reach_out_only_through_their_proxy_and_it_refuses_the_rest(deployment):
    """The proxy of `code` passes a public site and the named endpoints, and
    refuses the host's UI, the metadata address and a private address; the
    proxy of `bot` passes its Bot API only. Each refusal is in the proxy's log."""
    bot = deployment.telegram.base_url.removeprefix("http://")
    bot_host, bot_port = bot.rsplit(":", 1)
    ui = f"{_host_address()}:{deployment.ui_port}"
    targets = [["deb.debian.org", 80], [bot_host, int(bot_port)], [_host_address(), deployment.ui_port],
               ["169.254.169.254", 80], ["10.0.0.1", 80], ["metadata.google.internal", 80]]
    code = _through_proxy(deployment, "code", targets)
    assert code["deb.debian.org:80"].startswith("reached HTTP/1.1 "), code
    assert code[bot].startswith("reached HTTP/1.1 404"), code  # the stand-in answers GET / with 404
    assert code[ui].startswith("refused "), code
    assert code["169.254.169.254:80"].startswith("refused cloud metadata"), code
    assert code["10.0.0.1:80"].startswith("refused private network"), code
    assert code["metadata.google.internal:80"].startswith("refused a name of the local machine"), code
    bot_part = _through_proxy(deployment, "bot", targets)
    assert bot_part[bot].startswith("reached HTTP/1.1 404"), bot_part
    for target in ("deb.debian.org:80", ui, "169.254.169.254:80", "10.0.0.1:80"):
        assert bot_part[target].startswith("refused not an endpoint of this proxy's allowlist (TELEGRAM_API_BASE="), \
            bot_part
    # kb's clients in `code`: the guard's client, a client of HTTP_PROXY, the agent's relay.
    done = deployment.exec("code", "python", "-c", CODE_CLIENTS, bot_host, bot_port)
    assert done.returncode == 0, done.stderr[-3000:]
    clients = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nkb's clients in code: {json.dumps(clients)}")
    assert clients["guard client deb.debian.org"] == clients["HTTP_PROXY client deb.debian.org"] == 200, clients
    assert clients["guard client metadata"].startswith("refused a name of the local machine"), clients
    assert clients["HTTP_PROXY client 10.0.0.1"] == 403, clients
    assert clients["agent relay to the Bot API"] == "HTTP/1.1 404 Not Found", clients
    # The proxies' logs name each refusal and its reason, never a secret.
    egress, egress_bot = deployment.log("egress"), deployment.log("egress-bot")
    print(f"\nthe log of egress (end):\n{egress[-1500:]}\nthe log of egress-bot (end):\n{egress_bot[-1500:]}")
    assert "refused CONNECT 169.254.169.254:80 for " in egress and ": cloud metadata" in egress
    assert "refused CONNECT 10.0.0.1:80 for " in egress and ": private network" in egress
    assert "allowed CONNECT deb.debian.org:80 for " in egress
    assert "refused CONNECT deb.debian.org:80 for " in egress_bot
    assert f"allowed POST {bot} for " in egress_bot  # the bot's own Bot API calls
    assert BOT_SECRET not in egress + egress_bot and CODE_SECRET not in egress + egress_bot


def test_the_bot_answers_a_message_through_its_proxy(deployment):
    """The honest path: an owner's message reaches the bot and its answer
    reaches the Bot API, through the proxy of `bot`."""
    telegram = deployment.telegram
    started = time.monotonic()
    telegram.push(message_update(telegram.next_update_id(), 501, 1, **command_fields("/help")))
    _wait("answer of the bot", lambda: telegram.replies_to(501), deployment, 180)
    deployment.figures["bot_answer_s"] = time.monotonic() - started
    assert "getme" in [method for method, _ in telegram.calls] and telegram.unauthorized == 0
