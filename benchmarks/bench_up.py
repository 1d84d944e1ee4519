"""Start-up cost of `kb up`: time until the Dagster UI answers, and the CPU
time and resident memory of all its processes.

    .venv/bin/python benchmarks/bench_up.py [--runs 2] [--settle 60]

Each run starts `python -m kb.apps.cli up --no-bot` on a new, empty KB_HOME
(KB_EMBED_BACKEND=hash) with free ports. It measures:
- ready: the seconds from the start until the webserver answers a GraphQL
  query and shows the code location `kb` as loaded;
- the CPU time (user + system) of kb up and all its descendants at ready,
  and again after --settle seconds of idle running (the daemon ticks);
- the resident memory (RSS) and the CPU time of each process after
  --settle, and the sum of the RSS.
Processes that ended before a sample do not count. Give PYTHONPATH to
measure another checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

LOCATION_QUERY = '{"query": "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus ' \
                 'locationOrLoadError { __typename } } } } }"}'
READY_LIMIT_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def location_loaded(port: int) -> bool:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=LOCATION_QUERY.encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            entries = json.load(answer)["data"]["workspaceOrError"]["locationEntries"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(e["name"] == "kb" and e["loadStatus"] == "LOADED"
               and e["locationOrLoadError"]["__typename"] == "RepositoryLocation" for e in entries)


def tree(root: psutil.Process) -> list[psutil.Process]:
    return [root, *root.children(recursive=True)]


def label(process: psutil.Process) -> str:
    try:
        argv = process.cmdline()
    except psutil.Error:
        return "?"
    words = [os.path.basename(a) for a in argv[1:6] if not a.startswith("-")]
    return " ".join(words)[:70]


def cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def one_run(settle_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-up-") as home:
        dagster_port = free_port()
        env = {**os.environ, "KB_HOME": home, "KB_EMBED_BACKEND": "hash", "HF_HUB_OFFLINE": "1"}
        env.pop("TELEGRAM_BOT_TOKEN", None)
        started = time.monotonic()
        up = subprocess.Popen([sys.executable, "-m", "kb.apps.cli", "up", "--no-bot", "--dagster-port",
                               str(dagster_port), "--web-port", str(free_port())], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        root = psutil.Process(up.pid)
        try:
            while not location_loaded(dagster_port):
                if up.poll() is not None or time.monotonic() - started > READY_LIMIT_S:
                    raise SystemExit(f"kb up did not get ready; read the logs in {home}/logs")
                time.sleep(0.2)
            ready_s = time.monotonic() - started
            cpu_ready = cpu_s(tree(root))
            time.sleep(settle_s)
            processes = tree(root)
            cpu_settled = cpu_s(processes)
            rss, cpu = {}, {}
            for process in processes:
                name = f"{process.pid} {label(process)}"
                try:
                    rss[name] = process.memory_info().rss / 2**20
                    cpu[name] = cpu_s([process])
                except psutil.Error:
                    pass
        finally:
            up.terminate()
            up.wait(timeout=60)
    return {"ready_s": ready_s, "cpu_ready_s": cpu_ready, "cpu_settled_s": cpu_settled, "rss_mib": rss, "cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--settle", type=float, default=60.0)
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        result = one_run(args.settle)
        results.append(result)
        print(f"run {run + 1}: ready {result['ready_s']:.1f} s, CPU at ready {result['cpu_ready_s']:.1f} s, "
              f"CPU after {args.settle:.0f} s more {result['cpu_settled_s']:.1f} s, "
              f"RSS {sum(result['rss_mib'].values()):.0f} MiB in {len(result['rss_mib'])} processes",
              flush=True)
        for name, mib in sorted(result["rss_mib"].items(), key=lambda kv: -kv[1]):
            print(f"    {mib:7.0f} MiB  {result['cpu_s'].get(name, 0):5.1f} s CPU  {name}")
    print(f"median: ready {statistics.median(r['ready_s'] for r in results):.1f} s, "
          f"CPU at ready {statistics.median(r['cpu_ready_s'] for r in results):.1f} s, "
          f"CPU settled {statistics.median(r['cpu_settled_s'] for r in results):.1f} s, "
          f"RSS {statistics.median(sum(r['rss_mib'].values()) for r in results):.0f} MiB")


if __name__ == "__main__":
    main()
