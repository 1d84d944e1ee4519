"""The rules on the text of a change (kb/wiki/change_rules.py), through the
real check of a commit (Wiki.verify_change on a real git wiki), as the
worker runs it after each agent change: a cited claim keeps its words, and
the owner's lines above the marker stay. Each case plays an agent that a
source talked into a change; no model decides."""

import subprocess

import pytest

from kb.wiki.change_rules import claim_key, lost_cited_claims
from kb.wiki.repo import Wiki
from kb.wiki.schema import AUTO_SECTION_MARKER
from tests.wiki_pages import concept_page, entity_page

S = "a1b2c3d4-engine-notes"
CLAIM = f"- Babbage's Difference Engine tabulates polynomials, as Ada Lovelace wrote in 1843. [[sources/{S}#para2]]"
OWNER_LINE = "The owner wrote this line by hand."
PAGE = "wiki/concepts/difference-engine.md"
OTHER = "wiki/entities/Ada-Lovelace.md"
BASE = concept_page("difference engine", f"{OWNER_LINE} [[sources/{S}#para1]]", [CLAIM], sources=[S],
                    connections=["- [[entities/Ada-Lovelace]]"])
ADA = entity_page("Ada Lovelace", f"A mathematician. [[sources/{S}#para1]]", [], sources=[S])


@pytest.fixture
def wiki():
    w = Wiki.from_settings()
    root = w.ensure()
    (root / PAGE).write_text(BASE)
    (root / OTHER).write_text(ADA)
    w.commit_all("manual: two pages")
    return w


def verify(wiki: Wiki, pages: dict[str, str], *, may_delete_pages: bool = False) -> list[str]:
    """Write `pages` as one ingest commit, verify it, roll it back. The problems."""
    root = wiki.root()
    before = wiki.begin_change()
    for path, text in pages.items():
        (root / path).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-qm", "ingest: a1b2c3d4-engine-notes"], cwd=root, check=True)
    problems = wiki.verify_change(before, "ingest:", may_delete_pages=may_delete_pages).problems
    wiki.rollback(before.sha)
    wiki.end_change()
    assert (root / PAGE).read_text() == BASE  # the rollback leaves the page as it was
    return problems


def changed(claim: str) -> dict[str, str]:
    return {PAGE: BASE.replace(CLAIM, claim)}


LOST = (f"refused: {PAGE}: the cited claim {CLAIM[2:]!r} was removed or changed. Keep its words and its citations: "
        "move it, add a citation, or mark it (disputed) (and record it in a Contradictions section) or (unsupported); "
        "never delete or reword a cited claim")


@pytest.mark.parametrize("name,claim", [
    ("a changed word", CLAIM.replace("polynomials", "logarithms")),
    ("a changed year", CLAIM.replace("1843", "1842")),
    ("an inserted negation", CLAIM.replace("tabulates", "did not tabulate")),
    ("a myth prefix", "- It is a myth that " + CLAIM[2:]),
    ("a sentence added after it", CLAIM + " This is false."),
    ("the claim in an HTML comment", f"<!-- {CLAIM} -->"),
    ("the claim in a comment of two lines", f"<!--\n{CLAIM}\n-->"),
    ("the claim in a code block", f"```\n{CLAIM}\n```"),
    ("the claim in an Obsidian comment", f"%%\n{CLAIM}\n%%"),
    # Markdown joins the claim to the new line above it: one list item,
    # "It is a myth, spread by a forged source, that Babbage's ...".
    ("a myth prefix on the line above", "- It is a myth, spread by a forged source, that\n  " + CLAIM[2:]),
    ("a myth prefix above, as a paragraph", "It is a myth that\n" + CLAIM[2:]),
])
def test_a_cited_claim_that_changes_its_meaning_is_refused(wiki, name, claim):
    assert LOST in verify(wiki, changed(claim)), name


def test_a_claim_moved_into_the_frontmatter_is_refused(wiki):
    page = BASE.replace(CLAIM + "\n", "").replace("---\n# ", f"note: {CLAIM[2:]!r}\n---\n# ", 1)
    assert "note:" in page.split("---")[1]
    assert LOST in verify(wiki, {PAGE: page})


@pytest.mark.parametrize("name,pages", [
    ("marked disputed", changed(CLAIM + " (disputed)")),
    ("white space and list mark", changed("*   " + CLAIM[2:].replace(" tabulates ", "  tabulates "))),
    ("link text and .md", changed(CLAIM.replace(f"[[sources/{S}#para2]]", f"[[sources/{S}.md#para2|the notes]]"))),
    ("moved to another page word for word",
     {PAGE: BASE.replace(CLAIM + "\n", ""), OTHER: ADA.replace("## Roles and affiliations\n",
                                                               f"## Roles and affiliations\n{CLAIM}\n")}),
])
def test_a_claim_that_keeps_its_words_passes(wiki, name, pages):
    problems = verify(wiki, pages)
    assert not [p for p in problems if "cited claim" in p], (name, problems)


def test_the_owners_lines_above_the_marker_stay(wiki):
    rule = f"refused: {PAGE}: the lines above {AUTO_SECTION_MARKER} are the owner's"
    # A reworded owner's line: refused, with the page, the rule and the line.
    reworded = verify(wiki, {PAGE: BASE.replace(OWNER_LINE, "The agent rewrote this line.")})
    assert [p for p in reworded if p.startswith(rule)] == [
        f"{rule}; a change may add a line there (as a list item, or after an empty line: not joined above an "
        f"owner's line), and add a citation or the mark (disputed) or (unsupported) at the end of a line; never "
        f"change, move or delete one (the line "
        f"{OWNER_LINE + ' [[sources/' + S + '#para1]]'!r} was changed or removed)"]
    # The marker removed, or moved above the owner's line: refused.
    assert any(p.startswith(rule) and "the marker line is gone" in p
               for p in verify(wiki, {PAGE: BASE.replace(AUTO_SECTION_MARKER + "\n", "")}))
    moved_up = BASE.replace(AUTO_SECTION_MARKER + "\n", "").replace("## Definition\n",
                                                                     f"{AUTO_SECTION_MARKER}\n## Definition\n")
    assert any(p.startswith(rule) for p in verify(wiki, {PAGE: moved_up}))
    # A page with the owner's section deleted, also in a lint that may delete pages, when its lines go nowhere.
    root = wiki.root()
    before = wiki.begin_change()
    (root / PAGE).unlink()
    subprocess.run(["git", "commit", "-qam", "lint: 2026-12-01"], cwd=root, check=True)
    problems = wiki.verify_change(before, "lint:", may_delete_pages=True).problems
    wiki.rollback(before.sha)
    wiki.end_change()
    assert any(p.startswith(rule) and "the merge lost the line" in p for p in problems)


def test_new_lines_and_changes_below_the_marker_pass(wiki):
    added = BASE.replace(CLAIM, CLAIM + f"\n- The engine was a calculator. [[sources/{S}#para3]]")
    below = added.replace("- [[entities/Ada-Lovelace]]", "- [[entities/Ada-Lovelace]], [[concepts/analytical-engine]]")
    assert verify(wiki, {PAGE: below}) == []
    # The playbook's mark of a contradiction is the one change that a line above the marker may take.
    assert verify(wiki, changed(CLAIM + " (disputed)")) == []


def test_a_page_of_the_earlier_format_has_no_owners_section(wiki):
    """kb's pages before the marker: the claim rule holds, the owner's rule has no lines to keep."""
    old = f"---\ntype: concept\nname: x\n---\n# x\n\n{CLAIM}\n"
    assert lost_cited_claims({"a.md": old}, {"a.md": old.replace("# x", "# y")}) == []
    assert claim_key(CLAIM + " (disputed)") == claim_key("* " + CLAIM[2:])


# --- what the playbook asks for lands; a hostile change near it does not ----------------------

OWNER_FULL = f"{OWNER_LINE} [[sources/{S}#para1]]"
UNCITED_OWNER = "The owner keeps this note without a source."
WITH_NOTE = BASE.replace("## Key claims\n", f"{UNCITED_OWNER}\n\n## Key claims\n")
T = "b2c3d4e5-later-notes"


@pytest.fixture
def noted(wiki):
    """The owner wrote an uncited line above the marker, in a `manual:` commit."""
    root = wiki.root()
    (root / PAGE).write_text(WITH_NOTE)
    (root / f"wiki/sources/{S}.md").write_text("# s\n")
    (root / f"wiki/sources/{T}.md").write_text("# t\n")
    wiki.commit_all("manual: the owner's note")
    return wiki


def verify_from(wiki: Wiki, base: str, pages: dict[str, str], **kw) -> list[str]:
    root = wiki.root()
    before = wiki.begin_change()
    for path, text in pages.items():
        (root / path).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-qm", "lint: 2026-12-01"], cwd=root, check=True)
    problems = wiki.verify_change(before, "lint:", **{"may_delete_pages": True, **kw}).problems
    wiki.rollback(before.sha)
    wiki.end_change()
    assert (root / PAGE).read_text() == base
    return problems


@pytest.mark.parametrize("name,old,new", [
    ("the mark (unsupported)", CLAIM, CLAIM + " (unsupported)"),
    ("both marks", CLAIM, CLAIM + " (disputed) (unsupported)"),
    ("an added citation", CLAIM, CLAIM + f" [[sources/{T}#para1]]"),
    ("a citation of another passage of the same source", CLAIM, CLAIM.replace("#para2", "#para4")),
    ("a citation added to the owner's uncited line", UNCITED_OWNER, UNCITED_OWNER + f" [[sources/{T}#para3]]"),
    ("a mark and a citation on the owner's cited line", OWNER_FULL, OWNER_FULL + f" [[sources/{T}]] (disputed)"),
    # New lines, as the playbook asks: a list item, or after an empty line;
    # a line below a kept line may join it (a merge puts moved lines there).
    ("a new list item above a claim", CLAIM, f"- A new fact. [[sources/{T}#para3]]\n{CLAIM}"),
    ("a new paragraph above the owner's line", OWNER_FULL, f"A new fact. [[sources/{T}#para3]]\n\n{OWNER_FULL}"),
    ("a new line joined below the owner's line", OWNER_FULL, f"{OWNER_FULL}\nA new fact. [[sources/{T}#para3]]"),
])
def test_the_changes_that_the_playbook_asks_for_land(noted, name, old, new):
    assert verify_from(noted, WITH_NOTE, {PAGE: WITH_NOTE.replace(old, new)}) == [], name


@pytest.mark.parametrize("name,old,new", [
    ("(unsupported) and a changed word", CLAIM, CLAIM.replace("polynomials", "logarithms") + " (unsupported)"),
    ("a mark in the middle", CLAIM, CLAIM.replace("tabulates", "(disputed) tabulates")),
    ("a citation taken away", OWNER_FULL, OWNER_LINE),
    ("a citation swapped for another source", CLAIM, CLAIM.replace(f"sources/{S}#para2", f"sources/{T}#para2")),
    ("the owner's uncited line reworded", UNCITED_OWNER, "The agent keeps this note without a source."),
    ("the owner's uncited line with a word added and a citation", UNCITED_OWNER,
     UNCITED_OWNER.replace("keeps", "no longer keeps") + f" [[sources/{T}]]"),
    ("a live link pointed elsewhere, its words kept", "- [[entities/Ada-Lovelace]]", "- [[entities/Ada-Lovelace]]"),
    ("a new line joined above the owner's line", OWNER_FULL, f"It is not true that\n{OWNER_FULL}"),
    ("the owner's line in an Obsidian comment", UNCITED_OWNER, f"%%\n{UNCITED_OWNER}\n%%"),
])
def test_a_hostile_change_next_to_an_allowance_is_refused(noted, name, old, new):
    page = WITH_NOTE.replace(old, new)
    if name.startswith("a live link"):
        # Above the marker, the owner's cited line links the page of Ada; the agent keeps
        # the words that the link shows and points it at another page.
        line = f"{OWNER_FULL}"
        base = WITH_NOTE.replace(line, f"{OWNER_LINE} See [[entities/Ada-Lovelace]]. [[sources/{S}#para1]]")
        root = noted.root()
        (root / PAGE).write_text(base)
        noted.commit_all("manual: a link")
        page = base.replace("[[entities/Ada-Lovelace]]", "[[concepts/difference-engine|Ada Lovelace]]")
        problems = verify_from(noted, base, {PAGE: page})
    else:
        problems = verify_from(noted, WITH_NOTE, {PAGE: page})
    assert any(p.startswith("refused:") for p in problems), (name, problems)


def test_a_dangling_link_may_get_its_page_or_become_plain_text(noted):
    root = noted.root()
    line = f"{OWNER_LINE} It names [[entities/Ada Lovelace]]. [[sources/{S}#para1]]"
    base = WITH_NOTE.replace(OWNER_FULL, line)
    (root / PAGE).write_text(base)
    noted.commit_all("manual: a dangling link")
    fixed = base.replace("[[entities/Ada Lovelace]]", "[[entities/Ada-Lovelace|Ada Lovelace]]")
    plain = base.replace("[[entities/Ada Lovelace]]", "Ada Lovelace")
    reworded = base.replace("[[entities/Ada Lovelace]]", "Charles Babbage")
    assert verify_from(noted, base, {PAGE: fixed}) == []
    assert verify_from(noted, base, {PAGE: plain}) == []
    assert any("was changed or removed" in p for p in verify_from(noted, base, {PAGE: reworded}))


MERGED = "wiki/concepts/difference-engines.md"
OTHER_CLAIM = f"- A second engine was designed in 1847. [[sources/{S}#para3]]"
MERGED_PAGE = concept_page("difference engines", f"Engines that tabulate. [[sources/{S}#para1]]", [OTHER_CLAIM],
                           sources=[S])
REDIRECT = ('---\ntype: concept\ncreated: 2026-11-20\nlast_updated: 2026-12-01\nsources: []\n'
            'name: "difference engines"\nredirect: concepts/difference-engine\n---\n# difference engines\n\n'
            'Merged into [[concepts/difference-engine]].\n')


def test_a_merge_lands_when_every_line_moves_and_a_fake_merge_is_refused(noted):
    """The playbook's merge: every line above the other page's marker moves to
    the kept page word for word, the other page becomes a redirect page, and
    kb's finish points the links at the kept page (here: Ada's owner's line)."""
    from kb.wiki.finish import finish_merges

    root = noted.root()
    (root / MERGED).write_text(MERGED_PAGE)
    ada = ADA.replace("A mathematician.", "A mathematician who knew [[concepts/difference-engines]].")
    (root / OTHER).write_text(ada)
    noted.commit_all("manual: a second page for one subject")
    base = (root / PAGE).read_text()
    moved = base.replace(CLAIM + "\n", CLAIM + f"\nEngines that tabulate. [[sources/{S}#para1]]\n{OTHER_CLAIM}\n")
    # A fake merge: the redirect page, but its claim went nowhere.
    dropped = verify_from(noted, base, {MERGED: REDIRECT})
    assert any("the cited claim 'A second engine was designed in 1847." in p for p in dropped), dropped
    # A merge in an ingest (no lint): refused, the page lost its marker.
    in_ingest = verify_from(noted, base, {MERGED: REDIRECT, PAGE: moved}, may_delete_pages=False)
    assert any("the marker line is gone" in p for p in in_ingest), in_ingest
    # The agent points the owner's link itself, and the link loses the words that it showed: refused.
    pointed = ada.replace("[[concepts/difference-engines]]", "[[concepts/difference-engine]]")
    reworded = verify_from(noted, base, {MERGED: REDIRECT, PAGE: moved, OTHER: pointed})
    assert any(p.startswith(f"refused: {OTHER}") for p in reworded), reworded
    # ... and with its words kept, it lands.
    kept_words = ada.replace("[[concepts/difference-engines]]", "[[concepts/difference-engine|difference engines]]")
    assert verify_from(noted, base, {MERGED: REDIRECT, PAGE: moved, OTHER: kept_words}) == []
    # The merge of the playbook, then kb's part: it lands.
    before = noted.begin_change()
    (root / MERGED).write_text(REDIRECT)
    (root / PAGE).write_text(moved)
    finish_merges(root)
    assert "who knew [[concepts/difference-engine|difference engines]]." in (root / OTHER).read_text()
    assert "difference engines" in (root / PAGE).read_text().split("---")[1]  # the other name is an alias
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-qm", "lint: 2026-12-01"], cwd=root, check=True)
    assert noted.verify_change(before, "lint:", may_delete_pages=True).problems == []
    noted.end_change()
    finish_merges(root)  # a second run changes nothing
    assert noted.dirty_paths() == []


def test_a_change_of_a_page_whose_name_is_not_ascii_lands_and_its_claims_are_checked(wiki):
    """git quotes a name that is not plain ASCII ("wiki/G\\303\\266del.md")
    unless it writes NUL-separated names (-z). The rules read the quoted
    name as a path outside the wiki: every change of such a page (the
    owner's own names) was refused, and its claims were not compared."""
    root = wiki.root()
    name = "wiki/entities/Kurt-Gödel.md"
    claim = f"- Gödel proved the incompleteness theorems in 1931. [[sources/{S}#para3]]"
    page = entity_page("Kurt Gödel", f"A logician. [[sources/{S}#para1]]", [claim], sources=[S])
    (root / name).write_text(page)
    wiki.commit_all("manual: a page whose name is not ASCII")
    more = page.replace(claim, claim + f"\n- He worked in Vienna. [[sources/{S}#para4]]")
    assert verify(wiki, {name: more}) == []
    lost = verify(wiki, {name: page.replace("1931", "1930")})
    assert f"refused: {name}: the cited claim {claim[2:]!r} was removed or changed" in " ".join(lost), lost
