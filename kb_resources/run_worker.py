"""The tags that say where a run worker lives: its host and the boot of
that host. kb's run launcher (kb_assets/run_launcher.py) checks a worker's
process id only when the worker lives on the host of the check, in the same
boot. Every kb resource tags its run when it starts in a run worker."""

from __future__ import annotations

import socket
from pathlib import Path

import dagster as dg

HOST_TAG = "kb/host"
BOOT_TAG = "kb/boot_id"
# Linux gives each start of the machine a new random id. Containers of one
# machine share it, so the host name tells two containers apart.
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """The id of this start of the machine; empty where the system has none."""
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return ""


def worker_tags() -> dict[str, str]:
    """The tags that say where a run worker lives: its host and the boot of that host."""
    return {HOST_TAG: socket.gethostname(), BOOT_TAG: boot_id()}


_tagged_runs: set[str] = set()


def tag_run_with_worker(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """Tag the run with the host and the boot of this process, its worker.
    Once per run and process: each later step of the run has the tags already."""
    if run.run_id in _tagged_runs:
        return
    tags = worker_tags()
    if any(run.tags.get(key) != value for key, value in tags.items()):
        instance.add_run_tags(run.run_id, tags)
    _tagged_runs.add(run.run_id)


