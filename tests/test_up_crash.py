"""Parts die with `kb up` (issue 46, part 4): the lifeline, the record of
kb up and the stop of a kb up that refuses to start. The whole crash (SIGKILL
of a real kb up, and the next kb up) is in tests/test_up.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from kb.apps.lifeline import ENV_NAME, Lifeline
from tests.test_up import PARTS_END_S, running, still_running_after, wait_until

# A part as kb up starts it (through kb.apps.quick_exit), with a child that
# ignores SIGTERM: only SIGKILL to the group ends the child.
PART_SCRIPT = """\
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('child', os.getpid(), os.environ.get('{env}'), flush=True); time.sleep(300)"])
print('part', os.getpid(), flush=True)
time.sleep(300)
"""


def test_a_part_stops_its_whole_group_when_the_lifeline_of_kb_up_breaks(tmp_path):
    script = tmp_path / "part.py"
    script.write_text(PART_SCRIPT.format(env=ENV_NAME))
    lifeline = Lifeline()
    env = {**os.environ, **lifeline.env()}
    part = subprocess.Popen([sys.executable, "-m", "kb.apps.quick_exit", str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, pass_fds=(lifeline.read_fd,))
    try:
        lines = [part.stdout.readline().split() for _ in range(2)]
        pids = {words[0]: int(words[1]) for words in lines}
        child_line = next(words for words in lines if words[0] == "child")
        assert child_line[2] == "None"  # the part's children do not get the lifeline
        assert running(pids["child"]) and part.poll() is None
        lifeline.close()  # what the kernel does when kb up dies
        assert still_running_after([part.pid, pids["child"]], PARTS_END_S) == []
        assert "kb up ended without stopping this part" in part.stderr.read()
    finally:
        lifeline.close()
        if part.poll() is None:
            os.killpg(part.pid, signal.SIGKILL)
        part.wait()


def test_a_process_that_does_not_lead_its_group_takes_no_lifeline(tmp_path):
    """A child that got KB_UP_LIFELINE (and the pipe) must not stop the
    group of its parent when kb up ends: the group is not its own."""
    lifeline = Lifeline()
    leader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import subprocess, sys
        child = subprocess.run([sys.executable, "-c",
            "from kb.apps.lifeline import watch_lifeline; print(watch_lifeline())"],
            pass_fds=({lifeline.read_fd},), capture_output=True, text=True)
        print(child.stdout.strip(), child.stderr.strip(), flush=True)
        import time; time.sleep(300)
        """)], env={**os.environ, **lifeline.env()}, stdout=subprocess.PIPE, text=True,
        start_new_session=True, pass_fds=(lifeline.read_fd,))
    try:
        answer = leader.stdout.readline()
        assert answer.startswith("False "), answer
        assert "this process does not lead its process group" in answer
    finally:
        lifeline.close()
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def sleeper(**env: str) -> subprocess.Popen:
    """A process that leads its own group, as each part of kb up."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                            env={**os.environ, **env})


def test_the_next_kb_up_stops_only_the_recorded_processes_of_a_dead_kb_up(kb_home, capsys):
    """A record names a pid with the start time of its process. A pid whose
    process started at another time is another program now (pids are used
    again): kb up leaves it alone. So it does with a process that does not
    run for this KB_HOME, as a forged record could name."""
    import json

    from kb.apps.up import take_home
    from kb.settings import get_settings

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # the pid of a kb up that has ended
    recorded, stranger = sleeper(), sleeper()
    foreign = sleeper(KB_HOME=str(kb_home.parent / "another-home"))
    try:
        started = psutil.Process(recorded.pid).create_time()
        other_start = psutil.Process(stranger.pid).create_time() - 30.0
        record = {"pid": dead.pid, "started": 0.0, "parts": [
            {"name": "dagster-daemon", "pid": recorded.pid, "pgid": recorded.pid, "started": started},
            {"name": "dagster-webserver", "pid": stranger.pid, "pgid": stranger.pid, "started": other_start},
            {"name": "kb-bot", "pid": foreign.pid, "pgid": foreign.pid,
             "started": psutil.Process(foreign.pid).create_time()}]}
        (kb_home / "run").mkdir()
        (kb_home / "run" / "kb-up.json").write_text(json.dumps(record))
        (kb_home / "dagster").mkdir()

        taken = take_home(get_settings())
        out = capsys.readouterr().out
        assert out == (f"kb up: stopped dagster-daemon (pid {recorded.pid}) of an earlier kb up "
                       f"(pid {dead.pid}) that ended without its stop.\n")
        assert still_running_after([recorded.pid], 1.0) == []
        assert running(stranger.pid) and running(foreign.pid)
        # The heartbeats of the stopped daemon are old now: the next check does not block.
        assert float((kb_home / "dagster" / "kb-up-stopped-at").read_text()) <= time.time()
        taken.release()
        assert not (kb_home / "run" / "kb-up.json").exists()
    finally:
        for process in (recorded, stranger, foreign):
            process.kill()
            process.wait()


def test_the_next_kb_up_fails_the_runs_that_were_starting_when_kb_up_died(kb_home, capsys):
    """A run that was STARTING when kb up got SIGKILL has no worker: the next
    kb up fails it at once (Dagster's start timeout would wait 180 s), and
    only it: a started run (run monitoring checks its worker) and a finished
    run stay as they are."""
    import json

    import dagster as dg

    from kb.apps.up import take_home
    from kb.settings import get_settings
    from kb_assets.instance_config import ensure_dagster_home

    settings = get_settings()
    ensure_dagster_home(settings)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (kb_home / "run").mkdir(exist_ok=True)
    (kb_home / "run" / "kb-up.json").write_text(json.dumps({"pid": dead.pid, "started": 0.0, "parts": []}))
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        runs = {status: instance.add_run(dg.DagsterRun(job_name="wiki_ingest_job", status=status)).run_id
                for status in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                               dg.DagsterRunStatus.SUCCESS)}

    take_home(settings).release()
    starting = runs[dg.DagsterRunStatus.STARTING]
    assert capsys.readouterr().out == (f"kb up: run {starting} of wiki_ingest_job was starting when the earlier kb "
                                       "up ended: it is failed now, and its run retry (if it has one left) starts "
                                       "it again.\n")
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        assert {s: instance.get_run_by_id(r).status for s, r in runs.items()} == {
            dg.DagsterRunStatus.STARTING: dg.DagsterRunStatus.FAILURE,
            dg.DagsterRunStatus.STARTED: dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.SUCCESS: dg.DagsterRunStatus.SUCCESS}
        [failure] = instance.get_records_for_run(starting, of_type=dg.DagsterEventType.RUN_FAILURE).records
        assert "its worker never started" in failure.event_log_entry.dagster_event.message


@pytest.mark.parametrize("failure", ["cannot start", "dies before it answers"])
def test_a_kb_up_that_refuses_to_start_stops_the_parts_that_it_started(tmp_path, failure):
    """The search page (with a child) and the code server run; then the
    code server dies, or the daemon cannot start. kb up refuses, and no
    process of the parts that it started runs on."""
    from kb.apps.up import Part, Supervisor, UpError

    web_log, code_server_log = tmp_path / "web.log", tmp_path / "code-server.log"
    web = Part("kb web", [sys.executable, "-c", "import subprocess, sys, time; "
                          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
                          "print('up', flush=True); time.sleep(300)"], "page", web_log)
    # The code server answers (or dies) after the search page has its child.
    end = "print('ready', flush=True); time.sleep(300)" if failure == "cannot start" else "sys.exit(3)"
    code_server = Part("dagster code server", [sys.executable, "-c", "import pathlib, sys, time\n"
                                               f"while 'up' not in pathlib.Path({str(web_log)!r}).read_text():\n"
                                               f"    time.sleep(0.1)\n{end}"], "grpc", code_server_log,
                       ready=lambda: "ready" in code_server_log.read_text())
    daemon_argv = ([str(tmp_path / "no-such-program")] if failure == "cannot start"
                   else [sys.executable, "-c", "import time; time.sleep(300)"])
    daemon = Part("dagster-daemon", daemon_argv, "sensors", tmp_path / "daemon.log", needs_ready=code_server)
    expected = (r"^Cannot start dagster-daemon: .* Nothing runs now\." if failure == "cannot start"
                else r"^dagster code server stopped \(exit 3\) before it answered\. Nothing runs now\.")
    with pytest.raises(UpError, match=expected):
        Supervisor([web, code_server, daemon], [], dict(os.environ), tmp_path).run()
    groups = {web.process.pid, code_server.process.pid}
    assert not [pid for pid in psutil.pids() if running(pid) and _pgid(pid) in groups]
    assert failure == "cannot start" or daemon.process is None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_kb_up_refuses_while_another_kb_up_of_the_same_home_runs(kb_home):
    """The lock of kb up: a second kb up names the pid of the first and
    changes nothing (the record of the first stays as it was)."""
    import click

    from kb.apps.cli import main
    from kb.apps.up_record import claim

    first = claim(kb_home)
    try:
        first.note([])
        record = (kb_home / "run" / "kb-up.json").read_bytes()
        # A port that is not free: a kb up that missed the lock stops at the port check.
        with socket.socket() as busy, pytest.raises(click.ClickException) as error:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            main(["up", "--no-bot", "--no-web", "--dagster-port", str(busy.getsockname()[1])], prog_name="kb",
                 standalone_mode=False)
        assert error.value.message == (f"kb up (pid {os.getpid()}) already runs for this KB_HOME ({kb_home}). "
                                       "Stop it first (Ctrl-C in its terminal, or SIGTERM to its pid).")
        assert (kb_home / "run" / "kb-up.json").read_bytes() == record
        assert not (kb_home / "dagster").exists()
    finally:
        first.release()


def test_a_child_of_a_part_that_died_does_not_outlive_kb_up(kb_home, tmp_path, capsys):
    """The code server dies and kb up starts it again; its child (a run
    worker) lives on in the old process group. The record keeps that group,
    and the stop of kb up stops the child too."""
    import json

    from kb.apps.up import Part, Supervisor
    from kb.apps.up_record import claim

    log = tmp_path / "code-server.log"
    # The first process leaves a child and dies; the next one runs.
    script = ("import os, pathlib, subprocess, sys, time\n"
              f"log = pathlib.Path({str(log)!r})\n"
              "if log.read_text().count('--- kb up: start') == 1:\n"
              "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              "    print('child', child.pid, flush=True)\n"
              "    sys.exit(1)\n"
              "time.sleep(300)\n")
    part = Part("dagster code server", [sys.executable, "-c", script], "grpc", log)
    record, child = claim(kb_home), None
    supervisor = Supervisor([part], [], {**os.environ, "KB_HOME": str(kb_home)}, tmp_path, record=record)
    try:
        supervisor.start(part)
        first = part.process.pid
        part.process.wait()
        child = int(log.read_text().split("child ")[1].split()[0])
        supervisor.watch()  # it saw the stop: it starts the part again after a second
        wait_until(lambda: (supervisor.watch(), part.process.pid != first)[1], "the second start of the part")
        recorded = json.loads(record.path.read_text())["parts"]
        assert [entry["pid"] for entry in recorded] == [first, part.process.pid]
        assert running(child)
        supervisor.stop_all()
        assert not running(child) and not running(part.process.pid)
        assert (f"kb up: stopped what was left of an earlier dagster code server (process group {first})."
                in capsys.readouterr().out)
    finally:
        record.release()
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)

