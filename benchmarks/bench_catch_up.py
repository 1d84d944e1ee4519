"""Catch-up benchmark: the runs and the seconds of a sync whose earlier
batches hold work that waits (issue 57, "Partitions say what they hold").

For N = 0 .. --max-waiting: N sample pages are imported, one batch each,
with `--no-post` (the posts of those batches stay out of the index and
wait for it), then one more page with a plain import: that import is
measured. It makes the new batch's run plus the catch-up of the N earlier
batches: one run of `x_catch_up` per batch (since issue 57), or none
(before, the new batch's run took every batch's waiting items).

Every step goes through kb.apps.sync.run_sync (the code of `kb import`), in
this process, in a new temporary KB_HOME per N, with the deterministic hash
embedder and KB_EXCLUDE=link (no network). No kb up runs, so the runs
execute here one after another. A warm-up import of one page in a
throw-away KB_HOME comes first: imports and Dagster's first run do not count.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_catch_up.py --max-waiting 3 --out /tmp/catch_up.json

To measure the code before a change, point PYTHONPATH at a checkout of it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def home(root: Path, name: str) -> None:
    os.environ["KB_HOME"] = str(root / name)
    os.environ["DAGSTER_HOME"] = str(root / name / "dagster")


def measure(root: Path, waiting: int) -> dict:
    from kb.apps.sync import run_sync
    from kb.sample_data import sample_pages

    pages = [str(p) for p in sample_pages()]
    home(root, f"waiting-{waiting}")
    for page in pages[:waiting]:
        report = run_sync(files=[page], exclude=["link", "post"])
        assert not report.failed, report.failed
    wall, cpu = time.perf_counter(), time.process_time()
    report = run_sync(files=[pages[waiting]], exclude=["link"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert not report.failed, report.failed
    return {"waiting_batches": waiting, "runs": len(report.run_ids), "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "stages": len(report.stages)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-waiting", type=int, default=3, help="most earlier batches that wait (at most 3)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("KB_EMBED_BACKEND", "hash")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="kb-bench-catch-up-") as tmp:
        root = Path(tmp)
        from kb.apps.sync import run_sync
        from kb.sample_data import sample_pages

        home(root, "warm-up")
        run_sync(files=[str(sample_pages()[0])], exclude=["link"])
        results = [measure(root, n) for n in range(min(args.max_waiting, 3) + 1)]
    out = {"load_average": [round(x, 2) for x in os.getloadavg()], "results": results}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
