"""Provenance in git: the parsed file that the citations point to goes into
git with the ingest that uses it, never changes after it, and a new parse
is a new file that marks the earlier one superseded. Real git, the real
parsed-file writer and kb's real commit of an agent change (the agent's
report is given; tests/test_wiki_agent.py runs the CLI)."""

import subprocess
from datetime import datetime, timezone

import pytest

from kb.telegram.inbox import InboxItem
from kb.telegram.source_parsers import ParsedSource
from kb.wiki.agent import AgentRun
from kb.wiki.checks import check_wiki
from kb.wiki.repo import Wiki
from kb.wiki_files import read_frontmatter
from kb.telegram.parsed_files import write_parsed_file
from kb.wiki.change import commit_agent_change
from kb.wiki.finish import finish_ingest, superseded_parse
from tests.wiki_pages import concept_page, source_page

ITEM = InboxItem(id="5e6f7a8b9c", type="web", received_at="2026-11-20T09:00:00+00:00", origin="drop",
                 url="https://example.org/a")
WHEN = datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc)


def git(root, *args) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def parse(root, text: str):
    return str(write_parsed_file(root, ITEM, ParsedSource(title="Engine notes", body=text, parser="web"), WHEN))


def ingest(wiki: Wiki, parsed_path: str, pages: dict[str, str], message: str = ""):
    """One ingest as the asset makes it: the agent's pages, kb's finish, the commit with the parsed file."""
    root = wiki.root()
    before = wiki.begin_change()
    for path, text in pages.items():
        (root / path).write_text(text)
    slug = parsed_path.rsplit("/", 1)[-1].removesuffix(".md")
    run = AgentRun(report={"status": "done", "commit_message": message or f"ingest: {slug}", "summary": "",
                           "warnings": []})
    provenance = tuple(p for p in (parsed_path, superseded_parse(root, parsed_path)) if p)
    verdict = commit_agent_change(wiki, before, run, prefix="ingest:", may_delete_pages=False,
                                  finish=lambda r: finish_ingest(r, parsed_path), provenance=provenance)
    if verdict.problems:
        wiki.rollback(before.sha)
    wiki.end_change()
    return verdict


@pytest.fixture
def wiki():
    w = Wiki.from_settings()
    w.ensure()
    return w


def test_the_parsed_file_goes_into_git_with_its_ingest_and_a_new_parse_supersedes_it(wiki):
    root = wiki.root()
    first = parse(root, "The engine tabulates polynomials.\n\nIt was designed in 1822.")
    slug = first.rsplit("/", 1)[-1][:-3]
    assert slug == "5e6f7a8b-engine-notes"
    # A snapshot of the owner's edits does not take a parsed file that waits for its ingest.
    (root / "purpose.md").write_text("# Purpose\nMine.\n")
    wiki.commit_all("manual: an edit")
    assert first not in git(root, "ls-files")
    claim = f"- The engine tabulates polynomials. [[sources/{slug}#para1]]"
    verdict = ingest(wiki, first, {f"wiki/sources/{slug}.md": source_page(slug, "Engine notes", [claim]),
                                   "wiki/concepts/difference-engine.md": concept_page(
                                       "difference engine", claim[2:], [], sources=[slug])})
    assert verdict.problems == []
    assert git(root, "show", "--name-only", "--format=%s", "HEAD").split() == [
        "ingest:", slug, first, "wiki/concepts/difference-engine.md", f"wiki/sources/{slug}.md"]
    # The same text parsed again: the ingested file stays.
    assert parse(root, "The engine tabulates polynomials.\n\nIt was designed in 1822.") == first
    # Another text: a new file that names the earlier one; the earlier one is not touched.
    old_bytes = (root / first).read_bytes()
    second = parse(root, "The engine tabulates logarithms.\n\nIt was designed in 1823.")
    assert second != first and read_frontmatter(root / second)["supersedes"] == first
    assert (root / first).read_bytes() == old_bytes
    slug2 = second.rsplit("/", 1)[-1][:-3]
    verdict = ingest(wiki, second, {f"wiki/sources/{slug2}.md": source_page(slug2, "Engine notes", [
        f"- The engine tabulates logarithms. [[sources/{slug2}#para1]]"])})
    assert verdict.problems == []
    # The earlier parse and its source page are marked, never deleted.
    assert read_frontmatter(root / first)["superseded_by"] == second
    assert (root / first).read_text().replace(f"superseded_by: {second}\n", "") == old_bytes.decode()
    assert read_frontmatter(root / f"wiki/sources/{slug}.md")["superseded_by"] == slug2
    assert {first, second} <= set(git(root, "ls-files").split())
    # The claim that cites only the earlier parse is stale now.
    stale = check_wiki(root)["stale_claims"]
    assert [(s["page"], s["superseded_by"]) for s in stale] == [("wiki/concepts/difference-engine.md", slug2)]


def test_a_committed_parsed_file_never_changes_and_a_rollback_keeps_a_waiting_one(wiki):
    root = wiki.root()
    first = parse(root, "The engine tabulates polynomials.")
    slug = first.rsplit("/", 1)[-1][:-3]
    assert ingest(wiki, first, {f"wiki/sources/{slug}.md": source_page(slug, "Engine notes", [])}).problems == []
    # An ingest whose commit changes the committed parsed file: refused, and the rollback restores it.
    before_bytes = (root / first).read_bytes()
    before = wiki.begin_change()
    (root / first).write_text((root / first).read_text().replace("polynomials", "logarithms"))
    git(root, "commit", "-qam", f"ingest: {slug}")
    problems = wiki.verify_change(before, "ingest:", may_delete_pages=False, provenance=(first,)).problems
    assert f"refused: {first}: a file in raw/ goes into git only with the ingest of its source, and never " \
           "changes after it" in problems
    wiki.rollback(before.sha)
    wiki.end_change()
    assert (root / first).read_bytes() == before_bytes
    # A failed ingest of a new source: the rollback keeps its parsed file for the next try.
    waiting = str(write_parsed_file(root, InboxItem(id="6f7a8b9c0d", type="web", received_at=ITEM.received_at,
                                                    origin="drop"),
                                    ParsedSource(title="Other", body="Another text.", parser="web"), WHEN))
    head = git(root, "rev-parse", "HEAD")
    # The commit is made (with the parsed file in it), then fails its check: the wrong prefix.
    verdict = ingest(wiki, waiting, {"wiki/sources/6f7a8b9c-other.md": source_page("6f7a8b9c-other", "Other", [])},
                     message="update: other")
    assert any("does not start with 'ingest:'" in p for p in verdict.problems)
    assert git(root, "rev-parse", "HEAD") == head
    assert (root / waiting).read_text().endswith("Another text.\n") and waiting not in git(root, "ls-files")


def test_originals_stay_out_of_git_by_a_rule_in_gitignore(wiki):
    root = wiki.root()
    gitignore = (root / ".gitignore").read_text()
    assert "/raw/*" in gitignore and "!/raw/parsed/**/*.md" in gitignore
    for path in ("raw/inbox/voice-1.oga", "raw/inbox/paper.pdf", "raw/parsed/voice/x.oga", "raw/rejected/y.md"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(b"x")
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0, path
    assert subprocess.run(["git", "check-ignore", "-q", "raw/parsed/web/a.md"], cwd=root).returncode == 1
