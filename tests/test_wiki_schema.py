"""The one definition of the wiki's formats (kb/wiki/schema.py) and its
readers: the playbook, the checks, the agent's allowlist and the parsers
follow it, and a wiki in the specification's schema is clean."""

import pytest

from kb.wiki.agent import tool_deny_reason
from kb.wiki.checks import check_wiki
from kb.wiki.playbook import CLAUDE_MD
from kb.wiki.schema import (AUTO_SECTION_MARKER, GIT_PREFIXES, PARSED_KEYS, SCHEMAS, entity_name, name_problem,
                            parsed_paragraphs, source_slug)
from kb.wiki_files import split_frontmatter
from tests.wiki_pages import concept_page, entity_page, parsed_file, source_page, weekly_page

S = "0193f7a8-great-article"
T = "0293f7a8-a-later-parse"


def test_names_of_the_specification():
    assert source_slug("0193f7a8c2", "Great Article!") == S
    long = source_slug("0193f7a8c2", "word " * 40)
    assert len(long) <= 60 and long.startswith("0193f7a8-word-") and not long.endswith("-")
    assert entity_name("Andrej Karpathy") == "Andrej-Karpathy" and entity_name("OpenAI") == "OpenAI"
    with pytest.raises(ValueError, match="resource id 'x1'"):
        source_slug("x1", "short id")
    assert name_problem("entities/Andrej-Karpathy.md") is None
    assert name_problem("concepts/mixture-of-experts.md") is None
    assert name_problem(f"sources/{S}.md") is None
    assert name_problem("syntheses/weekly/2026-W48.md") is None
    for bad in ("entities/Ada Lovelace.md", "entities/ada-lovelace.md", "concepts/Vector Search.md",
                "sources/great-article-0193f7a8c2.md", "syntheses/weekly/week-48.md", f"sources/{S}{'-x' * 30}.md"):
        assert name_problem(bad) and bad in name_problem(bad), bad


def test_the_agent_may_not_make_a_page_with_another_name(tmp_path):
    (tmp_path / "wiki/entities").mkdir(parents=True)
    (tmp_path / "wiki/entities/Ada Lovelace.md").write_text("# an old page\n")
    denied = tool_deny_reason("Write", {"file_path": "wiki/entities/ada lovelace.md"}, tmp_path)
    assert denied and "Title-Case-With-Hyphens" in denied
    assert tool_deny_reason("Write", {"file_path": "wiki/entities/Ada-Lovelace.md"}, tmp_path) is None
    # A page that exists keeps its name until `kb wiki migrate` renames it.
    assert tool_deny_reason("Edit", {"file_path": "wiki/entities/Ada Lovelace.md"}, tmp_path) is None


def test_the_playbook_prints_each_schema():
    for schema in SCHEMAS:
        for key in schema.keys:
            assert f"\n{key}:" in CLAUDE_MD, (schema.kind, key)
        for section in schema.sections + schema.auto_sections:
            assert f"## {section}" in CLAUDE_MD, (schema.kind, section)
    assert AUTO_SECTION_MARKER in CLAUDE_MD
    assert all(prefix in CLAUDE_MD for prefix in GIT_PREFIXES if prefix != "manual:")


def test_a_parsed_file_has_the_keys_of_the_specification_then_the_title():
    text = parsed_file("0193f7a8c2", "Great Article", ["First paragraph.", "Second paragraph."])
    page = split_frontmatter(text)
    assert list(page.data) == list(PARSED_KEYS)
    assert [line for line in page.body if line][0] == "# Great Article"
    # The title is not a paragraph: #para1 is the first paragraph of the text.
    assert parsed_paragraphs(text) == ["First paragraph.", "Second paragraph."]


def spec_wiki(root):
    paragraphs = ["Retrieval-augmented generation lets a language model answer from passages that a search finds first.",
                  "A RAG pipeline retrieves passages with a search first, and a language model answers from them.",
                  "Ada Lovelace wrote about the engine in 1843."]
    files = {
        f"raw/parsed/web/{S}.md": parsed_file("0193f7a8c2", "Great article", paragraphs),
        f"raw/parsed/web/{T}.md": parsed_file("0293f7a8c2", "A later parse", paragraphs),
        f"wiki/sources/{S}.md": source_page(S, "Great article", [f"- A claim. [[sources/{S}#para1]]"],
                                            resource_id="0193f7a8c2", tldr="An uncited summary line.",
                                            connections=["- Mentions [[entities/Ada-Lovelace]].",
                                                         "- Builds on [[concepts/rag]]."],
                                            extra={"superseded_by": T}),
        f"wiki/sources/{T}.md": source_page(T, "A later parse", [f"- A claim. [[sources/{T}#para1]]"],
                                            resource_id="0293f7a8c2",
                                            connections=["- Builds on [[concepts/rag-pipelines]]."]),
        "wiki/entities/Ada-Lovelace.md": entity_page(
            "Ada Lovelace", f"Ada Lovelace wrote about the engine in 1843. [[sources/{T}#para3]]",
            [f"- She wrote about the engine in 1843. [[sources/{S}#para3]] [[sources/{T}#para3]]"],
            sources=[S, T], connections=["- Frequently cited alongside [[concepts/rag]]."]),
        "wiki/concepts/rag.md": concept_page(
            "Retrieval-augmented generation",
            f"Retrieval-augmented generation lets a language model answer from passages that a search finds first. "
            f"[[sources/{S}#para1]]",
            [f"- A language model answers from passages that a search finds first. [[sources/{S}#para1]]"], sources=[S],
            connections=["- [[entities/Ada-Lovelace]]"], more={"Open questions": ["- Does it scale to a million pages?"]}),
        "wiki/concepts/rag-pipelines.md": concept_page(
            "RAG pipelines",
            f"A RAG pipeline retrieves passages with a search first, and a language model answers from them. "
            f"[[sources/{T}#para2]]",
            [], sources=[T], connections=["- [[concepts/rag]]"]),
        "wiki/syntheses/weekly/2026-W48.md": weekly_page(
            "2026-W48", [S], "Retrieval", [f"Both sources speak of retrieval. [[sources/{S}#para1]]"],
            reading=[f"- [[sources/{S}]]: the first one.", f"- [[sources/{T}]]: the second one."]),
        "index.md": "# Index\n\n## Sources\n" + "".join(f"- [[sources/{x}]]\n" for x in (S, T))
                    + "\n## Entities\n- [[entities/Ada-Lovelace]]\n\n## Concepts\n- [[concepts/rag]]\n"
                    "- [[concepts/rag-pipelines]]\n\n## Syntheses\n- [[syntheses/weekly/2026-W48]]\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_wiki_in_the_specifications_schema(tmp_path):
    found = check_wiki(spec_wiki(tmp_path))
    # Its frontmatter, sections and names are right, and the lines that the
    # specification leaves without a citation (TL;DR, Open questions,
    # Connections) are no finding.
    assert found["frontmatter"] == [] and found["schema"] == [] and found["uncited"] == []
    assert found["unsupported"] == [] and found["dangling_links"] == [] and found["index_mismatch"] == []
    # Two concept pages whose `## Definition`s say one thing.
    assert [(d["page"], d["other"]) for d in found["duplicates"]] == [
        ("wiki/concepts/rag-pipelines.md", "wiki/concepts/rag.md")]
    assert found["duplicates"][0]["reason"].startswith("definitions close")
    # A claim that cites only the superseded parse is stale; one that cites the later parse too is not.
    assert [(s["page"], s["superseded_by"]) for s in found["stale_claims"]] == [
        ("wiki/concepts/rag.md", T), ("wiki/concepts/rag.md", T)]


def test_the_checks_name_what_breaks_the_schema(tmp_path):
    root = spec_wiki(tmp_path)
    page = root / "wiki/concepts/rag.md"
    page.write_text(page.read_text().replace("last_updated: 2026-11-20\n", "").replace(AUTO_SECTION_MARKER + "\n", "")
                    .replace("## Key claims", "## Claims"))
    (root / "wiki/entities/Ada-Lovelace.md").rename(root / "wiki/entities/Ada Lovelace.md")
    found = check_wiki(root)
    assert {(f["page"], f["problem"]) for f in found["frontmatter"]} == {
        ("wiki/concepts/rag.md", "missing keys: last_updated")}
    problems = {(f["page"], f["problem"]) for f in found["schema"]}
    assert ("wiki/concepts/rag.md", "missing sections: ## Key claims") in problems
    assert ("wiki/concepts/rag.md", f"no {AUTO_SECTION_MARKER} line before the auto sections") in problems
    assert any(p == "wiki/entities/Ada Lovelace.md" and "Title-Case-With-Hyphens" in problem
               for p, problem in problems)


def test_a_claim_whose_source_a_later_source_contradicts_is_stale(tmp_path):
    """Spec 2.1: the lint finds stale claims. A claim is stale when an open
    item of a Contradictions section sets its cited passage against a source
    that came later; a resolved item, or a claim that also cites the later
    source, is no finding."""
    early, late = "0393f7a8-engine-notes", "0493f7a8-engine-history"
    claim = f"The engine was finished in 1843. [[sources/{early}#para1]]"
    other = f"The engine used punched cards. [[sources/{early}#para2]]"
    both = f"The engine was planned in 1837. [[sources/{early}#para1]] [[sources/{late}#para1]]"
    item = (f"- The notes say finished in 1843 [[sources/{early}#para1]], "
            f"the history says never finished [[sources/{late}#para1]].")
    files = {
        f"wiki/sources/{early}.md": source_page(early, "Engine notes", [claim],
                                                extra={"ingested_at": "2026-01-05T09:00:00+00:00"}),
        f"wiki/sources/{late}.md": source_page(late, "Engine history", [f"Never finished. [[sources/{late}#para1]]"],
                                               extra={"ingested_at": "2026-02-05T09:00:00+00:00"}),
        "wiki/concepts/analytical-engine.md": concept_page(
            "Analytical engine", f"A machine of Babbage. [[sources/{early}#para1]]", [claim, other, both],
            more={"Contradictions": [item]}),
    }
    root = tmp_path / "wiki-root"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    stale = check_wiki(root, embed=_no_embed)["stale_claims"]
    assert {(s["page"], s["text"].split(" [[")[0], s["contradicted_by"]) for s in stale} == {
        ("wiki/concepts/analytical-engine.md", "A machine of Babbage.", late),
        ("wiki/concepts/analytical-engine.md", "The engine was finished in 1843.", late)}
    # (A source page says what its source says: its own claims are no finding.)
    # The owner or the lint resolves the item: the claims are no longer stale.
    page = root / "wiki/concepts/analytical-engine.md"
    page.write_text(page.read_text().replace(item, item + " Resolved: the history is right."))
    assert check_wiki(root, embed=_no_embed)["stale_claims"] == []


def _no_embed(texts):
    """Vectors that make no pair near: this test reads no model finding."""
    import numpy as np

    vectors = np.zeros((len(texts), max(len(texts), 1)), dtype=np.float32)
    for i in range(len(texts)):
        vectors[i, i] = 1.0
    return vectors


def test_the_frontmatter_reader_keeps_kbs_boundaries_and_line_numbers():
    """python-frontmatter reads the block (kb/wiki_files.py) with kb's own
    boundary: the checks report body line numbers, and a page keeps its
    first blank line."""
    page = split_frontmatter("---\ntitle: A\n---\n\n# A\n")
    assert page == ({"title": "A"}, None, ["", "# A"], 4)
    assert split_frontmatter("---\ntitle: A\n---\n\n\n# A").body_start == 4
    # `----` is a rule of Markdown, not a boundary; spaces around `---` are.
    assert split_frontmatter("----\ntitle: A\n----\nB").error == "no frontmatter"
    assert split_frontmatter(" ---\ntitle: A\n--- \nB") == ({"title": "A"}, None, ["B"], 4)
    assert split_frontmatter("---\r\ntitle: A\r\n---\r\nB\r\n") == ({"title": "A"}, None, ["B"], 4)
    # A block scalar at the end of the block gets no extra new line.
    assert split_frontmatter("---\nnote: |\n  x\n---\n").data == {"note": "x"}
    assert split_frontmatter("---\ntitle: [\n---\nB").error.startswith("frontmatter is not valid YAML")
    assert split_frontmatter("---\n- a\n---\nB").error == "frontmatter is not a mapping"
    assert split_frontmatter("---\ntitle: A\nB").error == "frontmatter has no closing ---"


def test_kbs_writer_keeps_values_that_yaml_would_change_as_strings():
    """kb writes the frontmatter itself (kb/wiki/schema.py): "12:30" in
    plain YAML reads back as 750, "0x10" as 16, "on" as True."""
    import datetime

    from kb.wiki.schema import SOURCE, render_frontmatter

    values = {"title": "12:30", "time": "12:30", "hex": "0x10", "word": "on", "day": "2026-12-05"}
    data = split_frontmatter(render_frontmatter(SOURCE, values) + "\n# 12:30\n").data
    assert (data["title"], data["time"], data["hex"], data["word"]) == ("12:30", "12:30", "0x10", "on")
    assert data["day"] == datetime.date(2026, 12, 5)  # the specification writes a date plain


def test_a_migration_renames_embeds_and_links_alike():
    from kb.wiki.migrate import _rewrite_links

    text = "see ![[entities/old]], [[entities/old|Old]] and [[entities/old#Roles]]"
    assert _rewrite_links(text, {"entities/old": "entities/New"}) == \
        "see ![[entities/New]], [[entities/New|Old]] and [[entities/New#Roles]]"
