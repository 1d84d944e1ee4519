"""A month in minutes (issue 55, part 3): `kb up` through 30 simulated days
with the obedient agent, an outage of the model endpoint, a SIGKILL of kb up
on day 10 and a backup on day 20 restored into a fresh home. tests/month.py
drives the month; this test checks its end. benchmarks/bench_month.py runs
the same month and prints its counts."""

from __future__ import annotations

import os

import pytest

from tests.month import Month, month_findings, tell_counts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("kb_home")]


@pytest.mark.timeout(7200)  # 30 days of kb up; on two quiet cores the figure is in benchmarks/month.md
def test_a_month_of_kb_up_keeps_every_source_and_the_wiki_coherent(tmp_path):
    # KB_MONTH_DAYS and KB_MONTH_EVENTS (outage, topic, kill, backup: 2,3,4,5) give
    # a short month with every event, for a quick loop; the default is the month.
    month = Month(tmp_path / "month", days=int(os.environ.get("KB_MONTH_DAYS", "30")))
    if os.environ.get("KB_MONTH_EVENTS"):
        month.outage_day, month.topic_day, month.kill_day, month.backup_day = map(
            int, os.environ["KB_MONTH_EVENTS"].split(","))
    with month:
        month.run()
        findings = month_findings(month)
        counts = month.counts()
    summary = tell_counts(counts) + "\n" + "\n".join(month.log[-40:])

    # The outage: each source of that day failed at the wiki, and the owner heard why, once.
    outage = [i for i in month.items if i.day == month.outage_day and i.expect == "wiki"]
    assert outage and all((month.final_reply(i) or "").startswith("Ingest failed") for i in outage), summary
    assert all("529" in month.final_reply(i) or "Overloaded" in month.final_reply(i) for i in outage), summary
    assert month.agent.failed_requests > 0
    # Every change that the obedient agent was asked for landed (the SIGKILL
    # of day 10 may cut one ingest in the middle: its run retry lands it).
    ingested = sum((month.final_reply(i) or "").startswith("Ingested") for i in month.items)
    assert counts["ingest"]["landed"] == ingested, summary
    assert counts["synthesis"]["landed"] == len(month.week_labels()) and counts["topic"]["landed"] == 1, summary
    for workflow, count in counts.items():
        if not count["refused"]:
            assert 0 <= count["asked"] - count["landed"] <= (1 if workflow == "ingest" else 0), summary

    for check in ("sources", "weekly syntheses", "search", "told twice", "processes left", "home size"):
        assert findings[check] == [], f"{check}: {findings[check]}\n{summary}"
    refused = {w: c["refused"] for w, c in counts.items() if c["refused"]}
    # Issue 55: every obedient change lands (kb's rules and its playbook are one design).
    assert not refused, summary
    assert findings["lint commits"] == [], summary
    assert findings["wiki check"] == [], summary
    print(summary)
