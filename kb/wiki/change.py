"""The wiki change protocol: one agent change or one change of kb's own
becomes one verified commit, or the wiki exactly as it was before.

1. Pre-flight: commit the owner's edits as `manual: pre-ingest snapshot`,
   note HEAD and the state of raw/ and index.md (`Wiki.begin_change`).
2. The agent works (it has no shell and no git) and calls report_result.
3. kb checks the working tree (only allowed paths, no secret, log.md only
   grows: `Wiki.refusals`), makes the one commit with the agent's
   commit_message, and verifies it: the right message prefix, raw/ and
   purpose.md untouched, no source page or cited claim deleted.
4. On any failure: `git reset --hard <pre-ingest SHA>` and `git clean -fdx`
   (raw/ stays). The caller decides on a retry (kb_assets/wiki/wiki_pages.py).
So the wiki is always as before, or one clean commit further.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kb.settings import redact_secrets
from kb.wiki.agent import AgentRun, WikiAgent
from kb.wiki.repo import BeforeChange, Verdict, Wiki, raw_files_lock
from kb.wiki.schema import NOTHING_NEW


@dataclass
class ChangeOutcome:
    """The end of one wiki change: its commit and pages, or the problems that rolled it back."""

    ok: bool
    sha: str = ""
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    summary: str = ""
    agent: AgentRun | None = None
    pushed: bool = False
    # success, partial or failed as the agent reported it; "" for kb's own change or no report.
    status: str = ""


def apply_agent_change(wiki: Wiki, agent: WikiAgent, prompt: str, **options) -> ChangeOutcome:
    """Run the agent for one change. The result is one verified commit, or the
    wiki exactly as it was before (then `ok` is False and `problems` says why).
    The raw/ lock keeps intake runs from writing raw/ during the change."""
    with raw_files_lock(wiki.root()):
        return _apply_agent_change(wiki, agent, prompt, **options)


def _apply_agent_change(
    wiki: Wiki,
    agent: WikiAgent,
    prompt: str,
    *,
    prefix: str,
    max_turns: int,
    may_delete_pages: bool = False,
    must_exist: str | None = None,
    must_contain: tuple[str, str] | None = None,
    finish=None,
    provenance: tuple[str, ...] = (),
    nothing_new_ok: bool = False,
) -> ChangeOutcome:
    before = wiki.begin_change()
    try:
        run = agent.run(prompt, cwd=wiki.root(), max_turns=max_turns, show_change=wiki.pending_diff)
        verdict = commit_agent_change(wiki, before, run, prefix=prefix, may_delete_pages=may_delete_pages,
                                      finish=finish, provenance=provenance, nothing_new_ok=nothing_new_ok)
        problems = list(verdict.problems)
        if not problems and must_exist and wiki.show("HEAD", must_exist) is None:
            problems.append(f"the commit has no {must_exist}")
        if not problems and must_contain:
            path, text = must_contain
            if text.lower() not in (wiki.show("HEAD", path) or "").lower():
                problems.append(f"{path} does not say {text!r}")
        warnings = list((run.report or {}).get("warnings", []))
        if not problems and verdict.sha == before.sha:
            warnings.insert(0, f"{NOTHING_NEW}: the agent changed no file, and the wiki stays as it was")
        if run.status == "partial":
            # A partial change is committed; the owner hears of it as a warning.
            warnings.insert(0, "partial: the agent did only a part of the change: "
                               + ((run.report or {}).get("summary") or "no summary"))
        warnings += [f"denied: {d}" for d in run.denied]
        if problems:
            wiki.rollback(before.sha)
            return ChangeOutcome(ok=False, problems=problems, warnings=warnings, agent=run,
                                 summary=(run.report or {}).get("summary", ""), status=run.status or "")
        log_entry = (run.report or {}).get("log_entry", "").strip()
        log_text = wiki.show("HEAD", "log.md") or ""
        if log_entry and log_entry.splitlines()[0] not in log_text:
            warnings.append("the log_entry of report_result is not in log.md")
        outcome = ChangeOutcome(ok=True, sha=verdict.sha, created=verdict.created, updated=verdict.updated,
                                deleted=verdict.deleted, warnings=warnings, agent=run,
                                summary=run.report.get("summary", "") if run.report else "",
                                status=run.status or "")
    except BaseException:
        # Whatever broke (a git error, a run that Dagster terminates), the
        # wiki goes back to the pre-ingest state before the error goes on.
        # A SIGKILL skips this; then the next begin_change() rolls back.
        wiki.rollback(before.sha)
        raise
    finally:
        wiki.end_change()
    push_error = wiki.push()
    if push_error:
        outcome.warnings.append(push_error)
    else:
        # Wiki.push pushes only when its remote is set.
        outcome.pushed = bool(wiki.remote.get_secret_value().strip())
    return outcome


def commit_agent_change(wiki: Wiki, before: BeforeChange, run: AgentRun, *, prefix: str,
                        may_delete_pages: bool, finish=None, provenance: tuple[str, ...] = (),
                        nothing_new_ok: bool = False) -> Verdict:
    """kb's side of an agent change: check the working tree against the
    allowlist and the secrets, make the one commit with the agent's
    commit_message, then verify the commit. A verdict without problems means
    that the change is committed and good. `finish(root)`, when given, runs
    first: kb's own deterministic part of the change (back-links, the index)
    on the agent's files; it returns the problems that refuse the change.
    `nothing_new_ok`: a run that changed no file is a success (no commit):
    the page to update exists, and nothing was new since its last version."""
    failure = run.failure()
    if failure:
        return Verdict(problems=[failure])
    if finish is not None and (problems := finish(wiki.root())):
        return Verdict(problems=problems)
    message = str(run.report.get("commit_message", "")) if run.report else ""
    refused = wiki.refusals(before, message)
    if refused:
        return Verdict(problems=refused)
    if wiki.commit_pending(message, provenance) is None:
        return Verdict(sha=before.sha) if nothing_new_ok else Verdict(problems=["the agent changed no file"])
    return wiki.verify_change(before, prefix, may_delete_pages=may_delete_pages, provenance=provenance)


def apply_own_change(wiki: Wiki, message: str, write) -> ChangeOutcome:
    """A change that the asset makes itself (no agent): pre-flight, write, one commit."""
    with raw_files_lock(wiki.root()):
        return _apply_own_change(wiki, message, write)


def _apply_own_change(wiki: Wiki, message: str, write) -> ChangeOutcome:
    before = wiki.begin_change()
    try:
        write(wiki.root())
        sha = wiki.commit_all(message)
        verdict = wiki.verify_change(before, message, may_delete_pages=False) if sha else None
        if verdict and verdict.problems:
            raise RuntimeError(f"the change {message!r} breaks the wiki rules: {'; '.join(verdict.problems)}")
    except BaseException:
        wiki.rollback(before.sha)
        raise
    finally:
        wiki.end_change()
    outcome = ChangeOutcome(ok=True, sha=sha or before.sha,
                            created=verdict.created if verdict else [], updated=verdict.updated if verdict else [])
    push_error = wiki.push()
    if push_error:
        outcome.warnings.append(push_error)
    return outcome


def guarded(change) -> ChangeOutcome:
    """Run one change. An error in it (the change rolled the wiki back
    before the error went on) becomes a failed outcome, so that it gets the
    retries and waits of every rolled-back change."""
    try:
        return change()
    except Exception as exc:
        return ChangeOutcome(ok=False, problems=[f"{type(exc).__name__}: {redact_secrets(str(exc))[:500]}"])
