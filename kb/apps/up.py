"""`kb up`: the always-on system of kb on one machine.

It runs these parts, each as its own process:
- dagster code server: the one process that loads kb's graph. The daemon
  and the webserver reach it by gRPC on a Unix socket,
  $KB_HOME/run/code-server.sock, in a folder of mode 0700; they do not load
  the graph themselves. Why one: each of them started its own code server
  before, and each import of the graph costs seconds of CPU and hundreds of
  MB (benchmarks/kb_up.md). Why a socket: Dagster's gRPC has no
  authentication. A process that reaches it can start a run with its own
  instance settings, as kb's user (issue 56). A loopback port is open to
  every local user, and a folder of mode 0700 is open only to kb's user.
  The code server's own child (the process that loads the graph) serves on
  a socket that Dagster makes in the temp folder; kb up's umask (0077)
  makes that socket the owner's only;
- dagster-daemon: sensors (the inbox, the bot's requests, the wiki ingest),
  schedules (the daily lint, the weekly synthesis), run queue, run
  monitoring and run retries. Without it, an item that the bot queues waits
  for ever;
- dagster-webserver: the Dagster UI;
- kb-bot: the Telegram bot, when TELEGRAM_BOT_TOKEN is set;
- kb web: the search page.

Every part uses the instance under KB_HOME, with kb's dagster.yaml (written
before any part starts). The daemon and the webserver start when the code
server answers. It restarts a part that dies, with a growing wait,
and it stops every part on Ctrl-C or SIGTERM. The owner gets one notice
when a part dies, and one more when a part restarts more than 3 times in 10
minutes (then no more until the part runs healthy again). Dagster still does all the
orchestration: kb up only keeps its processes alive.

When kb up dies without its stop (SIGKILL), each part stops its own process
group (kb/apps/lifeline.py). The next kb up for the KB_HOME stops a part
that could not, from the record of the dead kb up (kb/apps/up_record.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import click

from kb.apps.lifeline import Lifeline, group_members
from kb.apps.watchdog import Watchdog
from kb.apps.log_rotation import ROTATE_EVERY_S, keep_logs_small
from kb.apps.up_record import STOP_WAIT_S, RecordError, UpRecord, claim, leftovers, stop_leftovers
from kb.settings import Settings, get_settings
from kb.store.atomic_files import write_atomic
from kb.store.private_files import make_private_folder
from kb.telegram.notifier import NotificationError, TelegramNotifier
from kb.wiki.sandbox import container_refusal, sandbox_notice

CODE_LOCATION = "kb"  # as in workspace.yaml: runs, schedules and sensors keep their names
CODE_SERVER_SOCKET = "code-server.sock"  # in $KB_HOME/run, mode 0700
# The longest path of a Unix socket on Linux (sun_path of 108 bytes, with its end byte).
SOCKET_PATH_MAX = 107
WORKSPACE_YAML = """\
# Written by `kb up` at each start: the daemon and the UI use the code
# location of the code server that kb up runs, on a Unix socket in a
# folder that only kb's user can open.
load_from:
  - grpc_server:
      socket: {socket}
      location_name: {location}
"""
# The longest wait for a part's first answer. The code server imports the
# whole graph: seconds alone, a minute or more on two busy cores.
READY_WAIT_S = 300.0
# A daemon heartbeat younger than this means that a daemon runs for this home.
HEARTBEAT_FRESH_S = 60
# Written by kb up when it has stopped its daemon: the Unix time of the stop.
STOPPED_MARKER = "kb-up-stopped-at"
FIRST_WAIT_S, LONGEST_WAIT_S = 1.0, 60.0
# A part that ran this long before it died counts as healthy: its wait starts again.
HEALTHY_RUN_S = 60.0
# A part that starts again more than this many times in this window
# restarts in a loop: the owner gets one notice of it.
RESTART_LOOP_COUNT, RESTART_LOOP_WINDOW_S = 3, 600.0
NAME_WIDTH = 19  # the column of the part names in the lines that kb up prints


class UpError(click.ClickException):
    """A cause that stops `kb up` before it starts any part."""


@dataclass
class Part:
    name: str
    argv: list[str]
    where: str  # what the owner reads: an address, or what the part does
    log: Path
    # A check that the part serves. Parts with needs_ready start after it is true.
    ready: Callable[[], bool] | None = None
    needs_ready: Part | None = None
    answered: bool = False
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    wait_s: float = FIRST_WAIT_S
    deaths: list[float] = field(default_factory=list)  # monotonic times, within RESTART_LOOP_WINDOW_S
    loop_told: bool = False  # the owner has the notice of this restart loop
    restart_at: float | None = None
    log_file: object = field(default=None, repr=False)
    # The Unix socket that the part serves on: a file that a dead part left is removed before a start.
    socket: Path | None = None

    def start(self, env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        if self.socket is not None:
            self.socket.unlink(missing_ok=True)
        self.log_file = open(self.log, "ab", buffering=0)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.log_file.write(f"\n--- kb up: start {self.name} at {stamp}\n".encode())
        # Its own process group: Ctrl-C in the terminal reaches kb up only,
        # and kb up stops each part with all of its children. pass_fds: the
        # read end of the lifeline (kb/apps/lifeline.py), so that the part
        # stops its group when kb up dies without its stop.
        self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log_file,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                        pass_fds=pass_fds)
        self.started_at = time.monotonic()
        self.restart_at = None

    def signal_group(self, sig: int) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def close_log(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


def _tool(name: str, runner: str = "kb.apps.quick_exit") -> list[str]:
    """The command of a console script of this environment (dagster,
    dagster-daemon, dagster-webserver). It runs through kb.apps.quick_exit:
    it stops within a second of SIGTERM, not after a last garbage
    collection of seconds (see that module). The webserver runs through kb.apps.guarded_webserver, which
    does the same and puts kb's guard in front of the UI."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise UpError(f"Cannot find {name} next to {sys.executable}. Install kb with its dependencies.")
    return [sys.executable, "-m", runner, str(path)]


def check_writable(settings: Settings) -> None:
    home = settings.home
    try:
        home.mkdir(parents=True, exist_ok=True)
        probe = home / ".kb-up-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UpError(f"KB_HOME {home} is not writable: {exc.strerror or exc}. "
                      "kb up needs it for the data, the Dagster home and the logs.") from exc


def check_port(host: str, port: int, option: str) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the servers bind: a port in TIME_WAIT is free for them.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = "another program listens on it" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise UpError(f"Port {port} on {host} ({option}) is not free: {reason}. "
                          f"Stop that program, or give another port with {option}.") from exc


def code_server_socket(settings: Settings) -> Path:
    """The Unix socket of the code server: $KB_HOME/run/code-server.sock, and
    the folder made private (0700). A KB_HOME whose path is too long for a
    socket gets a new private folder in the temp folder (mkdtemp makes it
    0700); kb up removes it at its end."""
    folder = settings.home / "run"
    make_private_folder(folder)
    path = folder / CODE_SERVER_SOCKET
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    return Path(tempfile.mkdtemp(prefix="kb-up-")) / CODE_SERVER_SOCKET


def code_server_answers(path: Path) -> bool:
    """True when the code server accepts a connection on its socket. The
    proxy of `dagster code-server start` opens its socket only after the
    load of the code, or after a load error (the UI then shows the error, as
    it did when the webserver loaded the code itself). A plain connection,
    not a gRPC call: the gRPC client of Dagster would stay in kb up's memory
    for all its life (its size: benchmarks/kb_up.md)."""
    try:
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(1)
            probe.connect(str(path))
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _instance(dagster_home: Path):
    """The Dagster instance of a home that kb made (it has a dagster.yaml)."""
    import dagster as dg

    # kb's SQLite storage finds its files through DAGSTER_HOME. A home that
    # kb made earlier (`kb demo`, an earlier `kb up`) has a dagster.yaml, and
    # the owner need not set DAGSTER_HOME: kb up sets it for every part anyway.
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        yield instance


def daemon_heartbeat(dagster_home: Path) -> datetime | None:
    """The time of the newest daemon heartbeat in the instance, or None."""
    if not (dagster_home / "dagster.yaml").exists():
        return None
    with _instance(dagster_home) as instance:
        beats = instance.get_daemon_heartbeats()
    if not beats:
        return None
    newest = max(beat.timestamp for beat in beats.values())
    try:
        stopped_at = float((dagster_home / STOPPED_MARKER).read_text().strip())
    except (OSError, ValueError):
        stopped_at = 0.0
    if newest <= stopped_at:
        return None  # the heartbeats of a daemon that kb up stopped
    return datetime.fromtimestamp(newest, timezone.utc)


def check_no_daemon(dagster_home: Path) -> None:
    beat = daemon_heartbeat(dagster_home)
    if beat is None:
        return
    age = (datetime.now(timezone.utc) - beat).total_seconds()
    if age < HEARTBEAT_FRESH_S:
        raise UpError(f"A Dagster daemon already runs for this KB_HOME: its last heartbeat in {dagster_home} "
                      f"is {age:.0f} s old. Stop it first (or the `kb up` that runs it); two daemons would "
                      "launch every run twice.")


def plan_parts(settings: Settings, *, host: str, dagster_port: int, code_server: Path, web_port: int,
               bot: bool, web: bool, workspace: Path, logs: Path) -> tuple[list[Part], list[str]]:
    """The parts to run, in the order of their start, and lines about the
    parts that stay off. The bot and the search page do not need the code
    server: they start while it loads."""
    # `code-server start`, not `api grpc`: its proxy loads the code in a
    # child process, so "Reload" in the UI loads changed code.
    socket_path = code_server
    code_server = Part("dagster code server", [
        *_tool("dagster"), "code-server", "start", "--socket", str(socket_path),
        "-m", "kb_assets.definitions", "--location-name", CODE_LOCATION],
        f"unix:{socket_path}, location {CODE_LOCATION}", logs / "dagster-code-server.log",
        ready=lambda: code_server_answers(socket_path), socket=socket_path)
    parts = [code_server]
    off = []
    token = settings.telegram_bot_token
    if bot and token is not None and token.get_secret_value():
        parts.append(Part("kb-bot", [sys.executable, "-m", "kb.apps.bot_runner"], "Telegram long polling",
                          logs / "kb-bot.log"))
    elif bot:
        off.append(f"{'kb-bot':<{NAME_WIDTH}} off: TELEGRAM_BOT_TOKEN is not set")
    else:
        off.append(f"{'kb-bot':<{NAME_WIDTH}} off: --no-bot")
    if web:
        parts.append(Part("kb web", [sys.executable, "-m", "kb.apps.cli", "web", "--host", host, "--port",
                                     str(web_port)], f"http://{host}:{web_port}", logs / "kb-web.log"))
    else:
        off.append(f"{'kb web':<{NAME_WIDTH}} off: --no-web")
    parts += [
        Part("dagster-daemon", [*_tool("dagster-daemon"), "run", "-w", str(workspace)],
             "sensors, schedules, run queue, run monitoring", logs / "dagster-daemon.log", needs_ready=code_server),
        # Through kb's guard: the UI answers only the owner (kb/apps/owner_guard.py).
        Part("dagster-webserver", [*_tool("dagster-webserver", "kb.apps.guarded_webserver"), "-h", host,
                                   "-p", str(dagster_port), "-w", str(workspace)], f"http://{host}:{dagster_port}",
             logs / "dagster-webserver.log", needs_ready=code_server),
    ]
    return parts, off


def run_up(*, host: str = "127.0.0.1", dagster_port: int = 3000, web_port: int = 8765, bot: bool = True,
           web: bool = True) -> int:
    settings = get_settings()
    # Every check comes before the first start: a bad input starts nothing.
    check_writable(settings)
    # Before the ports and the daemon: a leftover part of a dead kb up
    # holds a port, and its daemon's heartbeat is fresh.
    record = take_home(settings)
    lifeline = Lifeline()
    try:
        return check_and_run(settings, record, lifeline, host=host, dagster_port=dagster_port,
                             web_port=web_port, bot=bot, web=web)
    finally:
        # Supervisor.run stopped every part that it started. Each part
        # stops itself anyway when the lifeline closes (also at a crash).
        lifeline.close()
        record.release()


def check_and_run(settings: Settings, record: UpRecord, lifeline: Lifeline, *, host: str, dagster_port: int,
                  web_port: int, bot: bool, web: bool) -> int:
    check_port(host, dagster_port, "--dagster-port")
    if web:
        if web_port == dagster_port:
            raise UpError(f"--web-port and --dagster-port are both {web_port}. Give two ports.")
        check_port(host, web_port, "--web-port")
    dagster_home = settings.dagster_home
    check_no_daemon(dagster_home)
    try:
        code_server = code_server_socket(settings)
    except OSError as exc:
        raise UpError(f"Cannot make the private folder of the code server's socket: {exc}") from exc
    try:
        return _run_parts(settings, record, lifeline, host=host, dagster_port=dagster_port, web_port=web_port,
                          bot=bot, web=web, code_server=code_server)
    finally:
        if code_server.parent != settings.home / "run":  # a folder of mkdtemp
            shutil.rmtree(code_server.parent, ignore_errors=True)


def _run_parts(settings: Settings, record: UpRecord, lifeline: Lifeline, *, host: str, dagster_port: int,
               web_port: int, bot: bool, web: bool, code_server: Path) -> int:
    dagster_home = settings.dagster_home
    logs, workspace = prepare_home(settings, code_server)
    parts, off = plan_parts(settings, host=host, dagster_port=dagster_port, code_server=code_server,
                            web_port=web_port, bot=bot, web=web, workspace=workspace, logs=logs)
    env = {**os.environ, "KB_HOME": str(settings.home), "DAGSTER_HOME": str(dagster_home), **lifeline.env()}
    # The agent would run without its room, or (in a container) not at all.
    if notice := sandbox_notice(settings.kb_agent_sandbox) or container_refusal(settings.kb_agent_sandbox):
        click.echo(f"kb up: {notice}", err=True)
    supervisor = Supervisor(parts, off, env, dagster_home, TelegramNotifier.from_settings(settings),
                            record=record, lifeline=lifeline)
    # Tells the owner when the daemon or the stuck check stops while its process lives (kb/apps/watchdog.py).
    supervisor.watchdog = Watchdog(lambda: daemon_heartbeat(dagster_home), settings.home, supervisor.tell_stop)
    return supervisor.run()


def take_home(settings: Settings) -> UpRecord:
    """Take the record of kb up for this KB_HOME. An UpError when another
    kb up runs for it. The parts of an earlier kb up that died without its
    stop are stopped here, with one line for each part."""
    try:
        record = claim(settings.home)
    except RecordError as exc:
        raise UpError(str(exc)) from exc
    except OSError as exc:
        raise UpError(f"Cannot write in {settings.home / 'run'}: {exc}") from exc
    if record.earlier is None:
        return record
    earlier_pid = record.earlier.get("pid", "unknown")
    found = leftovers(record.earlier, settings.home)
    left = stop_leftovers(found, settings.home)
    for part in found:
        if part not in left:
            click.echo(f"kb up: stopped {part.name} (pid {part.pid}) of an earlier kb up (pid {earlier_pid}) "
                       "that ended without its stop.")
    if left:
        record.release(forget=False)
        names = ", ".join(f"{p.name} (process group {p.pgid})" for p in left)
        raise UpError(f"Cannot stop the parts of an earlier kb up (pid {earlier_pid}): {names}. "
                      "Stop them by hand, then start kb up again.")
    if settings.dagster_home.is_dir():
        # Its daemon is stopped: its last heartbeats are no daemon that runs.
        note_daemon_stopped(settings.dagster_home)
        for line in fail_orphaned_launches(settings.dagster_home):
            click.echo(f"kb up: {line}")
    return record


def fail_orphaned_launches(dagster_home: Path) -> list[str]:
    """Fail the runs that were STARTING when the earlier kb up died: the
    code server that was to start their worker is gone. Without this, such a
    run waits for Dagster's start timeout (start_timeout_seconds, 180 s) and
    the next monitoring poll, about 3.5 minutes, before its run retry starts
    the item again (found by the 30-day month: day 10, kill -9 of kb up).
    The failure is Dagster's own (a RUN_FAILURE event), so the run retry
    daemon of the new kb up retries the run as usual."""
    if not (dagster_home / "dagster.yaml").exists():
        return []
    import dagster as dg

    lines = []
    with _instance(dagster_home) as instance:
        for run in instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTING])):
            instance.report_run_failed(run, "The run was starting when kb up ended without its stop: its worker "
                                            "never started. kb up failed it at its next start.")
            lines.append(f"run {run.run_id} of {run.job_name} was starting when the earlier kb up ended: it is "
                         "failed now, and its run retry (if it has one left) starts it again.")
    return lines


def prepare_home(settings: Settings, code_server: Path) -> tuple[Path, Path]:
    """Write dagster.yaml, the workspace file (the code server on the Unix
    socket `code_server`) and the logs folder, and make the instance's storage.
    Returns (logs folder, workspace file)."""
    from kb_assets.instance_config import ensure_dagster_home

    try:
        ensure_dagster_home(settings)
        logs = settings.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        workspace = settings.dagster_home / "workspace.yaml"
        # JSON is YAML: the path stays one string, whatever its characters.
        workspace.write_text(WORKSPACE_YAML.format(socket=json.dumps(str(code_server)), location=CODE_LOCATION))
    except OSError as exc:
        raise UpError(f"Cannot write in {settings.home}: {exc}") from exc
    create_instance_storage(settings.dagster_home)
    return logs, workspace


def create_instance_storage(dagster_home: Path) -> None:
    """Open the instance once, so that its storage exists, with its schema
    version, before the parts start. Why: on an empty KB_HOME the daemon,
    the webserver and the bot made the SQLite files at the same time, and
    two of them wrote the schema version of the schedule storage: every
    later open failed with "Version table 'alembic_version' has more than
    one head present" (CI, December 2026)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)):
        pass  # the SQLite storage makes its files and tables when it opens


class Supervisor:
    def __init__(self, parts: list[Part], off: list[str], env: dict[str, str], dagster_home: Path,
                 notifier: TelegramNotifier | None = None, *, record: UpRecord | None = None,
                 lifeline: Lifeline | None = None):
        self.parts, self.off, self.env, self.dagster_home = parts, off, env, dagster_home
        self.notifier = notifier
        self.record = record
        self.pass_fds = (lifeline.read_fd,) if lifeline is not None else ()
        self.stopping = False
        self.notices: list[threading.Thread] = []
        self.watchdog: Watchdog | None = None

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = True

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for part in self.parts:
                if part.needs_ready is not None and not self.wait_until_ready(part.needs_ready):
                    break  # Ctrl-C or SIGTERM while it waited
                try:
                    self.start(part)
                except OSError as exc:
                    raise UpError(f"Cannot start {part.name}: {exc}. Nothing runs now.") from exc
                click.echo(f"{part.name:<{NAME_WIDTH}} {part.where}   (pid {part.process.pid}, log {part.log})")
            else:
                for line in self.off:
                    click.echo(line)
                click.echo("kb up: running. Stop with Ctrl-C.")
            rotated_at = 0.0
            while not self.stopping:
                self.watch()
                if self.watchdog is not None:
                    self.watchdog.look()
                if time.monotonic() - rotated_at >= ROTATE_EVERY_S and self.parts:
                    rotated_at = time.monotonic()
                    self.keep_logs_small()
                time.sleep(0.2)
        finally:
            self.stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        click.echo("kb up: every part stopped.")
        return 0

    def keep_logs_small(self) -> None:
        """The logs of the parts and Dagster's compute logs stay within their
        bounds (kb/apps/log_rotation.py). A file that cannot be rotated now
        is tried again at the next pass."""
        try:
            keep_logs_small(self.parts[0].log.parent, self.dagster_home)
        except OSError as exc:
            click.echo(f"kb up: could not rotate the logs: {exc}", err=True)

    def start(self, part: Part) -> None:
        """Start the part, and write it in the record of this kb up: the
        next kb up stops it if this kb up dies and the part does not stop."""
        part.start(self.env, self.pass_fds)
        if self.record is not None:
            try:
                self.record.note(self.parts)
            except OSError as exc:
                click.echo(f"kb up: could not write the record {self.record.path}: {exc}", err=True)

    def wait_until_ready(self, part: Part) -> bool:
        """Wait until the part answers its check. False if kb up must stop.
        An UpError (every part then stops) if the part dies first, or does
        not answer in time: its log tells why."""
        deadline = time.monotonic() + READY_WAIT_S
        while not part.answered and not part.ready():
            if self.stopping:
                return False
            code = part.process.poll()
            if code is not None:
                raise UpError(f"{part.name} stopped (exit {code}) before it answered. Nothing runs now. "
                              f"Read its log: {part.log}")
            if time.monotonic() > deadline:
                raise UpError(f"{part.name} did not answer within {READY_WAIT_S:.0f} s. Nothing runs now. "
                              f"Read its log: {part.log}")
            time.sleep(0.5)
        part.answered = True  # later parts need not ask again
        return True

    def watch(self) -> None:
        now = time.monotonic()
        for part in self.parts:
            if part.restart_at is not None:
                if now >= part.restart_at and not self.stopping:
                    self.start(part)
                    click.echo(f"kb up: {part.name} started again (pid {part.process.pid}).")
                continue
            code = part.process.poll()
            if code is None:
                continue
            ran = now - part.started_at
            if ran >= HEALTHY_RUN_S:
                part.wait_s, part.loop_told = FIRST_WAIT_S, False
            part.deaths = [t for t in part.deaths if now - t < RESTART_LOOP_WINDOW_S] + [now]
            line = (f"kb up: {part.name} stopped (exit {code}) after {ran:.0f} s. "
                    f"It starts again in {part.wait_s:.0f} s. Log: {part.log}")
            click.echo(line, err=True)
            if len(part.deaths) > RESTART_LOOP_COUNT and not part.loop_told:
                part.loop_told = True
                looping = (f"kb up: {part.name} restarts in a loop: {len(part.deaths)} stops in "
                           f"{RESTART_LOOP_WINDOW_S / 60:.0f} minutes. Read its log: {part.log}")
                click.echo(looping, err=True)
                self.tell(part, "looping", looping)
            elif not part.loop_told:
                self.tell(part, "stopped", line)
            part.restart_at = now + part.wait_s
            part.wait_s = min(part.wait_s * 2, LONGEST_WAIT_S)

    def tell(self, part: Part, state: str, text: str) -> None:
        """One notice to the owner, in a thread: a slow Bot API must not hold
        up a restart. Without a bot token it goes to the log and to `kb status`."""
        self._send(f"up-{re.sub(r'[^a-z0-9]+', '-', part.name.lower())}-{time.time_ns()}", state, text)

    def tell_stop(self, what: str, text: str) -> None:
        """The watchdog's notice: the daemon or the stuck check stopped."""
        click.echo(f"kb up: {text}", err=True)
        self._send(f"watchdog-{what}-{time.time_ns()}", "stopped", text)

    def _send(self, key: str, state: str, text: str) -> None:
        if self.notifier is None:
            return

        def send() -> None:
            try:
                self.notifier.notify(key, state, text)
            except NotificationError as exc:
                click.echo(f"kb up: {exc}", err=True)

        thread = threading.Thread(target=send, name=f"notice {key}", daemon=True)
        thread.start()
        self.notices.append(thread)

    def stop_all(self) -> None:
        """SIGTERM to each part's process group; SIGKILL to what is left after STOP_WAIT_S."""
        running = [p for p in self.parts if p.process is not None and p.process.poll() is None]
        for part in running:
            part.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for part in running:
            try:
                part.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for part in running:
            # The group too: a child of a part (a run worker, a code server)
            # must not outlive kb up.
            try:
                os.killpg(part.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if part.process.poll() is None:
                part.process.wait()
        # A process ends some time after its SIGKILL. Wait for the children
        # too: "every part stopped" must be true when kb up says it.
        deadline = time.monotonic() + STOP_WAIT_S
        while any(group_members(p.process.pid) for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.record is not None:
            for orphan in self.record.stop_orphans():
                click.echo(f"kb up: stopped what was left of an earlier {orphan.name} (process group {orphan.pgid}).")
        for part in self.parts:
            part.close_log()
        for thread in self.notices:
            thread.join(timeout=STOP_WAIT_S)  # a notice on its way is not cut off
        self.forget_heartbeats()

    def forget_heartbeats(self) -> None:
        """Our daemon has stopped: note the time, so that the next `kb up`
        and `kb status` do not take its last heartbeats for a daemon that
        still runs. A file, not a write to the instance: a stop must not
        wait for a database lock."""
        if any(p.process is not None and p.process.poll() is None for p in self.parts):
            return
        note_daemon_stopped(self.dagster_home)


def note_daemon_stopped(dagster_home: Path) -> None:
    """Note the time: the daemon heartbeats in the instance up to now are of
    a daemon that kb up stopped (see daemon_heartbeat)."""
    try:
        # Mode 0600 (write_atomic's temp file), as every file of KB_HOME.
        write_atomic(dagster_home / STOPPED_MARKER, f"{time.time()}\n".encode())
    except OSError as exc:
        click.echo(f"kb up: could not note the stop in {dagster_home}: {exc}", err=True)
