"""All the CPU of a test suite run, by kind of process (issue 57, point 7).

benchmarks/suite_cpu.py counts the CPU of each pytest process and of the
children that it waited for. It misses the processes that nobody waits
for: the wiki agent's CLI and the browser in their bubblewrap rooms, Dagster
run workers and servers whose parent ended first. On 6 December 2026 that
was about 210 s of 770 s. The kernel's process accounting (Debian's `acct`)
writes one record for each process that ends, whoever its parent was:

    accton /tmp/suite.acct            # as root; apt-get install acct
    CI=true .venv/bin/pytest -n 3 --ignore=tests/test_containers.py --ignore=tests/test_month.py
    accton off
    .venv/bin/python benchmarks/suite_acct.py /tmp/suite.acct

Each record names the process by the name of its last thread, so the report
puts the names into kinds (Python, Chromium, the agent's CLI). Other work on
the machine in the same time counts too: run nothing else, or give the
process id of a shell whose children to leave out (`--leave-out PID`).
"""

from __future__ import annotations

import argparse
import collections
import subprocess

CHROMIUM = ("chromium", "chrome", "HangWatcher", "ThreadPool", "Compositor", "Chrome_", "Perfetto", "VizCompositor",
            "CrGpuMain", "GpuMemory", "MemoryInfra", "DedicatedWorker", "CacheThread", "NetworkService",
            "AudioThread", "VideoFrame", "inotify_reader", "sandbox_ipc")
AGENT_CLI = ("claude", "JSCWarmUp", "JITWorker", "mi-scavenger", "fs.watch", "HeapHelper", "HTTP Client",
             "HTTPClient", "Bun", "SignalInspector", "File Watcher")
PYTHON = ("python", "kb", "pytest", "jemalloc_bg_thd", "lance", "lifeguard", "grpc_global", "dagster")


def kind(name: str) -> str:
    for title, prefixes in (("Chromium", CHROMIUM), ("agent CLI", AGENT_CLI), ("Python", PYTHON)):
        if name.startswith(prefixes):
            return title
    return "other"


def records(path: str) -> list[dict]:
    text = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split("|")]
        rows.append({"name": fields[0], "cpu": (float(fields[2]) + float(fields[3])) / 100,
                     "pid": int(fields[9]), "ppid": int(fields[10])})
    return rows


def report(path: str, leave_out: set[int]) -> None:
    rows = records(path)
    children = collections.defaultdict(list)
    for row in rows:
        children[row["ppid"]].append(row)
    left_out: set[int] = set()
    stack = [row for pid in leave_out for row in children[pid]]
    while stack:
        row = stack.pop()
        left_out.add(row["pid"])
        stack.extend(children[row["pid"]])
    kept = [row for row in rows if row["pid"] not in left_out]
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for row in kept:
        total = by_kind[kind(row["name"])]
        total[0] += row["cpu"]
        total[1] += 1
    orphans = sum(row["cpu"] for row in kept if row["ppid"] == 1)
    print(f"{len(kept)} processes, {sum(row['cpu'] for row in kept):.1f} s of CPU "
          f"({orphans:.1f} s in processes whose parent had ended); left out {len(left_out)} processes")
    for title, (cpu, count) in sorted(by_kind.items(), key=lambda item: -item[1][0]):
        print(f"{cpu:8.1f} s {count:6d}  {title}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="the file that accton wrote")
    parser.add_argument("--leave-out", type=int, action="append", default=[],
                        help="leave out the processes below this process id (other work)")
    arguments = parser.parse_args()
    report(arguments.file, set(arguments.leave_out))
