"""A month in minutes (issue 55, part 3): `kb up` through 30 simulated days,
with the obedient agent, an outage of the model endpoint, a SIGKILL of kb up
and a backup restored into a fresh home (tests/month.py tells the month).

    KB_SHARED_DIR=../shared .venv/bin/python benchmarks/bench_month.py [--days 30] [--keep]

It prints, per wiki workflow (ingest, lint, synthesis, topic), how many
changes the agent was asked for, landed, were refused, were retried and
failed; then the wall time of the month and of each kb up; the size of
KB_HOME; and every check of the end that does not hold. Give PYTHONPATH to
measure another checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.month import Month, month_findings, tell_counts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--events", default="", help="a short month: the days of the outage, the topic, "
                        "the kill and the backup, as 2,3,4,5")
    parser.add_argument("--keep", action="store_true", help="keep the homes (their path is printed)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    base = Path(tempfile.mkdtemp(prefix="kb-month-"))
    month = Month(base, days=args.days)
    if args.events:
        month.outage_day, month.topic_day, month.kill_day, month.backup_day = map(int, args.events.split(","))
    started = time.monotonic()
    try:
        with month:
            try:
                month.run()
            finally:
                print("\n".join(month.log), flush=True)
            findings = month_findings(month)
        print()
        print(tell_counts(month.counts()))
        print(f"\nmonth: {args.days} days in {time.monotonic() - started:.0f} s of wall time; "
              f"kb up segments: {', '.join(f'{s:.0f} s' for s in month.segment_seconds)}")
        print("KB_HOME: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in month.home_sizes.items()))
        failed = {check: problems for check, problems in findings.items() if problems}
        for check, problems in findings.items():
            print(f"check {check}: {'holds' if not problems else f'{len(problems)} problems'}")
            for problem in problems[:10]:
                print(f"    {problem}")
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"homes kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
