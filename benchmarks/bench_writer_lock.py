"""The writer lock (kb/store/writer_lock.py) against the `filelock` library:
the time of one acquire and release with no other holder, and the wait of a
second thread of the same process.

    .venv/bin/python benchmarks/bench_writer_lock.py [--rounds 20000]

Each figure is the median of 5 runs of `rounds` acquire/release pairs, in
microseconds per pair, on a lock file in a temporary folder. Figures go into
benchmarks/libraries.md with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def per_pair_us(pair, rounds: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            pair()
        runs.append((time.perf_counter() - start) / rounds * 1e6)
    return statistics.median(runs)


def handover_ms(hold, rounds: int = 50) -> float:
    """The median time from the release of one thread to the start of the
    hold of a second thread that waited for it."""
    times = []
    for _ in range(rounds):
        released = []
        started = []
        taken = threading.Event()

        def first():
            with hold():
                taken.set()
                time.sleep(0.01)
                released.append(time.perf_counter())

        def second():
            taken.wait()
            with hold():
                started.append(time.perf_counter())

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        times.append((started[0] - released[0]) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()

    import filelock

    from kb.store import writer_lock

    folder = Path(tempfile.mkdtemp(prefix="kb-bench-lock-"))
    path = folder / "store.lock"

    def kb_pair():
        writer_lock.release(writer_lock.acquire(path, what="bench", wait_s=5))

    kb_lock = writer_lock.writer_lock(path, "bench")

    def kb_hold_pair():
        with kb_lock.hold():
            pass

    file_lock = filelock.FileLock(str(folder / "filelock.lock"), timeout=5)

    def filelock_pair():
        with file_lock:
            pass

    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"filelock {filelock.__version__}; {args.rounds} pairs per run, median of 5 runs")
    print(f"kb acquire()+release():      {per_pair_us(kb_pair, args.rounds):7.1f} us per pair")
    print(f"kb WriterLock.hold():        {per_pair_us(kb_hold_pair, args.rounds):7.1f} us per pair")
    print(f"filelock.FileLock:           {per_pair_us(filelock_pair, args.rounds):7.1f} us per pair")
    print(f"second thread waits, kb:       {handover_ms(kb_lock.hold):6.2f} ms after the release")
    print(f"second thread waits, filelock: {handover_ms(lambda: file_lock):6.2f} ms after the release")


if __name__ == "__main__":
    main()
