"""CPU seconds of each test file and test of the suite (issue 57, point 7).

The wall time of the suite follows the load of the machine; the CPU time
is the figure to compare. This file is a pytest plugin and a report:

    CPU_DIR=/tmp/suite-cpu .venv/bin/pytest -p suite_cpu -n 3 ...
    .venv/bin/python benchmarks/suite_cpu.py /tmp/suite-cpu [N]

Each pytest process (each xdist worker) writes one file of JSON lines: the
CPU (user + system) of each phase of each test, of the process itself and
of its ended children (the `kb` commands, servers and run workers that a
test started and waited for). A child that is still running at the end of
a test counts where it is waited for (a module fixture's server: at the
test after which it stops). pyproject.toml puts benchmarks/ on the path,
so `-p suite_cpu` finds this module.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys
import time

import pytest

_out = None


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _write(record: dict) -> None:
    _out.write(json.dumps(record) + "\n")
    _out.flush()


def pytest_configure(config) -> None:
    global _out
    folder = os.environ.get("CPU_DIR", "suite-cpu")
    os.makedirs(folder, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _out = open(os.path.join(folder, f"{worker}.jsonl"), "a")
    own, children = _cpu()
    _write({"start": True, "self": own, "children": children, "t": time.time(), "pid": os.getpid()})


def pytest_unconfigure(config) -> None:
    own, children = _cpu()
    _write({"end": True, "self": own, "children": children, "t": time.time()})
    _out.close()


def _phase(name: str):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item):
        own0, children0 = _cpu()
        started = time.time()
        yield
        own1, children1 = _cpu()
        _write({"id": item.nodeid, "phase": name, "self": own1 - own0, "children": children1 - children0,
                "wall": time.time() - started, "t": started})
    return hook


pytest_runtest_setup = _phase("setup")
pytest_runtest_call = _phase("call")
pytest_runtest_teardown = _phase("teardown")


def report(folder: str, top: int = 25) -> None:
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    tests: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        start = None
        for line in open(path):
            record = json.loads(line)
            if "start" in record:
                start = record
            elif "end" in record and start:
                print(f"{os.path.basename(path)}: {record['self'] - start['self']:.1f} s own CPU, "
                      f"{record['children'] - start['children']:.1f} s of ended children, "
                      f"{record['t'] - start['t']:.0f} s wall")
            elif "id" in record:
                for key, table in ((record["id"].split("::")[0], files), (record["id"], tests)):
                    table[key][0] += record["self"]
                    table[key][1] += record["children"]
                    table[key][2] += record["wall"]
    print(f"\nAll tests: {sum(v[0] for v in files.values()):.1f} s own CPU, "
          f"{sum(v[1] for v in files.values()):.1f} s of children\n")
    for title, table in (("file", files), ("test", tests)):
        print(f"{'CPU s':>7} {'own':>6} {'child':>6} {'wall s':>7}  {title}")
        for name, (own, children, wall) in sorted(table.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]:
            print(f"{own + children:7.1f} {own:6.1f} {children:6.1f} {wall:7.1f}  {name}")
        print()


if __name__ == "__main__":
    report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
