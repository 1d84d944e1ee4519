"""The facts that each benchmark figure names: the commit of the code that
ran and the load of the machine.

The machine is shared, so a time means little without the load at the time
it was taken (issue 49, point 5). A figure of code with changes that are not
committed says so: the commit alone would name other code.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def code_commit() -> str:
    """The short hash of HEAD, with "+changes" when kb/ or benchmarks/ hold
    changes that are not committed; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
        changes = subprocess.run(["git", "status", "--porcelain", "--", "kb", "kb_assets", "benchmarks"], cwd=REPO,
                                 check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if changes else "")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    return [round(value, 2) for value in os.getloadavg()]


def run_facts() -> dict:
    """The commit and the load now: call it before and after a measurement."""
    return {"commit": code_commit(), "load_average": load_average()}
