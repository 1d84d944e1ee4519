"""The weeks of the wiki: which sources a weekly synthesis covers, read
from the wiki's git history, and the page of a week without sources."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from kb.wiki.finish import add_to_index, append_log
from kb.wiki.repo import Wiki
from kb.wiki.schema import INGEST_PREFIX, SYNTHESIS_PREFIX, WEEKLY, render_page
from kb.wiki_files import write_wiki_file


def iso_week_label(day: date) -> str:
    year, week, _ = day.isocalendar()
    return f"{year}-W{week:02d}"


def monday_of(day: date) -> date:
    """The Monday of the week of `day`: the key of its synthesis partition."""
    return day - timedelta(days=day.weekday())


WEEKLY_PREFIX = f"{SYNTHESIS_PREFIX} weekly"  # the commit of each weekly synthesis


def week_ingest_commits(wiki: Wiki, week_start: date, tz: str) -> list[tuple[str, str]]:
    """The ingest commits since the last weekly synthesis, newest first.

    Why not the seven days of the week: the synthesis runs on Sunday at
    09:00, so a source of Sunday afternoon fell into no synthesis. The
    history of the wiki says which sources a synthesis has seen. With no
    weekly synthesis before, the window starts on the Monday of the week."""
    out = wiki.git("log", "--first-parent", "--format=%H%x09%s")
    commits = []
    for line in out.splitlines():
        sha, _, subject = line.partition("\t")
        if subject.startswith(WEEKLY_PREFIX):
            return commits
        if subject.startswith(INGEST_PREFIX):
            commits.append((sha, subject))
    start = datetime.combine(week_start, datetime.min.time(), tzinfo=ZoneInfo(tz))
    return wiki.log_between(start.isoformat(), (datetime.now(ZoneInfo(tz)) + timedelta(days=1)).isoformat(),
                            INGEST_PREFIX)


def changed_pages(wiki: Wiki, commits: list[tuple[str, str]]) -> list[str]:
    """The entity and concept pages that these ingest commits changed: the
    synthesis reads them with the week's source pages."""
    paths = {path for sha, _ in commits for path in wiki.paths_changed_in(sha)}
    return sorted(p for p in paths if p.startswith(("wiki/entities/", "wiki/concepts/")) and p.endswith(".md"))


def ingested_slugs(commits: list[tuple[str, str]]) -> list[str]:
    """Slugs of the sources of these ingest commits (week_ingest_commits)."""
    return sorted({subject.removeprefix(INGEST_PREFIX).strip().split()[0] for _, subject in commits
                   if subject.removeprefix(INGEST_PREFIX).strip()})


def write_empty_week(root: Path, label: str, week_start: date) -> None:
    page = root / "wiki" / "syntheses" / "weekly" / f"{label}.md"
    week_end = (week_start + timedelta(days=6)).isoformat()
    write_wiki_file(root, page, render_page(
        WEEKLY, {"type": "synthesis", "kind": "weekly", "week": label, "source_count": 0, "themes": [],
                 "created": date.today().isoformat()},
        f"Weekly Synthesis · {label} · Thin week",
        {"Theme of the week": [f"Thin week: no new sources from {week_start.isoformat()} to {week_end}."],
         "Open questions": ["- none"], "Reading list": ["- none"]},
    ).encode())
    add_to_index(root, "Syntheses", f"syntheses/weekly/{label}")
    append_log(root, f"{label} synthesis", [f"thin week: no new sources, [[syntheses/weekly/{label}]]"])
