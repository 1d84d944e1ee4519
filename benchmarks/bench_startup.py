"""Start-up import time of the serving apps (kb-mcp, the bot) and the `kb` command.

    .venv/bin/python benchmarks/bench_startup.py [--runs 5]

Each run is a fresh interpreter. It prints the median wall time of the
import, whether Dagster or DuckDB was loaded (the MCP server must load
neither), and the five heaviest top-level packages by Python's -X importtime.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"kb-mcp": "mcp_server.server", "kb-bot": "telegram_bridge.bot", "kb": "kb.apps.cli"}
PROBE = "import sys, {module}; print(int('dagster' in sys.modules), int('duckdb' in sys.modules))"


def one_run(module: str) -> tuple[float, str, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE.format(module=module)],
                          cwd=REPO, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, done.stdout.strip(), done.stderr


def heaviest(importtime: str, count: int = 5) -> list[tuple[str, float]]:
    totals: dict[str, float] = {}
    for line in importtime.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if match and not match.group(2):  # top level only
            totals[match.group(3)] = int(match.group(1)) / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])[:count]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for name, module in TARGETS.items():
        walls, loaded, last = [], "", ""
        for _ in range(args.runs):
            wall, loaded, last = one_run(module)
            walls.append(wall)
        dagster, duckdb = loaded.split()
        tops = ", ".join(f"{pkg} {secs:.2f} s" for pkg, secs in heaviest(last))
        print(f"{name:<7} median {statistics.median(walls):.2f} s  dagster loaded: {dagster == '1'}  "
              f"duckdb loaded: {duckdb == '1'}  heaviest: {tops}")


if __name__ == "__main__":
    main()
