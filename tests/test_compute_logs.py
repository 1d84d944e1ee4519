"""A step's output goes to its compute log files with no helper process.

Dagster's default compute log manager starts `tail -F` helpers that ignore
SIGTERM in a run worker that was started with SIGINT ignored (a start in the
background). kb stops a stuck step by stopping its worker: the helpers then
lived on (issue 55: 8 after one run of the suite)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import yaml

from kb_assets.instance_config import ensure_dagster_home

WORKER = textwrap.dedent("""
    import signal, sys, time
    import dagster as dg

    # As Dagster's run worker does (setup_interrupt_handlers): SIGTERM does what
    # SIGINT does, and SIGINT is ignored in a process started in the background.
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))

    @dg.op
    def stuck_step():
        print("the step speaks", flush=True)
        print("the step warns", file=sys.stderr, flush=True)
        open(sys.argv[1], "w").close()
        time.sleep(120)  # a wedged step: kb stops it

    @dg.job
    def stuck_job():
        stuck_step()

    with dg.DagsterInstance.get() as instance:
        stuck_job.execute_in_process(instance=instance)
""")


def helpers_of(home: Path) -> list[psutil.Process]:
    """The `tail` helpers (and their watchers) that follow a file of `home`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if str(home) in line and ("tail" in line.split(" ")[0] or "watch_orphans" in line):
            found.append(process)
    return found


def test_a_stopped_step_leaves_no_log_helper_and_its_output_is_in_its_log_files(kb_home, tmp_path):
    home = ensure_dagster_home()
    assert yaml.safe_load((home / "dagster.yaml").read_text())["compute_logs"]["class"] == "KbComputeLogManager"
    started = tmp_path / "started"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # SIGINT ignored, as a shell gives it to a job that it starts in the background.
    worker = subprocess.Popen([sys.executable, str(script), str(started)], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), worker.stderr.read().decode()[-2000:] if worker.poll() is not None else "no start"
        assert helpers_of(home) == []  # none while the step runs
        # kb's stop of a stuck step: SIGTERM (ignored here, as in the owner's run worker), then SIGKILL.
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        worker.kill()
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    time.sleep(1.5)  # Dagster's watcher looks each second
    assert helpers_of(home) == []
    # The honest path: the output is in the step's log files (the UI reads them) and on the terminal.
    logs = list((home / "storage").rglob("*.out"))
    assert any(b"the step speaks" in path.read_bytes() for path in logs), logs
    assert any(b"the step warns" in path.read_bytes() for path in (home / "storage").rglob("*.err"))
    assert b"the step speaks" in out and b"the step warns" in err


def test_kb_s_dagster_yaml_of_an_earlier_version_gets_the_compute_log_manager(kb_home):
    """An owner's home from before this change has kb's own dagster.yaml with
    no compute_logs section: kb writes it again, so its helpers go too. A
    file edited by hand stays as it is."""
    from kb_assets.instance_config import DAGSTER_YAML, dagster_yaml

    home = kb_home / "dagster"
    home.mkdir()
    earlier = {k: v for k, v in yaml.safe_load(dagster_yaml()).items() if k != "compute_logs"}
    (home / "dagster.yaml").write_text(yaml.safe_dump(earlier))
    ensure_dagster_home()
    assert yaml.safe_load((home / "dagster.yaml").read_text())["compute_logs"]["class"] == "KbComputeLogManager"
    edited = {**earlier, "retention": {"schedule": {"purge_after_days": 7}}}
    (home / "dagster.yaml").write_text(yaml.safe_dump(edited))
    ensure_dagster_home()
    assert "compute_logs" not in yaml.safe_load((home / "dagster.yaml").read_text())
    assert "compute_logs" in yaml.safe_load(DAGSTER_YAML)
