"""Where Chromium runs: its environment, its sandbox, and its room.

Chromium renders strangers' pages. A bug in a page's script can give the
page code in a Chromium process. Three walls keep such code away from kb's
keys and files:

1. The environment is an allowlist. The resources of kb write their keys
   into os.environ (kb_resources/client_resource.py), and a child process
   gets the environment of its parent. So kb gives Chromium only the names
   below (BROWSER_ENV_NAMES), and gives the Playwright driver (the Node.js
   process between kb and Chromium) only DRIVER_ENV_NAMES. A name that is
   not in a list never reaches the process, whatever its value.
2. Chromium's own sandbox: each renderer runs with seccomp-bpf in its own
   user and PID namespaces, and sees no file system. Playwright turns it off
   by default (it adds --no-sandbox); kb turns it on.
3. The room (bubblewrap). Chromium refuses its sandbox when it runs as root
   (CI machines and containers often run as root). In the room, Chromium runs
   as a plain user of a new user namespace, so its sandbox works. The room
   also limits what the browser process itself sees: the system folders
   read-only, a few named files of /etc, and an empty /tmp. KB_HOME, the
   owner's home, the settings file and the X login are not in the room. kb
   gives the X login to Playwright as storage state from Python, so Chromium
   never reads it from disk.
4. The room has no network of its own (bubblewrap's --unshare-net): a new
   network namespace with only its own loopback. A page that takes over
   Chromium reaches no port of the host's loopback (the Dagster UI on
   127.0.0.1:3000 has no login and launches runs; the code server's gRPC;
   `kb web`), no local network and no DNS. Chromium reaches pages only
   through kb's fetch guard: each browser context gets its own GuardProxy
   (kb/guards/fetch_guard.py), which listens on a Unix socket in kb's
   private folder (the gate), not on loopback. The room sees the gate
   read-only, and a relay in the room (kb/guards/room_relay.py) passes each
   connection to the room's loopback address 127.a.b.c, port GATE_PORT, to
   the socket `127.a.b.c.sock` of the gate. Playwright talks to Chromium
   over a pipe (--remote-debugging-pipe, fds 3 and 4), not a port, so the
   driver stays outside the room and still reaches Chromium.

kb uses the room wherever bubblewrap works. Where bubblewrap is absent and
kb does not run as root, Chromium's own sandbox runs without the room. Where
kb runs as root and bubblewrap is absent, Chromium runs without a sandbox:
`kb status` says so, and how to fix it.

`kb login` opens a window. The room has no display in it, so the login
browser runs without the room: with Chromium's own sandbox where it can
run, and with the display variables added to its environment.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kb.guards.fetch_guard import FetchGuard, GuardProxy
from kb.guards.room_binds import BWRAP_INSTALL, BWRAP_MISSING, SYSTEM_DIRS, bwrap_probe, system_binds
from kb.guards.room_relay import relay_command, relay_program, relay_python_binds
from kb.x.playwright_internals import filter_driver_env

# The names that Chromium gets from kb's environment. Each one is here for a
# reason: LANG and LC_* set the language of the UI and of the fonts, TZ the
# time zone of Date() in pages, FONTCONFIG_* where the fonts are. kb sets
# PATH and HOME itself (see chromium_env()).
BROWSER_ENV_NAMES = (
    "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME", "LC_COLLATE",
    "LC_MONETARY", "TZ", "FONTCONFIG_FILE", "FONTCONFIG_PATH",
)
# Only for a browser that shows a window (`kb login`).
DISPLAY_ENV_NAMES = ("DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR")
# The PATH of Chromium and of the driver: system folders only. The owner's
# PATH can name a folder in which a stranger's program waits.
BROWSER_PATH = "/usr/local/bin:/usr/bin:/bin"

# The names that the Playwright driver gets. HOME and PLAYWRIGHT_BROWSERS_PATH:
# where Playwright's own Chromium is. TMPDIR: where the driver makes the
# browser profile. PW_* and PLAYWRIGHT_*: Playwright's own settings (the
# Python package sets PW_LANG_NAME and its version). DEBUG: Playwright's
# debug log (DEBUG=pw:browser). The display names: the driver checks them
# before it opens a window. No NODE_OPTIONS: it loads code into the driver.
DRIVER_ENV_NAMES = ("PATH", "HOME", "TMPDIR", "DEBUG", *BROWSER_ENV_NAMES, *DISPLAY_ENV_NAMES)
DRIVER_ENV_PREFIXES = ("PW_", "PLAYWRIGHT_")

# What the room holds besides /usr: the named files of /etc that Chromium
# needs (fonts, Debian's launcher settings, the certificates, names and
# time) and the font cache. /etc as a whole is not in the room: it can hold
# keys. No /etc/resolv.conf: the room has no DNS (the proxy resolves names).
ROOM_FILES = (
    "/etc/fonts", "/etc/chromium", "/etc/chromium.d", "/etc/alternatives", "/etc/ld.so.cache",
    "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/hosts", "/etc/nsswitch.conf",
    "/etc/passwd", "/etc/group", "/etc/localtime", "/etc/timezone",
    # The font cache of the system: without it, each Chromium of the room
    # reads every font file again.
    "/var/cache/fontconfig",
)
# The user of the room. Chromium refuses its sandbox for root (uid 0); any
# other uid works. The uid is the room's own: outside, the processes keep
# the uid of kb.
ROOM_UID = "1000"
ROOM_HOME = "/tmp"
# The gate in the room: the relay's script and the Unix sockets of the
# contexts' proxies. The relay listens on this port of every loopback
# address of the room (the room's loopback is its own: every port is free).
ROOM_GATE_DIR = "/run/kb-gate"
GATE_PORT = 8080
RELAY_SCRIPT = "relay.py"
# The loopback addresses of the room that kb gives to contexts: 127.0.0.2
# to 127.255.255.254, one for each context of this process, in turn.
_FIRST_ADDRESS = int(ipaddress.IPv4Address("127.0.0.2"))
_ADDRESSES = int(ipaddress.IPv4Address("127.255.255.254")) - _FIRST_ADDRESS + 1
_next_address = itertools.count()


@dataclass(frozen=True)
class SandboxPlan:
    """How Chromium runs on this machine. mode: "room" (bubblewrap and
    Chromium's sandbox), "chromium" (Chromium's sandbox only), "none" (no
    sandbox). detail: one line for `kb status`."""

    mode: str
    detail: str

    @property
    def sandbox_on(self) -> bool:
        return self.mode != "none"


def _is_root() -> bool:
    return os.geteuid() == 0


def room_args(bwrap: str, chromium: str) -> list[str]:
    """The bwrap command line in front of Chromium: the room, then the relay
    (which replaces itself with Chromium). No network: Chromium reaches the
    contexts' proxies through the gate only. Inherited file descriptors
    stay open in the room: Playwright talks to Chromium over fds 3 and 4
    (--remote-debugging-pipe)."""
    args = [bwrap, "--die-with-parent", "--unshare-user", "--uid", ROOM_UID, "--gid", ROOM_UID,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp"]
    args += system_binds(ROOM_FILES)
    # A Chromium outside the system folders (KB_CHROMIUM_PATH=/opt/...): its own folder, read-only.
    real = Path(os.path.realpath(chromium))
    if not any(real.is_relative_to(folder) for folder in SYSTEM_DIRS):
        args += ["--ro-bind", str(real.parent), str(real.parent)]
    args += ["--ro-bind", str(gate_folder()), ROOM_GATE_DIR, *relay_python_binds()]
    # 0.0.0.0 in the room: every address of the room's own loopback, nothing else.
    relay = relay_command(f"{ROOM_GATE_DIR}/{RELAY_SCRIPT}", "0.0.0.0", GATE_PORT,
                          f"{ROOM_GATE_DIR}/{{address}}.sock")
    return args + ["--chdir", ROOM_HOME, "--", *relay, chromium]


@lru_cache(maxsize=8)
def room_works(chromium: str) -> tuple[bool, str]:
    """True when the room can start on this machine (bubblewrap is installed
    and the kernel gives user, PID and network namespaces). It runs the
    room's own command line, the relay too, with /bin/true in place of
    Chromium. The reason says why not."""
    return bwrap_probe(lambda bwrap: room_args(bwrap, chromium)[:-1], env={"PATH": BROWSER_PATH})


@lru_cache(maxsize=1)
def user_namespaces_work() -> bool:
    """True when this user can make a user namespace (Chromium's own sandbox
    needs one). Without `unshare` kb cannot tell; it then lets Chromium try."""
    unshare = shutil.which("unshare")
    if not unshare:
        return True
    try:
        return subprocess.run([unshare, "--user", "/bin/true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def sandbox_plan(chromium: str | None, *, headless: bool = True) -> SandboxPlan:
    """The best way to run Chromium here. `chromium` None: Playwright's own
    Chromium, whose path kb does not know before Playwright starts, so it
    gets no room."""
    if not headless:
        why_no_room = "the login window runs without the room (the room has no display)"
        fix = "run `kb login` as a user that is not root"
    elif not chromium:
        why_no_room = "Playwright's own Chromium gets no room"
        fix = "set KB_CHROMIUM_PATH (or install Debian's chromium), so that kb runs Chromium in the room"
    else:
        works, why_no_room = room_works(chromium)
        if works:
            return SandboxPlan("room", "on: Chromium's sandbox in a bubblewrap room "
                                       "(no KB_HOME, no home folder, no keys in it; no network "
                                       "but kb's fetch guard)")
        fix = (BWRAP_INSTALL if why_no_room == BWRAP_MISSING
               else "let bubblewrap make user namespaces on this machine, or run kb as a user that is not root")
    if not _is_root():
        if user_namespaces_work():
            return SandboxPlan("chromium", f"on: Chromium's own sandbox, without the room ({why_no_room})")
        return SandboxPlan("none", "OFF: this kernel gives no user namespaces to this user, so Chromium "
                                   f"runs without its sandbox ({why_no_room})")
    return SandboxPlan("none", "OFF: kb runs as root, and Chromium refuses its sandbox as root; "
                               f"{why_no_room}. To fix it: {fix}")


class _Folder:
    """A private folder (mode 0700) for this process: the launchers of the
    room and the HOME of a Chromium without the room. Removed at exit."""

    lock = threading.Lock()
    _path: Path | None = None

    @classmethod
    def get(cls) -> Path:
        with cls.lock:
            if cls._path is None or not cls._path.is_dir():
                cls._path = Path(tempfile.mkdtemp(prefix="kb-browser-"))
                atexit.register(_remove_folder, cls._path, os.getpid())
            return cls._path


def _remove_folder(path: Path, owner_pid: int) -> None:
    # A forked child runs the atexit functions of its parent too; the folder
    # belongs to the process that made it.
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


def gate_folder() -> Path:
    """The gate of this process's rooms (mode 0700): the relay's script and
    the Unix sockets of the contexts' proxies. Every room of the process
    sees it read-only at ROOM_GATE_DIR."""
    gate = _Folder.get() / "gate"
    with _Folder.lock:
        if not gate.is_dir():
            gate.mkdir(mode=0o700)
            (gate / RELAY_SCRIPT).write_text(relay_program())
    return gate


@contextlib.contextmanager
def room_proxy(guard: FetchGuard, *, timeout_s: float) -> Iterator[tuple[GuardProxy, str]]:
    """The fetch-guard proxy of one browser context in the room, and the
    proxy server that the context names. The proxy listens on a socket of
    the gate, not on loopback; the context reaches it at a loopback address
    of the room that is its own, through the relay."""
    with _Folder.lock:
        address = str(ipaddress.IPv4Address(_FIRST_ADDRESS + next(_next_address) % _ADDRESSES))
    with GuardProxy(guard, timeout_s=timeout_s, unix_socket=str(gate_folder() / f"{address}.sock")) as proxy:
        yield proxy, f"http://{address}:{GATE_PORT}"


def browser_home() -> Path:
    """The HOME of a Chromium without the room: a kb folder, not the
    owner's home (Chromium writes its certificate store and caches there)."""
    home = _Folder.get() / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    return home


def room_launcher(chromium: str) -> str:
    """The executable that Playwright starts for the room: a small script
    that runs bwrap and Chromium in it. Playwright passes its arguments, and
    the script passes them on unchanged ("$@")."""
    bwrap = shutil.which("bwrap") or "bwrap"
    args = room_args(bwrap, chromium)
    path = _Folder.get() / f"chromium-room-{abs(hash(tuple(args))):x}"
    with _Folder.lock:  # threads of one run launch browsers at the same time
        if not path.exists():
            quoted = " ".join(shlex.quote(a) for a in args)
            text = ("#!/bin/sh\n# Written by kb (kb/x/browser_room.py): Chromium in a bubblewrap room.\n"
                    f'exec {quoted} "$@"\n')
            partial = path.with_suffix(".partial")
            partial.write_text(text)
            partial.chmod(0o700)
            partial.rename(path)
        _room_launchers.add(str(path))
    return str(path)


_room_launchers: set[str] = set()


def runs_in_room(options: dict) -> bool:
    """True when these launch options (sandbox_options()) start Chromium in
    the room: its contexts then reach their proxies through the gate
    (room_proxy()), as the room has no network."""
    return options.get("executable_path") in _room_launchers


def chromium_env(plan: SandboxPlan, *, headless: bool, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Chromium's whole environment: the allowlisted names of `environ`
    (default os.environ), a system PATH, and a HOME of kb's own."""
    environ = os.environ if environ is None else environ
    names = BROWSER_ENV_NAMES + (() if headless else DISPLAY_ENV_NAMES)
    env = {name: environ[name] for name in names if name in environ}
    env["PATH"] = BROWSER_PATH
    if plan.mode == "room":
        env["HOME"] = env["TMPDIR"] = ROOM_HOME
    else:
        env["HOME"] = str(browser_home())
    return env


def driver_env(environ: dict[str, str]) -> dict[str, str]:
    """The Playwright driver's environment: the allowlisted names only."""
    return {name: value for name, value in environ.items()
            if name in DRIVER_ENV_NAMES or name.startswith(DRIVER_ENV_PREFIXES)}


def sandbox_options(chromium: str | None, *, headless: bool) -> dict:
    """The launch options of Playwright that set the sandbox, the room and
    the environment."""
    plan = sandbox_plan(chromium, headless=headless)
    options: dict = {"chromium_sandbox": plan.sandbox_on, "env": chromium_env(plan, headless=headless)}
    if chromium:
        options["executable_path"] = room_launcher(chromium) if plan.mode == "room" else chromium
    return options


# Playwright starts its driver with a copy of os.environ; kb's one door to
# Playwright's private modules (kb/x/playwright_internals.py) gives it
# driver_env() of that copy instead.
filter_driver_env(driver_env)
