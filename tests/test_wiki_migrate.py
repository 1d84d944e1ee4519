"""`kb wiki migrate` on a wiki as kb wrote it before the specification's
schemas (the pages of the tests of that time): one commit, every cited
claim kept word for word, every link on the new names, index.md built
again, and `kb wiki check` clean after it. Real git, the real command."""

import subprocess

from click.testing import CliRunner

from kb.apps.cli import main
from kb.wiki.change_rules import lost_cited_claims
from kb.wiki.checks import check_wiki, findings_count
from kb.wiki.playbook import EARLIER_GITIGNORES
from kb.wiki.schema import MIGRATE_MESSAGE, name_problem
from kb.wiki_files import wiki_page_files

PARSED = "raw/parsed/web/notes-on-the-engine-0a1b2c3d4e.md"
PARAGRAPHS = [
    "Ada Lovelace wrote notes on the Analytical Engine of Charles Babbage in 1843.",
    "She translated the paper of Luigi Menabrea about the engine from French.",
    "The engine could act on symbols as well as on numbers.",
    "Note G holds a method to compute Bernoulli numbers with the engine.",
]
# kb's earlier formats, as its tests wrote them.
EARLIER = {
    PARSED: "---\nresource_id: 0a1b2c3d4e\ntype: web\nsource_url: https://example.org/notes\ntitle: Notes on the "
            "Engine\nfetched_at: 2026-11-20T09:00:00+00:00\nchar_count: 300\nparser: web\n---\n\n"
            + "\n\n".join(PARAGRAPHS) + "\n",
    "wiki/sources/notes-on-the-engine-0a1b2c3d4e.md": f"""\
---
type: source
title: "Notes on the Engine"
source_id: "0a1b2c3d4e"
source_type: web
url: "https://example.org/notes"
raw: {PARSED}
ingested: 2026-11-20
topics: [computing]
---
# Notes on the Engine

## Summary
Notes of Ada Lovelace on the engine of Babbage, with the first published program.

## Key points
- Ada Lovelace wrote notes on the Analytical Engine of Charles Babbage in 1843. [[sources/notes-on-the-engine-0a1b2c3d4e#para1]]
- Note G holds a method to compute Bernoulli numbers with the engine. [[sources/notes-on-the-engine-0a1b2c3d4e#para4]]

## Passages
### para1
> Ada Lovelace wrote notes on the Analytical Engine of Charles Babbage in 1843.

## Mentions
- [[entities/Ada Lovelace]], [[concepts/analytical-engine|the engine]]
""",
    "wiki/entities/Ada Lovelace.md": """\
---
type: entity
name: "Ada Lovelace"
kind: person
aliases: [Augusta Ada King]
sources: [notes-on-the-engine-0a1b2c3d4e]
updated: 2026-11-20
---
# Ada Lovelace

Ada Lovelace wrote notes on the Analytical Engine of Charles Babbage in 1843. [[sources/notes-on-the-engine-0a1b2c3d4e#para1]]

## Facts
- She translated the paper of Luigi Menabrea about the engine from French. [[sources/notes-on-the-engine-0a1b2c3d4e#para2|Notes, para 2]]
- Her Note G holds a method to compute Bernoulli numbers with [[concepts/analytical-engine|the engine]]. [[sources/notes-on-the-engine-0a1b2c3d4e#para4]]
- She saw that the engine could act on symbols as well as on numbers. [[sources/notes-on-the-engine-0a1b2c3d4e#para3]]

## Related
- [[concepts/analytical-engine]]
""",
    "wiki/concepts/analytical-engine.md": """\
---
type: concept
name: analytical engine
aliases: []
sources: [notes-on-the-engine-0a1b2c3d4e]
updated: 2026-11-20
---
# analytical engine

The engine could act on symbols as well as on numbers. [[sources/notes-on-the-engine-0a1b2c3d4e#para3]]

## Facts
- [[entities/Ada Lovelace]] wrote notes on the Analytical Engine of Charles Babbage in 1843. [[sources/notes-on-the-engine-0a1b2c3d4e#para1]]
- Note G holds a method to compute Bernoulli numbers with the engine. [[sources/notes-on-the-engine-0a1b2c3d4e#para4]] (disputed)
- Luigi Menabrea wrote a paper about the engine in French. [[sources/notes-on-the-engine-0a1b2c3d4e#para2]]

## Related
- [[entities/Ada Lovelace]]
""",
    "wiki/syntheses/weekly/2026-W47.md": """\
---
type: synthesis
kind: weekly
period: 2026-W47
sources: [notes-on-the-engine-0a1b2c3d4e]
created: 2026-11-22
---
# Week 2026-W47

Thin week: only 1 new sources.

## Reading list
- [[sources/notes-on-the-engine-0a1b2c3d4e]]: the notes themselves.
""",
    "index.md": """\
# Index

## Sources
- [[sources/notes-on-the-engine-0a1b2c3d4e]]

## Entities
- [[entities/Ada Lovelace]]

## Concepts
- [[concepts/analytical-engine]]

## Syntheses
- [[syntheses/weekly/2026-W47]]
""",
    "log.md": "# Log\n\nOne entry for each change to the wiki, newest last.\n\n## 2026-11-20 ingest notes\n",
    "purpose.md": "# Purpose\n\nComputing history.\n",
    ".gitignore": EARLIER_GITIGNORES[0],
}
S = "0a1b2c3d-notes-on-the-engine"


def git(root, *args) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def earlier_wiki(root):
    # What Wiki.ensure() of that time made too: the owner's playbook, empty folders kept by .gitkeep.
    files = {**EARLIER, "CLAUDE.md": "# The owner's own playbook\n", "wiki/syntheses/lint/.gitkeep": "",
             "wiki/syntheses/topics/.gitkeep": ""}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.name=t", "-c", "user.email=t@localhost", "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "ingest: notes")
    return root


def test_migrate_moves_an_earlier_wiki_to_the_specifications_schema(tmp_path):
    root = earlier_wiki(tmp_path / "wiki")
    before = {f.relative_to(root).as_posix(): f.read_text() for f in wiki_page_files(root)}
    assert findings_count(check_wiki(root)) > 0  # the earlier format breaks the schemas
    out = CliRunner().invoke(main, ["wiki", "migrate", str(root)])
    assert out.exit_code == 0, out.output
    assert git(root, "log", "--format=%s").splitlines() == [MIGRATE_MESSAGE, "ingest: notes"]
    assert f"wiki/entities/Ada Lovelace.md -> wiki/entities/Ada-Lovelace.md" in out.output
    after = {f.relative_to(root).as_posix(): f.read_text() for f in wiki_page_files(root)}
    assert sorted(after) == sorted(["wiki/entities/Ada-Lovelace.md", "wiki/concepts/analytical-engine.md",
                                    f"wiki/sources/{S}.md", "wiki/syntheses/weekly/2026-W47.md"])
    assert all(name_problem(rel.removeprefix("wiki/")) is None for rel in after)
    # Every cited claim, word for word, on the new names.
    renames = {"entities/Ada Lovelace": "entities/Ada-Lovelace",
               "sources/notes-on-the-engine-0a1b2c3d4e": f"sources/{S}"}
    assert lost_cited_claims(before, after, renames) == []
    assert "[[sources/notes-on-the-engine" not in "".join(after.values()) + (root / "index.md").read_text()
    assert "(disputed)" in after["wiki/concepts/analytical-engine.md"]
    assert f"sources: [{S}]" in after["wiki/entities/Ada-Lovelace.md"]
    # The parsed file keeps its name and bytes; the source page names it, and it goes into git
    # with the migration (the earlier ingest did not commit it); .gitignore now lets it in.
    assert (root / PARSED).read_text() == EARLIER[PARSED]
    assert f"parsed_path: {PARSED}" in after[f"wiki/sources/{S}.md"]
    assert "!/raw/parsed/**/*.md" in (root / ".gitignore").read_text()
    assert PARSED in git(root, "show", "--name-only", "--format=", "HEAD").split()
    assert git(root, "show", f"HEAD:{PARSED}") == EARLIER[PARSED]
    assert (root / "log.md").read_text().startswith(EARLIER["log.md"])
    assert (root / "CLAUDE.md").read_text() == "# The owner's own playbook\n"
    found = check_wiki(root)
    assert findings_count(found) == 0, {k: v for k, v in found.items() if v}
    # A second run has nothing to do.
    again = CliRunner().invoke(main, ["wiki", "migrate", str(root)])
    assert again.exit_code == 0 and "nothing to migrate" in again.output
    assert len(git(root, "log", "--format=%s").splitlines()) == 2


def test_migrate_refuses_two_pages_that_would_get_one_name(tmp_path):
    root = earlier_wiki(tmp_path / "wiki")
    (root / "wiki/entities/Ada-Lovelace.md").write_text(EARLIER["wiki/entities/Ada Lovelace.md"])
    git(root, "-c", "user.name=t", "-c", "user.email=t@localhost", "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "manual: a copy")
    head = git(root, "rev-parse", "HEAD")
    out = CliRunner().invoke(main, ["wiki", "migrate", str(root)])
    assert out.exit_code == 1
    assert "wiki/entities/Ada Lovelace.md and" in out.output and "would both be wiki/entities/Ada-Lovelace.md" \
        in out.output
    assert git(root, "rev-parse", "HEAD") == head and git(root, "status", "--porcelain") == ""
