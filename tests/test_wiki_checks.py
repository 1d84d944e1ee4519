"""The deterministic wiki checks, on a wiki folder that the test makes with
known problems, and the wiki that Wiki.ensure() creates."""

import json
import subprocess

import pytest

from kb.wiki.checks import FINDING_KINDS, check_wiki, findings_count, format_findings
from kb.wiki.repo import Wiki

S = "0a1b2c3d-notes-on-the-engine"
SOURCE = f"""\
---
resource_id: 0a1b2c3d4e
resource_type: web
source_url: "https://example.org/notes"
title: "Notes on the Analytical Engine"
ingested_at: 2026-11-20T09:00:00+00:00
parsed_path: raw/parsed/web/{S}.md
quality_score: 80
topics: [computing]
---
# Notes on the Analytical Engine

## TL;DR
Ada Lovelace wrote notes on the engine of Babbage.
The notes hold the first published program.

## Key claims
- The engine can act on symbols, not only numbers. [[sources/{S}#para3]]
- Note G computes Bernoulli numbers. [[sources/{S}#para7]]
- The notes warn that the engine cannot originate anything. [[sources/{S}#para9]]

## Connections
- [[entities/Ada-Lovelace]], [[concepts/engine|the engine]]
"""

ADA = f"""\
---
type: entity
created: 2026-11-20
last_updated: 2026-11-20
sources: [{S}]
name: "Ada Lovelace"
kind: person
aliases: [Augusta Ada King]
---
# Ada Lovelace

## Overview
Ada Lovelace was a mathematician who wrote about the engine. [[sources/{S}#para1]]

## Roles and affiliations
- She translated the paper of Menabrea. [[sources/{S}#para2|Notes, para 2]]
- She added notes that were longer than the paper. [[sources/{S}]]
- Her Note G holds a program for [[concepts/engine|the engine]]. [[sources/{S}#para7]]
- She worked with a man who is not in the wiki. [[entities/Nobody]] [[sources/{S}#para4]]
- Her father was a poet.

<!-- llm:auto-section -->
## Connections
- [[concepts/engine]]
- [[entities/Broken]]
"""

ENGINE = f"""\
---
type: concept
created: 2026-11-20
last_updated: 2026-11-20
sources: [{S}]
aliases: []
---
# engine

## Definition
A machine for general computation. [[sources/{S}#para3]]

## Key claims
The engine was never built.

## Open questions
- Could it have been built with the tools of 1840?

<!-- llm:auto-section -->
## Connections
"""

LONELY = """\
---
type: concept
created: 2026-11-20
sources: []
---
# lonely

## Definition
Nobody links here.

## Key claims

<!-- llm:auto-section -->
## Connections
"""

BROKEN = """\
# Broken

This page has no frontmatter. See [[concepts/ghost#intro]].
"""

INDEX = f"""\
# Index

## Sources
- [[sources/{S}]]

## Entities
- [[entities/Ada-Lovelace]]
- [[entities/Deleted]]

## Concepts
- [[concepts/engine|engine]]
"""


@pytest.fixture
def problem_wiki(tmp_path):
    root = tmp_path / "w"
    for rel, text in {
        f"wiki/sources/{S}.md": SOURCE,
        "wiki/entities/Ada-Lovelace.md": ADA,
        "wiki/entities/Broken.md": BROKEN,
        "wiki/concepts/engine.md": ENGINE,
        "wiki/concepts/lonely.md": LONELY,
        "index.md": INDEX,
        "purpose.md": "# Purpose\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def pages(items):
    return sorted(item["page"] for item in items)


def test_dangling_links_ignore_sections_and_aliases_of_pages_that_exist(problem_wiki):
    found = check_wiki(problem_wiki)
    dangling = sorted((d["page"], d["link"]) for d in found["dangling_links"])
    assert dangling == [
        ("wiki/entities/Ada-Lovelace.md", "entities/Nobody"),
        ("wiki/entities/Broken.md", "concepts/ghost#intro"),
    ]
    ada_line = next(d["line"] for d in found["dangling_links"] if d["link"] == "entities/Nobody")
    assert ADA.splitlines()[ada_line - 1].startswith("- She worked with a man")


def test_orphans_stubs_frontmatter_and_index(problem_wiki):
    found = check_wiki(problem_wiki)
    # Broken is linked from Ada; lonely from nobody.
    assert pages(found["orphans"]) == ["wiki/concepts/lonely.md"]
    assert {(s["page"], s["body_lines"]) for s in found["stubs"]} == {
        ("wiki/concepts/engine.md", 9),
        ("wiki/concepts/lonely.md", 6),
        ("wiki/entities/Broken.md", 2),
    }
    problems = {(f["page"], f["problem"]) for f in found["frontmatter"]}
    assert problems == {
        ("wiki/concepts/lonely.md", "missing keys: last_updated"),
        ("wiki/entities/Broken.md", "no frontmatter"),
    }
    # The sections of the specification: lonely has no `## Open questions`
    # (optional); every page here has its sections in order and the marker.
    assert found["schema"] == []
    mismatch = {(m["page"], m.get("link"), m["problem"]) for m in found["index_mismatch"]}
    assert mismatch == {
        ("index.md", "entities/Deleted", "index.md lists a page that does not exist"),
        ("wiki/concepts/lonely.md", None, "page is not in index.md"),
        ("wiki/entities/Broken.md", None, "page is not in index.md"),
    }


def test_uncited_claims_on_entity_and_concept_pages(problem_wiki):
    found = check_wiki(problem_wiki)
    uncited = sorted((u["page"], u["text"]) for u in found["uncited"])
    assert uncited == [
        ("wiki/concepts/engine.md", "The engine was never built."),
        ("wiki/concepts/lonely.md", "Nobody links here."),
        ("wiki/entities/Ada-Lovelace.md", "- Her father was a poet."),
        ("wiki/entities/Broken.md", "This page has no frontmatter. See [[concepts/ghost#intro]]."),
    ]


def test_uncited_claims_on_source_pages_and_weekly_syntheses(problem_wiki):
    """A source page's claims are the lines of `## Key claims`; they cite the
    page's own paragraphs (kb's form of the specification's [[parsed#paraN]]).
    A weekly synthesis cites a source in each theme section. The TL;DR, the
    connections, the reading list and the thin-week note are no claims."""
    from tests.wiki_pages import source_page, weekly_page

    (problem_wiki / f"wiki/sources/{S}.md").write_text(
        SOURCE.replace("## Connections", "- The engine was finished in 1871.\n\n## Connections"))
    other = "1b2c3d4e-a-second-source"
    (problem_wiki / f"wiki/sources/{other}.md").write_text(source_page(
        other, "A second source", [f"- A claim that cites its own paragraph. [[sources/{other}#para1]]"],
        tldr="A summary with no citation.", connections=["- Mentions [[entities/Ada-Lovelace]]."],
        more={"Notable details": ["A detail with no citation."]}))
    weekly = weekly_page("2026-W48", [S, other], "Engines", [
        f"Both sources speak of the engine. [[sources/{S}#para3]]", "The engine changed the world."],
        reading=[f"- [[sources/{S}]]: the notes.", f"- [[sources/{other}]]: the second one."])
    weekly = weekly.replace("# Weekly Synthesis · 2026-W48 · Engines\n",
                            "# Weekly Synthesis · 2026-W48 · Engines\n\nThin week: only 2 new sources.\n")
    (problem_wiki / "wiki/syntheses/weekly/2026-W48.md").parent.mkdir(parents=True)
    (problem_wiki / "wiki/syntheses/weekly/2026-W48.md").write_text(weekly)
    uncited = {(u["page"], u["text"]) for u in check_wiki(problem_wiki)["uncited"]}
    assert {(page, text) for page, text in uncited if "/sources/" in page or "/syntheses/" in page} == {
        (f"wiki/sources/{S}.md", "- The engine was finished in 1871."),
        ("wiki/syntheses/weekly/2026-W48.md", "The engine changed the world."),
    }


def test_fixing_a_page_removes_its_findings(problem_wiki):
    (problem_wiki / "wiki/concepts/lonely.md").unlink()
    (problem_wiki / "wiki/entities/Broken.md").unlink()
    ada = problem_wiki / "wiki/entities/Ada-Lovelace.md"
    ada.write_text(ADA.replace("[[entities/Nobody]] ", "").replace("- [[entities/Broken]]\n", "")
                   .replace("Her father was a poet.", f"Her father was a poet. [[sources/{S}#para9]]"))
    found = check_wiki(problem_wiki)
    assert found["dangling_links"] == [] and found["orphans"] == []
    assert pages(found["index_mismatch"]) == ["index.md"]  # entities/Deleted is still listed


def test_new_wiki_has_no_findings(tmp_path):
    root = Wiki.from_settings(path=str(tmp_path / "fresh")).ensure()
    found = check_wiki(root)
    assert findings_count(found) == 0, found
    assert set(found) == set(FINDING_KINDS)
    log = subprocess.run(["git", "log", "--format=%s"], cwd=root, capture_output=True, text=True, check=True)
    assert log.stdout.split("\n")[0] == "init: wiki"


def test_text_and_json_output(problem_wiki):
    found = check_wiki(problem_wiki)
    text = format_findings(found)
    assert "dangling_links: 2" in text
    assert "wiki/entities/Ada-Lovelace.md:" in text and "link=entities/Nobody" in text
    assert f"total: {findings_count(found)}" in text
    assert json.loads(json.dumps(found)) == found  # --json prints it as it is


def test_a_folder_that_is_not_a_wiki_is_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no wiki/ subfolder"):
        check_wiki(tmp_path)


def test_raw_files_lock_keeps_intake_writes_out_of_an_ingest(tmp_path):
    """An ingest holds the raw/ lock for its whole change; an intake write
    waits for it, so the ingest's raw/ check never sees another item's file."""
    import threading
    import time as _time

    from kb.wiki.repo import raw_files_lock

    wiki_dir = tmp_path / "wiki"
    events: list[str] = []

    def intake_write():
        with raw_files_lock(wiki_dir):
            events.append("intake wrote")

    with raw_files_lock(wiki_dir):
        writer = threading.Thread(target=intake_write)
        writer.start()
        _time.sleep(0.3)
        events.append("ingest verified")
    writer.join(timeout=5)
    assert events == ["ingest verified", "intake wrote"]
    assert not (wiki_dir / "raw").exists() or not any((wiki_dir / "raw").iterdir())
