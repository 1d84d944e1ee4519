"""The room that the wiki agent's CLI runs in: a clean environment and,
where bubblewrap works, a file system that holds only the wiki.

Why a launcher: claude-agent-sdk starts its CLI with `os.environ` merged
with the `env` that kb passes (subprocess_cli.py, `{**os.environ, ...}`),
and a run worker holds every key that kb loaded (the resources export them
to the environment). The SDK has no switch against the merge. So kb gives
the SDK a launcher as `cli_path`: a small Python program that keeps only the
variables that this module names and then replaces itself with the CLI
(`execve`). The CLI never sees another variable.

Why bubblewrap, and not the SDK's `sandbox` settings: those settings wrap
the Bash tool only, and the wiki agent has no Bash tool. bubblewrap wraps
the whole CLI. Inside it, the CLI sees the system folders read-only, its own
binary, a temporary HOME, its config folder, and the wiki folder. The wiki's
`.git` is an empty folder, and `raw/`, `purpose.md` and `CLAUDE.md` are
read-only. The owner's settings file, the X login, DuckDB and the rest of
KB_HOME are not in the room at all, so no tool and no bug of the CLI can
read them.

Why a relay: the room has no network of its own (`--unshare-net`), only its
own loopback. The CLI needs one address, the model endpoint. So a small
program in the room (kb/guards/room_relay.py) listens on the room's
loopback and passes each connection through a Unix socket to kb
(EndpointRelay), and kb connects to the endpoint. TLS goes through the relay unchanged: the room's
/etc/hosts names the endpoint's host as 127.0.0.1, so the CLI checks the
endpoint's own certificate. Every other address fails in the room: the
Dagster UI on 127.0.0.1:3000 (no login, it launches runs), the local
network, 169.254.169.254, and DNS.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import socketserver
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kb.guards.fetch_guard import FetchRefused, connect_out, parse_proxy
from kb.guards.room_binds import BWRAP_INSTALL, BWRAP_MISSING, bwrap_probe, container_sign, system_binds
from kb.guards.room_relay import _pipe, relay_command, relay_program, relay_python, relay_python_binds

log = logging.getLogger("kb.wiki.sandbox")

# The only variables that the CLI gets. Each one is here for a reason:
# - PATH, HOME, TMPDIR, LANG, LC_ALL, TZ: a process needs them to run.
# - ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_API_KEY: the model
#   endpoint and its token (kb sets the API key to an empty value).
# - CLAUDE_CONFIG_DIR and the DISABLE_* and CLAUDE_CODE_* names below: the
#   CLI's own settings, which kb sets (kb/wiki/agent.py) or the SDK sets
#   (the entry point, the SDK version, the session-state protocol).
# A name that is not here never reaches the CLI, whatever its value.
AGENT_ENV_NAMES = (
    "PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ", "PWD",
    "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY",
    "CLAUDE_CONFIG_DIR",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING",
    "DISABLE_AUTOUPDATER", "DISABLE_BUG_COMMAND", "CLAUDE_CODE_MAX_RETRIES",
    "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_AGENT_SDK_VERSION", "CLAUDE_CODE_SDK_READS_SESSION_STATE",
    # kb's egress proxy for a CLI without a room (kb sets them; empty in a room,
    # whose one way out is the relay).
    "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY",
)
# The PATH of the CLI: system folders only. The owner's PATH can name a
# folder in which a stranger's program waits.
AGENT_PATH = "/usr/local/bin:/usr/bin:/bin"

# The system files that a program needs to run and to reach the endpoint by
# name and by TLS. /etc as a whole is not in the room: it can hold keys.
SYSTEM_FILES = (
    "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
    "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/pki",
)
# Inside the wiki: what the agent reads but never writes.
READ_ONLY_IN_WIKI = ("raw", "purpose.md", "CLAUDE.md")
# Inside the wiki: what the agent never sees.
HIDDEN_IN_WIKI = (".git",)

# The largest file that the CLI and its children may write (RLIMIT_FSIZE):
# a write past it ends the CLI (SIGXFSZ), and the run rolls back. A source
# talked an agent into a page of 100 MB in the room (Edit with replace_all
# of a few kB of tool input); kb's check of the change (repo.py,
# MAX_ADDED_BYTES) sees it only after the run. The CLI's own session file
# of a long run has a few MB.
AGENT_FILE_BYTES = 64 << 20

LAUNCHER = '''#!{python} -IS
# Written by kb (kb/wiki/sandbox.py) for each agent run. It keeps only the
# named variables, then replaces itself with the CLI: no secret of the run
# worker reaches the CLI's process. Files larger than file_bytes end it.
import json, os, resource, signal, sys
config = json.loads({config!r})
resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_bytes"], config["file_bytes"]))
# Python ignores SIGXFSZ, and an exec keeps that: the CLI would only see
# its write fail, and go on.
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
env = {{name: os.environ[name] for name in config["names"] if name in os.environ}}
env.update(config["fixed"])
argv = config["prefix"] + [config["cli"]] + sys.argv[1:]
os.execve(argv[0], argv, env)
'''


# Where the relay's files are in the room. A short path: a Unix socket path
# has at most 107 bytes, and KB_HOME can be deep.
ROOM_RELAY_DIR = "/run/kb-relay"
RELAY_SOCKET = "endpoint.sock"
RELAY_SCRIPT = "relay.py"


class SandboxError(RuntimeError):
    """The agent's room cannot be made as the settings ask."""


@lru_cache(maxsize=1)
def bubblewrap_works() -> tuple[bool, str]:
    """True when `bwrap` is installed and can make a room on this machine
    (a container without user namespaces cannot). The reason says why not.
    The probe asks for the room's own namespaces and its own /proc: in a
    container with a masked /proc (the default of podman and Docker),
    bubblewrap makes a user namespace, but not the /proc of the room."""
    return bwrap_probe(lambda bwrap: [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net",
                                      "--proc", "/proc", "--dev", "/dev", "--"])


def container_refusal(setting: str) -> str | None:
    """Why the agent must not run, when KB_AGENT_SANDBOX=auto finds no
    working bubblewrap in a container; else None. In a container, `auto`
    acts as `bwrap`: the agent runs in its room or not at all. Why: a
    container without user namespaces is the usual place where the room
    fails, and no owner sits at its terminal to read a notice."""
    if setting != "auto":
        return None
    works, detail = bubblewrap_works()
    sign = container_sign()
    if works or sign is None:
        return None
    return (f"KB_AGENT_SANDBOX=auto in a container ({sign}), but {detail}. In a container kb runs the wiki "
            "agent only in its bubblewrap room. Give the container the settings of the `code` service of "
            "docker-compose.yml (security_opt systempaths=unconfined; docs/deploy.md), with which bubblewrap "
            "makes its room")


def sandbox_choice(setting: str) -> tuple[bool, str]:
    """Whether to use bubblewrap, from KB_AGENT_SANDBOX (auto, bwrap, none).
    `bwrap` fails when bubblewrap does not work; `auto` uses it when it
    works, and fails in a container where it does not (container_refusal)."""
    works, detail = bubblewrap_works()
    if setting == "none":
        return False, "KB_AGENT_SANDBOX=none: the agent's CLI runs without bubblewrap"
    if setting == "bwrap" and not works:
        raise SandboxError(f"KB_AGENT_SANDBOX=bwrap, but {detail}")
    if refusal := container_refusal(setting):
        raise SandboxError(refusal)
    if not works:
        return False, f"the agent's CLI runs without bubblewrap: {detail}"
    return True, "bubblewrap"


def sandbox_notice(setting: str) -> str | None:
    """What the owner must hear when KB_AGENT_SANDBOX=auto finds no working
    bubblewrap: the agent then runs without its room, and only kb's tool
    guard and the worker's check stand between it and KB_HOME. None when
    the room works, or when the owner chose `none` or `bwrap` (`bwrap`
    fails loudly by itself)."""
    if setting != "auto" or container_refusal(setting):  # a refusal fails each run loudly by itself
        return None
    works, detail = bubblewrap_works()
    if works:
        return None
    fix = BWRAP_INSTALL if detail == BWRAP_MISSING else "see KB_AGENT_SANDBOX in docs/architecture.md"
    return (f"The wiki agent runs without its bubblewrap room: {detail}. Without the room, only kb's tool guard "
            f"keeps the agent's CLI from the files of KB_HOME and from the network. To fix it, {fix}.")


def sandbox_status(setting: str) -> tuple[bool, str]:
    """(ready, detail) of the agent's room, for `kb status`."""
    if setting == "none":
        return False, "KB_AGENT_SANDBOX=none: the agent's CLI runs without a room (your setting)"
    if refusal := container_refusal(setting):
        return False, f"{refusal}: each agent run fails"
    notice = sandbox_notice(setting)
    if notice:
        return False, notice
    works, detail = bubblewrap_works()
    if not works:  # KB_AGENT_SANDBOX=bwrap: each agent run fails
        return False, f"KB_AGENT_SANDBOX={setting}, but {detail}: each agent run fails"
    return True, f"bubblewrap ({detail}): the agent's CLI runs in a room that holds only the wiki"


def bubblewrap_args(bwrap: str, *, wiki: Path, writable: list[Path], readable: list[Path],
                    relay: "RoomNetwork | None" = None) -> list[str]:
    """The bwrap command line in front of the CLI. Later mounts cover earlier
    ones, so the read-only and hidden parts of the wiki come after the wiki.
    With a relay, the room has no network and the relay program runs first."""
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-net", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    args += system_binds(SYSTEM_FILES)
    for path in readable:
        args += ["--ro-bind", str(path), str(path)]
    for path in writable:
        args += ["--bind", str(path), str(path)]
    args += ["--bind", str(wiki), str(wiki)]
    for name in READ_ONLY_IN_WIKI:
        if (wiki / name).exists():
            args += ["--ro-bind", str(wiki / name), str(wiki / name)]
    for name in HIDDEN_IN_WIKI:
        if (wiki / name).exists():
            args += ["--tmpfs", str(wiki / name)]
    if relay is not None:
        args += ["--ro-bind", str(relay.folder), ROOM_RELAY_DIR,
                 "--ro-bind", str(relay.folder / "hosts"), "/etc/hosts", *relay_python_binds()]
    args += ["--chdir", str(wiki), "--"]
    if relay is not None:
        args += relay_command(f"{ROOM_RELAY_DIR}/{RELAY_SCRIPT}", "127.0.0.1", relay.room_port,
                              f"{ROOM_RELAY_DIR}/{RELAY_SOCKET}")
    return args


@dataclass
class RoomNetwork:
    """The one way out of the room: the endpoint, through a relay.
    `room_url` is the endpoint's URL as the CLI in the room uses it."""

    folder: Path  # a short temporary folder: the relay's socket, its script, the room's hosts file
    room_url: str
    room_port: int
    python: str
    relay: "EndpointRelay"

    @classmethod
    def open(cls, base_url: str, egress_proxy: str = "") -> "RoomNetwork":
        """`egress_proxy` (KB_EGRESS_PROXY): the relay connects to the
        endpoint through kb's egress proxy (a container without a route out)."""
        try:
            proxy = parse_proxy(egress_proxy)
        except ValueError as exc:
            raise SandboxError(str(exc)) from None
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SandboxError(f"ANTHROPIC_BASE_URL {base_url!r} is not an http or https URL with a host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        # In the room every port is free; a port below 1024 needs a privilege there.
        room_port = port if port >= 1024 else 10000 + port
        host = parts.hostname
        try:
            ipaddress.ip_address(host)
            room_host = "127.0.0.1"  # an address: the room reaches it at its own loopback
        except ValueError:
            room_host = host  # a name: the room's hosts file points it at loopback, TLS checks the name
        room_url = urlunsplit((parts.scheme, f"{room_host}:{room_port}", parts.path, parts.query, ""))
        folder = Path(tempfile.mkdtemp(prefix="kb-agent-net-"))
        (folder / RELAY_SCRIPT).write_text(relay_program())
        (folder / "hosts").write_text(f"127.0.0.1 localhost {room_host}\n")
        relay = EndpointRelay(folder / RELAY_SOCKET, host, port, proxy)
        return cls(folder=folder, room_url=room_url, room_port=room_port,
                   python=relay_python(), relay=relay)

    def close(self) -> None:
        self.relay.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class EndpointRelay:
    """kb's end of the relay: each connection on the Unix socket goes to the
    endpoint's host and port, byte for byte. It connects to that one address
    and to no other, whatever the room sends. With `proxy`, through kb's
    egress proxy (a tunnel to the endpoint)."""

    def __init__(self, socket_path: Path, host: str, port: int, proxy: tuple[str, int] | None = None):
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    upstream = connect_out(host, port, 30, proxy)
                except (OSError, FetchRefused) as exc:
                    # The CLI sees a closed connection and names the endpoint; the reason is here.
                    log.warning("the wiki agent's endpoint %s:%d is out of reach: %s", host, port, exc)
                    return
                upstream.settimeout(None)
                back = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
                back.start()
                _pipe(self.request, upstream)
                back.join()
                upstream.close()

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(socket_path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="kb-agent-relay", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_launcher(folder: Path, *, cli: str, home: Path, prefix: list[str]) -> Path:
    """Write the launcher for one run into `folder` (mode 0700) and return
    its path. It holds no secret: the token comes through the environment."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = {"names": list(AGENT_ENV_NAMES), "cli": cli, "prefix": prefix, "file_bytes": AGENT_FILE_BYTES,
              "fixed": {"PATH": AGENT_PATH, "HOME": str(home), "TMPDIR": "/tmp"}}
    path = folder / "launch-cli"
    path.write_text(LAUNCHER.format(python=sys.executable, config=json.dumps(config)))
    path.chmod(0o700)
    return path


def bundled_cli() -> str:
    """The CLI that claude-agent-sdk ships (the `_bundled/claude` file)."""
    import claude_agent_sdk

    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if not path.is_file():
        found = shutil.which("claude")
        if not found:
            raise SandboxError(f"the Claude Code CLI is not at {path} and not on PATH")
        return found
    return str(path)
