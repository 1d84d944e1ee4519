"""Each instruction that kb gives the agent lands when the agent obeys it.

The agent is tests/obedient_agent.py: a loopback Messages API that reads
kb's task and plays what CLAUDE.md and the prompt ask for, through the
real Claude Code CLI, under kb's own task functions (kb/wiki/tasks.py)
and its checked commit. Each test names the instructions that it obeys
(`obeys`), and test_every_instruction_has_an_obedient_test fails when an
instruction of kb.wiki.playbook.INSTRUCTIONS has no such test.
"""

from __future__ import annotations

import os
import subprocess
from datetime import date
from pathlib import Path

import dagster as dg
import pytest

from kb.wiki.agent import WikiAgent
from kb.wiki.checks import check_wiki
from kb.wiki.playbook import CLAUDE_MD, INSTRUCTIONS
from kb.wiki.prompts import GateDecision, lint_prompt, synthesis_prompt, topic_prompt
from kb.wiki.repo import Wiki
from kb.wiki.tasks import ingest_source, lint_wiki, topic_synthesis, weekly_synthesis
from tests.obedient_agent import Hints, ObedientAnthropic
from tests.wiki_pages import concept_page, entity_page, parsed_file, source_page

OBEYED: dict[str, list[str]] = {}


def obeys(*ids: str):
    """Mark a test as the obedient test of these instruction ids. Such a
    test is slow (the agent's CLI): it carries its own slow mark (the rule of
    tests/test_fast_loop.py); the test of the registry is not slow."""
    def mark(test):
        for instruction in ids:
            assert instruction in INSTRUCTIONS, instruction
            OBEYED.setdefault(instruction, []).append(test.__name__)
        return test
    return mark


def test_every_instruction_has_an_obedient_test():
    assert sorted(set(INSTRUCTIONS) - set(OBEYED)) == []
    # The words of each id are in the text that kb gives the agent.
    texts = CLAUDE_MD + lint_prompt("2026-12-01", {}) + synthesis_prompt("2026-W48", ["a"], False) + \
        topic_prompt("x", "2026-12-01")
    assert [i for i, words in INSTRUCTIONS.items() if words not in texts] == []


# --- the wiki -------------------------------------------------------------------------------

S1 = "a1b2c3d4-engine-notes"
S2 = "b2c3d4e5-engine-built"
P1 = f"raw/parsed/web/{S1}.md"
P2 = f"raw/parsed/web/{S2}.md"
PARAS1 = ["Ada Lovelace wrote notes on the Analytical Engine in 1843.",
          "The Analytical Engine was never finished in the life of Babbage.",
          "Charles Babbage designed the Difference Engine to tabulate polynomials."]
PARAS2 = ["Ada Lovelace published the first program for the Analytical Engine.",
          "The Analytical Engine was finished and ran in 1850."]
DAY = "2026-12-01"
OWNER_NOTE = "The owner keeps this note on the engine."


def cite(slug: str, n: int) -> str:
    return f"[[sources/{slug}#para{n}]]"


@pytest.fixture(autouse=True)
def agent_env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "sk-TEST-obedient-0001")
    monkeypatch.setenv("KB_AGENT_TIMEOUT_S", "60")


def add_source(root: Path, slug: str, parsed: str, paragraphs: list[str], title: str, claims: int = 0) -> None:
    (root / parsed).parent.mkdir(parents=True, exist_ok=True)
    (root / parsed).write_text(parsed_file(slug[:8] + "00", title, paragraphs))
    lines = [f"- {p} {cite(slug, n)}" for n, p in enumerate(paragraphs[:claims], start=1)]
    (root / f"wiki/sources/{slug}.md").write_text(source_page(slug, title, lines))


def index(root: Path, targets: list[str]) -> None:
    text = (root / "index.md").read_text()
    for target in targets:
        section = {"sources": "## Sources", "entities": "## Entities", "concepts": "## Concepts"}[target.split("/")[0]]
        text = text.replace(section + "\n", f"{section}\n- [[{target}]]\n", 1)
    (root / "index.md").write_text(text)


ENGINE = "wiki/concepts/analytical-engine.md"
ADA = "wiki/entities/Ada-Lovelace.md"


@pytest.fixture
def wiki() -> Wiki:
    """A coherent wiki: one source, a concept page and an entity page that
    cite it, each with a line that the owner wrote by hand (a `manual:`
    commit). The checks find nothing but stubs and orphans of sources."""
    w = Wiki.from_settings()
    root = w.ensure()
    add_source(root, S1, P1, PARAS1, "Notes on the Engine", claims=3)
    (root / ENGINE).write_text(concept_page(
        "analytical engine", f"A machine that Babbage planned. {cite(S1, 2)}",
        [f"- {PARAS1[1]} {cite(S1, 2)}", f"- {OWNER_NOTE} {cite(S1, 2)}"], sources=[S1],
        connections=["- [[entities/Ada-Lovelace]]"]))
    (root / ADA).write_text(entity_page(
        "Ada Lovelace", f"A mathematician who wrote on the engine. {cite(S1, 1)}",
        [f"- {PARAS1[0]} {cite(S1, 1)}"], sources=[S1], connections=["- [[concepts/analytical-engine]]"]))
    index(root, [f"sources/{S1}", "concepts/analytical-engine", "entities/Ada-Lovelace"])
    w.commit_all("manual: the owner's first pages")
    return w


def head_subject(root: Path) -> str:
    return subprocess.run(["git", "log", "-1", "--format=%s"], cwd=root, capture_output=True, text=True).stdout.strip()


def lint(wiki: Wiki, monkeypatch, hints: Hints | None = None, *, kinds: tuple[str, ...] = ()):
    """The daily lint with the obedient agent. `kinds`: the findings that the
    test set up; the lint must land and they must be gone after it."""
    root = wiki.root()
    before = check_wiki(root)
    for kind in kinds:
        assert before[kind], (kind, before[kind])
    with ObedientAnthropic(root, hints) as model:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.base_url)
        result = lint_wiki(wiki, WikiAgent.from_settings(), DAY, max_turns=20)
    assert result.outcome.ok, result.outcome.problems
    assert head_subject(root) == f"lint: {DAY}"
    assert len(model.plans) == 1  # landed at the first try
    for kind in kinds:
        assert result.after[kind] == [], (kind, result.after[kind])
    return result, model.plans[0]


# --- ingest -------------------------------------------------------------------------------------


def ingest(wiki: Wiki, monkeypatch, slug: str, parsed: str, hints: Hints):
    root = wiki.root()
    decision = GateDecision(source_id=slug[:8], approved=True, parsed_path=parsed, topics=("computing",),
                            title="The engine was built", source_type="web", score=80)
    with ObedientAnthropic(root, hints) as model:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.base_url)
        outcome = ingest_source(wiki, WikiAgent.from_settings(), decision, now=f"{DAY}T10:00:00+00:00",
                                max_turns=20)
    assert outcome.ok, outcome.problems
    assert head_subject(root) == f"ingest: {slug}" and len(model.plans) == 1
    return outcome


def new_source(wiki: Wiki) -> Path:
    root = wiki.root()
    (root / P2).parent.mkdir(parents=True, exist_ok=True)
    (root / P2).write_text(parsed_file(S2[:8] + "00", "The engine was built", PARAS2))
    return root


@pytest.mark.slow
@obeys("ingest.source-page", "ingest.new-page", "ingest.index-and-log")
def test_ingest_of_a_new_entity(wiki, monkeypatch):
    root = new_source(wiki)
    outcome = ingest(wiki, monkeypatch, S2, P2, Hints(new_entities=("Charles Babbage",)))
    assert sorted(outcome.created) == ["wiki/entities/Charles-Babbage.md", f"wiki/sources/{S2}.md"]
    assert "[[entities/Charles-Babbage]]" in (root / "index.md").read_text()
    assert f"ingest {S2}" in (root / "log.md").read_text()
    found = check_wiki(root)
    new = [item for kind in ("uncited", "unsupported", "dangling_links", "index_mismatch", "frontmatter", "schema",
                             "orphans") for item in found[kind] if item["page"] in outcome.created]
    assert new == []


@pytest.mark.slow
@obeys("ingest.update-page")
def test_ingest_that_updates_a_page_with_an_owners_section(wiki, monkeypatch):
    root = new_source(wiki)
    before = (root / ADA).read_text()
    outcome = ingest(wiki, monkeypatch, S2, P2, Hints(new_entities=("Ada Lovelace",)))
    assert ADA in outcome.updated
    after = (root / ADA).read_text()
    assert f"{PARAS2[0]} {cite(S2, 1)}" in after
    assert [line for line in before.split("\n") if line not in after.split("\n")] == []


@pytest.mark.slow
@obeys("ingest.contradiction")
def test_ingest_of_a_source_that_contradicts_a_claim_of_the_owner(wiki, monkeypatch):
    root = new_source(wiki)
    old = f"- {PARAS1[1]} {cite(S1, 2)}"
    outcome = ingest(wiki, monkeypatch, S2, P2, Hints(contradictions=((ENGINE, old, PARAS2[1]),)))
    page = (root / ENGINE).read_text()
    assert f"{old} (disputed)" in page and "## Contradictions\n- Disputed:" in page
    assert any(w.startswith(f"contradiction: {ENGINE}") for w in outcome.warnings)
    assert check_wiki(root)["open_contradictions"][0]["page"] == ENGINE


# --- lint -------------------------------------------------------------------------------------


@pytest.mark.slow
@obeys("lint.uncited", "lint.report")
def test_lint_adds_a_missing_citation_to_the_owners_line(wiki, monkeypatch):
    root = wiki.root()
    (root / ENGINE).write_text((root / ENGINE).read_text().replace(
        "## Key claims\n", f"## Key claims\n- {PARAS1[2]}\n"))
    wiki.commit_all("manual: an uncited line")
    _, plan = lint(wiki, monkeypatch, kinds=("uncited",))
    assert f"- {PARAS1[2]} {cite(S1, 3)}" in (root / ENGINE).read_text()
    assert f"wiki/syntheses/lint/{DAY}.md" in plan.writes


@pytest.mark.slow
@obeys("lint.unsupported-mark")
def test_lint_marks_an_unsupported_claim_of_the_owner(wiki, monkeypatch):
    root = wiki.root()
    moon = f"- The engine was built on the Moon by cats. {cite(S1, 1)}"
    (root / ENGINE).write_text((root / ENGINE).read_text().replace("## Key claims\n", f"## Key claims\n{moon}\n"))
    wiki.commit_all("manual: an invented claim")
    result, _ = lint(wiki, monkeypatch, kinds=("unsupported",))
    assert f"{moon} (unsupported)" in (root / ENGINE).read_text()
    assert "Moon" in (root / f"wiki/syntheses/lint/{DAY}.md").read_text()  # kb's digest lists it


@pytest.mark.slow
@obeys("lint.unsupported-cite")
def test_lint_cites_the_passage_that_holds_a_claim(wiki, monkeypatch):
    root = wiki.root()
    wrong = f"- {PARAS1[2]} {cite(S1, 1)}"
    (root / ENGINE).write_text((root / ENGINE).read_text().replace("## Key claims\n", f"## Key claims\n{wrong}\n"))
    wiki.commit_all("manual: a claim that cites the wrong passage")
    lint(wiki, monkeypatch, kinds=("unsupported",))
    assert f"{wrong} {cite(S1, 3)}" in (root / ENGINE).read_text()


@pytest.mark.slow
@obeys("lint.stale")
def test_lint_cites_the_later_source_of_a_stale_claim(wiki, monkeypatch):
    root = new_source(wiki)
    later = source_page(S2, "The engine was built", [f"- {PARAS2[0]} {cite(S2, 1)}"])
    (root / f"wiki/sources/{S2}.md").write_text(later)
    page = root / f"wiki/sources/{S1}.md"
    page.write_text(page.read_text().replace("---\n# ", f"superseded_by: {S2}\n---\n# ", 1))
    claim = f"- Ada Lovelace published the first program for the Analytical Engine. {cite(S1, 1)}"
    (root / ADA).write_text((root / ADA).read_text().replace("## Roles and affiliations\n",
                                                             f"## Roles and affiliations\n{claim}\n"))
    index(root, [f"sources/{S2}"])
    wiki.commit_all("manual: a later parse")
    found = check_wiki(root)["stale_claims"]
    assert [s["text"][:20] for s in found if s["page"] == ADA]
    result, _ = lint(wiki, monkeypatch, Hints(skip=("unsupported",)))
    assert f"{claim} {cite(S2, 1)}" in (root / ADA).read_text()
    assert not [s for s in result.after["stale_claims"] if s["page"] == ADA and "program" in s["text"]]


@pytest.mark.slow
@obeys("lint.merge")
def test_lint_merges_a_duplicate_page_and_kb_points_the_links(wiki, monkeypatch):
    root = wiki.root()
    other = "wiki/concepts/analytical-engines.md"
    (root / other).write_text(concept_page(
        "analytical engines", f"Engines that Babbage planned. {cite(S1, 2)}",
        [f"- Charles Babbage designed the Difference Engine. {cite(S1, 3)}"], sources=[S1],
        more={"Open questions": ["- Who built the first one?"]}))
    # The owner links the other page from a line above the marker.
    (root / ADA).write_text((root / ADA).read_text().replace(
        "## Roles and affiliations\n", f"## Roles and affiliations\n- Wrote on [[concepts/analytical-engines]]. "
                                       f"{cite(S1, 1)}\n"))
    index(root, ["concepts/analytical-engines"])
    wiki.commit_all("manual: a second page for one subject")
    lint(wiki, monkeypatch, kinds=("duplicates",))
    kept = (root / ENGINE).read_text()
    assert f"- Charles Babbage designed the Difference Engine. {cite(S1, 3)}" in kept
    assert "- Who built the first one?" in kept and "analytical engines" in kept.split("---")[1]
    assert "redirect: concepts/analytical-engine" in (root / other).read_text()
    assert "Wrote on [[concepts/analytical-engine|analytical engines]]." in (root / ADA).read_text()  # kb's part
    assert "[[concepts/analytical-engines]]" in (root / "index.md").read_text()


@pytest.mark.slow
@obeys("lint.dangling-link")
def test_lint_points_a_dangling_link_of_the_owner_at_its_page(wiki, monkeypatch):
    root = wiki.root()
    (root / ENGINE).write_text((root / ENGINE).read_text().replace(
        OWNER_NOTE, f"{OWNER_NOTE} See [[entities/Ada Lovelace]]."))
    wiki.commit_all("manual: a link by hand")
    lint(wiki, monkeypatch, kinds=("dangling_links",))
    assert "See [[entities/Ada-Lovelace|Ada Lovelace]]." in (root / ENGINE).read_text()


@pytest.mark.slow
@obeys("lint.dangling-link-plain")
def test_lint_makes_a_dangling_link_plain_text(wiki, monkeypatch):
    root = wiki.root()
    (root / ENGINE).write_text((root / ENGINE).read_text().replace(
        OWNER_NOTE, f"{OWNER_NOTE} See [[entities/Luigi-Menabrea]]."))
    wiki.commit_all("manual: a link by hand")
    lint(wiki, monkeypatch, kinds=("dangling_links",))
    assert f"{OWNER_NOTE} See Luigi Menabrea." in (root / ENGINE).read_text()


@pytest.mark.slow
@obeys("lint.orphans")
def test_lint_links_an_orphan_page(wiki, monkeypatch):
    root = wiki.root()
    page = "wiki/entities/Charles-Babbage.md"
    (root / page).write_text(entity_page("Charles Babbage", f"{PARAS1[2]} {cite(S1, 3)}", [], sources=[S1]))
    index(root, ["entities/Charles-Babbage"])
    wiki.commit_all("manual: a page that no page links")
    assert {"page": page} in check_wiki(root)["orphans"]
    result, _ = lint(wiki, monkeypatch)
    assert {"page": page} not in result.after["orphans"]


@pytest.mark.slow
@obeys("lint.index")
def test_lint_adds_a_missing_page_to_the_index(wiki, monkeypatch):
    root = wiki.root()
    (root / "index.md").write_text((root / "index.md").read_text().replace("- [[entities/Ada-Lovelace]]\n", ""))
    wiki.commit_all("manual: the index lost a line")
    lint(wiki, monkeypatch, kinds=("index_mismatch",))
    assert "- [[entities/Ada-Lovelace]]" in (root / "index.md").read_text()


@pytest.mark.slow
@obeys("lint.frontmatter")
def test_lint_adds_a_missing_frontmatter_key(wiki, monkeypatch):
    root = wiki.root()
    (root / ADA).write_text((root / ADA).read_text().replace("last_updated: 2026-11-20\n", ""))
    wiki.commit_all("manual: a key lost")
    lint(wiki, monkeypatch, kinds=("frontmatter",))
    assert "last_updated:" in (root / ADA).read_text()


@pytest.mark.slow
@obeys("lint.schema")
def test_lint_adds_a_missing_section_above_the_marker(wiki, monkeypatch):
    root = wiki.root()
    (root / ADA).write_text((root / ADA).read_text().replace("## Roles and affiliations\n", ""))
    wiki.commit_all("manual: a heading lost")
    lint(wiki, monkeypatch, kinds=("schema",))
    assert "## Roles and affiliations" in (root / ADA).read_text()


@pytest.mark.slow
@obeys("lint.contradiction")
def test_lint_records_a_contradiction_on_both_pages(wiki, monkeypatch):
    root = new_source(wiki)
    (root / f"wiki/sources/{S2}.md").write_text(source_page(S2, "The engine was built", []))
    index(root, [f"sources/{S2}"])
    claim = f"- The Analytical Engine was finished in the life of Babbage. {cite(S2, 2)}"
    (root / ADA).write_text((root / ADA).read_text().replace(
        "## Roles and affiliations\n", f"## Roles and affiliations\n{claim.replace('The Analytical Engine', 'The [[concepts/analytical-engine|Analytical Engine]]')}\n"))
    wiki.commit_all("manual: two claims that disagree")
    result, _ = lint(wiki, monkeypatch, Hints(skip=("unsupported",)), kinds=("contradiction_candidates",))
    assert "(disputed)" in (root / ENGINE).read_text() and "(disputed)" in (root / ADA).read_text()
    assert {item["page"] for item in result.after["open_contradictions"]} == {ENGINE, ADA}


# --- syntheses ---------------------------------------------------------------------------------


@pytest.mark.slow
@obeys("weekly.synthesis")
def test_the_weekly_synthesis_lands(wiki, monkeypatch):
    root = new_source(wiki)
    (root / f"wiki/sources/{S2}.md").write_text(source_page(S2, "The engine was built", [f"- {PARAS2[0]} {cite(S2, 1)}"]))
    index(root, [f"sources/{S2}"])
    subprocess.run(["git", "add", "-A", "wiki", "index.md"], cwd=root, check=True)
    # The ingest of the week: on Tuesday of 2026-W49.
    subprocess.run(["git", "commit", "-qm", f"ingest: {S2}"], cwd=root, check=True,
                   env={**os.environ, "GIT_COMMITTER_DATE": f"{DAY}T12:00:00+00:00"})
    with ObedientAnthropic(root) as model:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.base_url)
        result = weekly_synthesis(wiki, WikiAgent.from_settings(), date(2026, 11, 30), tz="UTC", max_turns=20,
                                  thin_week=3)
    assert result.outcome.ok, result.outcome.problems
    assert head_subject(root) == "synthesis: weekly 2026-W49" and len(model.plans) == 1
    page = (root / "wiki/syntheses/weekly/2026-W49.md").read_text()
    assert page.count("Thin week: only 1 new sources.") == 1 and f"[[sources/{S2}]]" in page


@pytest.mark.slow
@obeys("topic.synthesis")
def test_a_topic_synthesis_lands(wiki, monkeypatch):
    root = wiki.root()
    with ObedientAnthropic(root) as model:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.base_url)
        outcome = topic_synthesis(wiki, WikiAgent.from_settings(), "analytical-engine", today=DAY, max_turns=20)
    assert outcome.ok, outcome.problems
    assert head_subject(root) == "synthesis: topic analytical-engine"
    found = check_wiki(root)
    topic = "wiki/syntheses/topics/analytical-engine.md"
    assert PARAS1[1] in (root / topic).read_text()
    assert not [f for kind in ("uncited", "index_mismatch", "frontmatter") for f in found[kind] if f["page"] == topic]


# --- the refusal note reaches each retry ----------------------------------------------------------


@pytest.mark.slow
def test_a_refused_lint_retry_hears_why(wiki, monkeypatch):
    """A lint whose agent rewords the owner's line: each try is refused and
    rolled back, and each retry's prompt names the rule (before, only an
    ingest's retry did)."""
    from kb_assets.wiki.wiki_pages import wiki_lint
    from kb_resources.services import TelegramNotifierResource, WikiAgentResource
    from kb_resources.stores import WikiResource
    from tests.fake_anthropic import FakeAnthropic
    from tests.obedient_agent import script

    root = wiki.root()
    page = (root / ENGINE).read_text()
    report = f"---\ntype: synthesis\nkind: lint\nperiod: {DAY}\ncreated: {DAY}\nsources: []\n---\n# Lint\n"
    turns = script([ENGINE], {ENGINE: page.replace(OWNER_NOTE, "The agent rewrote the note."),
                              f"wiki/syntheses/lint/{DAY}.md": report}, commit_message=f"lint: {DAY}")
    instance = dg.DagsterInstance.ephemeral()
    with FakeAnthropic(turns=turns) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        result = dg.materialize([wiki_lint], partition_key=DAY, instance=instance, raise_on_error=False,
                                resources={"wiki": WikiResource.from_settings(),
                                           "wiki_agent": WikiAgentResource.from_settings(),
                                           "telegram": TelegramNotifierResource.from_settings()})
        firsts = [r["messages"][0]["content"] for r in fake.requests if len(r["messages"]) == 1]
    assert not result.success
    prompts = [c if isinstance(c, str) else "\n".join(b.get("text", "") for b in c) for c in firsts]
    assert len(prompts) == 4 and "kb refused your last try" not in prompts[0]
    assert all("kb refused your last try of this lint" in p and f"{ENGINE}: the lines above" in p
               for p in prompts[1:])
    assert (root / ENGINE).read_text() == page
