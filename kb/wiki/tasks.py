"""The four wiki changes that the graph runs, one function each: ingest a
source, lint the wiki, write the weekly synthesis, write a topic synthesis.

Each one builds the agent's task, runs it through the change protocol
(kb/wiki/change.py) with kb's own finishing part, and returns the outcome.
An error inside a change becomes a failed outcome, so that the caller gives
it the retries and waits of every rolled-back change. The caller decides on
retries and records the state (kb_assets/wiki/wiki_pages.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from kb.wiki.agent import WikiAgent
from kb.wiki.change import ChangeOutcome, apply_agent_change, apply_own_change, guarded
from kb.wiki.checks import check_wiki
from kb.wiki.finish import (finish_ingest, finish_lint, finish_topic, finish_weekly, superseded_parse,
                            write_lint_report)
from kb.wiki.prompts import GateDecision, ingest_prompt, lint_prompt, synthesis_prompt, topic_prompt
from kb.wiki.repo import Wiki
from kb.wiki.schema import INGEST_PREFIX, LINT_PREFIX, SYNTHESIS_PREFIX
from kb.wiki.weeks import (WEEKLY_PREFIX, changed_pages, ingested_slugs, iso_week_label, week_ingest_commits,
                           write_empty_week)
from kb.wiki_files import read_frontmatter


def ingest_source(wiki: Wiki, agent: WikiAgent, decision: GateDecision, *, now: str, max_turns: int,
                  refused: str | None = None) -> ChangeOutcome:
    """Ingest one approved source whose parsed file is in the wiki.
    `now`: the date and time of the ingest (ISO 8601). `refused`: the rules
    that refused the last try, for the agent to keep."""
    root = wiki.root()
    return guarded(lambda: apply_agent_change(
        wiki, agent, ingest_prompt(decision, read_frontmatter(root / decision.parsed_path), now, refused=refused),
        prefix=INGEST_PREFIX, max_turns=max_turns,
        # The parsed file goes into git with the ingest: the citations point to it.
        provenance=tuple(p for p in (decision.parsed_path, superseded_parse(root, decision.parsed_path)) if p),
        finish=lambda r: finish_ingest(r, decision.parsed_path),
    ))


@dataclass
class LintResult:
    outcome: ChangeOutcome
    mode: str  # "agent", or "checks only" when no agent is configured
    findings: dict  # the findings of the checks before the change
    after: dict  # the findings after it ({} when the change failed)


def lint_wiki(wiki: Wiki, agent: WikiAgent, day: str, *, max_turns: int, refused: str | None = None) -> LintResult:
    """The daily lint: the checks' findings, fixed by the agent, and a report
    page. Without an agent, the report of the checks still lands in the wiki.
    `refused`: the rules that refused the last try, for the agent to keep."""
    root = wiki.ensure()
    findings = check_wiki(root)
    if agent.configured():
        outcome = guarded(lambda: apply_agent_change(
            wiki, agent, lint_prompt(day, findings, refused), prefix=f"{LINT_PREFIX} {day}",
            max_turns=max_turns, may_delete_pages=True,
            must_exist=f"wiki/syntheses/lint/{day}.md",
            finish=lambda root: finish_lint(root, day, findings["unsupported"]),
        ))
        mode = "agent"
    else:
        outcome = apply_own_change(wiki, f"{LINT_PREFIX} {day}", lambda r: write_lint_report(r, day, findings))
        mode = "checks only"
    # A failed change fails the step: the findings after it are not needed.
    return LintResult(outcome, mode, findings, check_wiki(root) if outcome.ok else {})


@dataclass
class WeekResult:
    label: str  # the ISO week: 2026-W01
    slugs: list[str] = field(default_factory=list)  # the sources ingested in the week
    thin: bool = False  # fewer sources than the thin-week limit
    outcome: ChangeOutcome | None = None  # None: the week waits for an agent
    mode: str = ""  # "empty week", "agent", or "" while it waits


def weekly_synthesis(wiki: Wiki, agent: WikiAgent, week_start: date, *, tz: str, max_turns: int,
                     thin_week: int, refused: str | None = None) -> WeekResult:
    """The weekly synthesis of every source since the last one. A week with
    no source gets kb's own short page; a thin week says so."""
    label = iso_week_label(week_start)
    wiki.ensure()
    commits = week_ingest_commits(wiki, week_start, tz)  # one read of the history
    slugs = ingested_slugs(commits)
    page = f"wiki/syntheses/weekly/{label}.md"
    week = WeekResult(label, slugs, thin=len(slugs) < thin_week)
    if not slugs:
        week.outcome = apply_own_change(wiki, f"{WEEKLY_PREFIX} {label}",
                                        lambda r: write_empty_week(r, label, week_start))
        week.mode = "empty week"
    elif agent.configured():
        week.outcome = guarded(lambda: apply_agent_change(
            wiki, agent, synthesis_prompt(label, slugs, week.thin, changed_pages(wiki, commits), refused),
            prefix=f"{WEEKLY_PREFIX} {label}", max_turns=max_turns, must_exist=page,
            must_contain=(page, "thin week") if week.thin else None,
            finish=lambda root: finish_weekly(root, label, slugs),
        ))
        week.mode = "agent"
    return week


def topic_synthesis(wiki: Wiki, agent: WikiAgent, topic: str, *, today: str, max_turns: int,
                    refused: str | None = None) -> ChangeOutcome:
    """Write or update the synthesis page of one topic. `topic` is a topic
    key (kb.wiki.prompts.topic_key); `today` is the ISO date."""
    wiki.ensure()
    page = f"wiki/syntheses/topics/{topic}.md"
    return guarded(lambda: apply_agent_change(
        wiki, agent, topic_prompt(topic, today, refused),
        prefix=f"{SYNTHESIS_PREFIX} topic {topic}", max_turns=max_turns, must_exist=page,
        finish=lambda root: finish_topic(root, topic),
        # A second /synthesize of a topic with no new source: the agent writes
        # the same page. That is no failure (the 30-day month found 8 tries of
        # it, then a "failed" to the owner).
        nothing_new_ok=wiki.show("HEAD", page) is not None,
    ))
