"""Wiki pages whose reading cost grew faster than their size (the red team,
7 December 2026). A page may hold a stranger's text: an agent change adds
up to 256 KiB to a file. Each input here is one that the old rule would
read for minutes (it then fails by the timeout, or by its result); the
rules read it in a second and keep their answers on honest pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

HEAD = "---\ntype: concept\ncreated: 2026-01-01\nlast_updated: 2026-01-01\nsources: []\n---\n# {title}\n\n## Definition\n"
TAIL = "\n<!-- kb:auto -->\n## Connections\n"


def flat_embed(texts):
    """Every text the same unit vector: the checks' embedder, at no cost."""
    vectors = np.zeros((len(texts), 8), dtype=np.float32)
    vectors[:, 0] = 1.0
    return vectors


def wiki(root: Path, pages: dict[str, str]) -> Path:
    for relative, text in pages.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    (root / "wiki").mkdir(exist_ok=True)
    listing = "".join(f"- [[{r.removeprefix('wiki/').removesuffix('.md')}]]\n" for r in pages if r.startswith("wiki/"))
    (root / "index.md").write_text("# Index\n" + listing)
    return root


@pytest.mark.timeout(60)
def test_comments_of_one_kind_do_not_make_the_other_kind_read_again():
    """After each comment the scan looked for both kinds again from there:
    a page of 256 KiB of "%%%%" (no "<!--") took 5.4 s on each request."""
    from kb.wiki_files import comment_spans, without_comments

    for text in ("%%%%" * 500_000, "<!---->" * 300_000):
        assert without_comments(text + "seen") == "seen"
        assert len(comment_spans(text)) == len(text) // (4 if text[0] == "%" else 7)


@pytest.mark.timeout(60)
def test_frontmatter_with_a_yaml_alias_is_refused_by_name():
    """555 bytes of nested aliases ("a billion laughs") took 10 s and 1 GB
    in kb wiki check, and 2.2 GB in the web page: each reader that turns a
    value into text copies the aliases out. kb's pages need none."""
    from kb.wiki_files import split_frontmatter

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]" for n in range(1, 9)]
    page = "---\n" + "\n".join(lines) + "\ntype: *a8\n---\n# X\n"
    found = split_frontmatter(page)
    assert found.data is None and found.error == "frontmatter uses a YAML alias (*name): kb reads no alias"
    # An anchor alone, or a "*" in a value, is no alias.
    assert split_frontmatter("---\ntitle: \"*bold* &co\"\nlist: &l [a]\n---\n# X\n").data == {
        "title": "*bold* &co", "list": ["a"]}


@pytest.mark.timeout(60)
def test_the_marks_at_the_end_of_a_claim_are_read_from_the_end():
    """A regex anchored at the end was tried from each mark of a line that
    does not end in one: a line of 64 KiB took 2.9 s, in each of three rules
    of a change."""
    from kb.wiki.change_rules import claim_key

    assert claim_key("- claim [[sources/a]]" + " (disputed)" * 200_000 + " x").endswith("(disputed) x")
    assert claim_key("- Water boils [[sources/a]] (disputed) (unsupported) ") == "Water boils"
    assert claim_key("- Water boils(disputed)") == "Water boils"


@pytest.mark.timeout(60)
def test_the_owners_section_compares_each_line_once():
    """keeps() in the loop made the old line's key again for each new line:
    8,000 new lines under an owner's line of 32 KiB took 13.5 s."""
    from kb.wiki.change_rules import owner_section_problem
    from kb.wiki.schema import AUTO_SECTION_MARKER

    long_line = ("word " * 26_000).strip()
    head = "---\ntype: concept\n---\n# X\n\n## Definition\n"
    before = head + long_line + "\n" + AUTO_SECTION_MARKER + "\n## Connections\n"
    after = head + "- n\n" * 32_000 + long_line + " changed\n" + AUTO_SECTION_MARKER + "\n## Connections\n"
    assert "was changed or removed" in owner_section_problem("wiki/concepts/x.md", before, after)
    kept = head + "- n\n" * 32_000 + "\n" + long_line + "\n" + AUTO_SECTION_MARKER + "\n## Connections\n"
    assert owner_section_problem("wiki/concepts/x.md", before, kept) is None


@pytest.mark.timeout(120)
def test_the_checks_of_a_hostile_wiki_end_and_give_their_findings(tmp_path):
    """kb wiki check on pages that cost minutes before: a claim with 4,000
    citations of a source page of 256 KiB (its passages were copied and read
    once per citation: 2,000 citations of 128 KiB took 48 s and 1 GB); two
    pages of 64 KiB of near-equal claims that disagree (2.9 million pairs,
    31 s and 2 GB: now MAX_CONTRADICTION_PAIRS); and a link whose target is
    longer than a file name can be (Path.is_file() raised, and the whole
    check stopped)."""
    from kb.wiki.checks import check_wiki
    from kb.wiki.coherence import MAX_CONTRADICTION_PAIRS

    line = "Zeta eta theta iota kappa. " * 20
    source = "---\ntype: source\n---\n# S\n\n## TL;DR\n" + "\n".join([line.strip()] * (262_144 // len(line))) + "\n"
    claim = "- alpha beta gamma " + "[[sources/s]]" * 4_000 + "\n"
    agree, disagree = "- alpha [[sources/s]] [[concepts/t]]\n", "- alpha no [[sources/s]] [[concepts/t]]\n"
    root = wiki(tmp_path / "wiki-root", {
        "wiki/sources/s.md": source,
        "wiki/concepts/x.md": HEAD.format(title="X") + claim + "See [[" + "a" * 300 + "]].\n" + TAIL,
        "wiki/concepts/a.md": HEAD.format(title="A") + agree * (65_536 // len(agree)) + TAIL,
        "wiki/concepts/b.md": HEAD.format(title="B") + disagree * (65_536 // len(disagree)) + TAIL,
        "wiki/concepts/t.md": HEAD.format(title="T") + "T is a thing.\n" + TAIL})
    findings = check_wiki(root, flat_embed)
    # The flat embedder puts every passage at cosine 1 to the claim: it is held.
    assert not [f for f in findings["unsupported"] if f["page"].endswith("concepts/x.md")], findings["unsupported"][:3]
    assert len(findings["contradiction_candidates"]) == MAX_CONTRADICTION_PAIRS
    assert any("a" * 300 in str(f) for f in findings["dangling_links"]), findings["dangling_links"][:3]


@pytest.mark.timeout(60)
def test_a_lint_report_gets_its_unsupported_claims_in_one_write(tmp_path, monkeypatch):
    """A write of the report for each finding: 7,281 findings took 25 s of
    CPU and wrote 4.5 GB."""
    import kb.wiki.finish as finish

    day = "2026-12-07"
    root = wiki(tmp_path / "wiki-root", {f"wiki/syntheses/lint/{day}.md": f"---\ntype: synthesis\n---\n# Lint {day}\n"})
    writes = []
    write = finish.write_wiki_file
    monkeypatch.setattr(finish, "write_wiki_file", lambda *args: writes.append(args[1]) or write(*args))
    items = [{"page": "wiki/concepts/x.md", "line": n, "source": "nope", "reason": "the cited source page does not exist",
              "text": "alpha beta"} for n in range(20_000)]
    assert finish.finish_lint(root, day, items) == []
    report = (root / "wiki" / "syntheses" / "lint" / f"{day}.md").read_text().splitlines()
    assert report.count("- `wiki/concepts/x.md` line 19999: the cited source page does not exist: alpha beta") == 1
    assert len([line for line in report if line.startswith("- `wiki/concepts/x.md`")]) == 20_000
    assert [str(p) for p in writes].count(str(root / "wiki" / "syntheses" / "lint" / f"{day}.md")) == 1


@pytest.mark.timeout(60)
def test_a_flood_of_inline_links_is_shown_as_text_on_the_web_page():
    """Python-Markdown reads the brackets again after each inline link of a
    paragraph: 1,200 links took 7 s on each request of the page. A block of
    more than MAX_INLINE_LINKS, or a page of more than
    MAX_PAGE_INLINE_LINKS, is shown as it is written, in a code block; an
    honest paragraph and a list of wiki links keep their links."""
    from kb.apps.web.wiki_html import MAX_INLINE_LINKS, MAX_PAGE_INLINE_LINKS, render_markdown
    from kb.wiki_files import LinkResolver

    resolve = LinkResolver(["concepts/a"], ["index"])
    flood = "[a](https://b.example/) " * 1_500
    html = render_markdown(f"Intro with [one](https://c.example/).\n\n{flood}\n\n- [[concepts/a]]\n- [[concepts/a]]\n",
                           resolve)
    assert html.count("<a ") == 3 and html.count('href="https://b.example/"') == 0
    assert "<pre><code>[a](https://b.example/) [a]" in html
    page = ("[a](https://b.example/) " * MAX_INLINE_LINKS + "\n\n") * (MAX_PAGE_INLINE_LINKS // MAX_INLINE_LINKS + 1)
    assert render_markdown(page, resolve).count("<a ") == 0
    assert render_markdown(("[a](https://b.example/) " * MAX_INLINE_LINKS + "\n\n") * 3, resolve).count("<a ") == 150


def test_the_web_page_renders_a_wiki_page_once_while_it_and_the_page_names_stay_the_same(tmp_path, monkeypatch):
    """Python-Markdown takes about 90 microseconds a block: 256 KiB of
    headings that a source can get the agent to write took 5 s on each view
    of the page. The reader keeps the HTML while the page's text and the
    names of the wiki's pages stay the same; a new page that a link names,
    and a change of the page, render it again."""
    from kb.apps.web import reader as reader_module
    from kb.apps.web.reader import WikiReader
    from kb.apps.web.wiki_html import render_markdown, render_page

    concepts = tmp_path / "wiki" / "concepts"
    concepts.mkdir(parents=True)
    page_file = concepts / "a.md"
    page_file.write_text("# A\n\nSee [[concepts/b]].\n\n" + ("x\n-\n" * 50 + "\n") * 8)
    calls = []

    def counted(text, resolve):
        calls.append(text[:5])
        return render_markdown(text, resolve)

    wiki = WikiReader(tmp_path)
    first = wiki.rendered(wiki.read("concepts/a"), counted)
    assert 'class="wikilink missing"' in first and first.count("<h2") == 400
    assert wiki.rendered(wiki.read("concepts/a"), counted) == first and len(calls) == 1

    (concepts / "b.md").write_text("# B\n")  # the link's target is there now
    linked = wiki.rendered(wiki.read("concepts/a"), counted)
    assert len(calls) == 2 and 'href="#wiki=concepts/b"' in linked and "missing" not in linked

    page_file.write_text("# A\n\nSee [[concepts/b]] again.\n")
    changed = wiki.rendered(wiki.read("concepts/a"), counted)
    assert "again" in changed and len(calls) == 3
    assert len(wiki._rendered) == 1  # the old versions of the page are not kept

    # The web page's JSON comes from the kept HTML.
    monkeypatch.setattr("kb.apps.web.wiki_html.render_markdown", counted)
    assert "again" in render_page(wiki.read("concepts/a"), wiki)["html"] and len(calls) == 3

    # Past RENDERED_CHARS, the page shown longest ago goes first.
    monkeypatch.setattr(reader_module, "RENDERED_CHARS", len(changed) + 5)  # a.md's HTML, not b.md's too
    small = WikiReader(tmp_path)
    small.rendered(small.read("concepts/b"), counted)
    small.rendered(small.read("concepts/a"), counted)
    assert len(calls) == 5 and [file.name for file in small._rendered] == ["a.md"]
    small.rendered(small.read("concepts/b"), counted)
    assert len(calls) == 6


@pytest.mark.timeout(60)
def test_a_block_of_many_headings_is_shown_as_text_on_the_web_page():
    """Python-Markdown copies and searches the rest of a block again after
    each heading and rule in it: 64,000 setext headings in one block (256
    KiB) took 17.5 s on each request of the page. A block of more than
    MAX_BLOCK_BREAKS headings and rules shows in a code block. The honest
    forms stay: blocks of up to that many headings, a log of many entries,
    and a long list (a lint report of 2,000 findings)."""
    from kb.apps.web.wiki_html import MAX_BLOCK_BREAKS, render_markdown
    from kb.wiki_files import LinkResolver

    resolve = LinkResolver([], [])
    for unit in ("x\n-\n", "x\n=\n", "# h\nx\n", "x\n***\n", "x\n___\n"):
        html = render_markdown("Intro.\n\n" + unit * 64_000 + "\nAfter.\n", resolve)
        assert html.count("<pre><code>") == 1 and "<h1" not in html and "<h2" not in html and "<hr" not in html, unit
        assert "<p>Intro.</p>" in html and "<p>After.</p>" in html
    html = render_markdown(("x\n-\n" * MAX_BLOCK_BREAKS + "\n") * 3, resolve)
    assert html.count("<h2") == 3 * MAX_BLOCK_BREAKS and "<pre>" not in html
    log = "# Log\n" + "".join(f"\n## [2026-12-07] ingest | Source {i}\n- a line\n- [[index]]\n" for i in range(3_000))
    html = render_markdown(log, resolve)
    assert html.count("<h2") == 3_000 and "<pre>" not in html
    report = "## broken links (2000)\n" + "".join(f"- `wiki/concepts/x.md` line {i}: no page y\n" for i in range(2_000))
    html = render_markdown(report, resolve)
    assert html.count("<li>") == 2_000 and "<pre>" not in html


@pytest.mark.timeout(60)
def test_a_paragraph_of_too_many_characters_is_shown_as_text_on_the_web_page():
    """Python-Markdown reads the rest of a paragraph again after each
    emphasis, code span or bracket: 256 KiB of "_a_ " in one paragraph took
    16.8 s on each request. A paragraph, list item or heading of more than
    MAX_INLINE_CHARS shows in a code block; a paragraph just under it, and
    a long list of short items, keep their markup."""
    from kb.apps.web.wiki_html import MAX_INLINE_CHARS, render_markdown
    from kb.wiki_files import LinkResolver

    resolve = LinkResolver([], [])
    for unit in ("_a_ ", "`a", "*a* ", "[", "[[a]] "):
        for shape in ("{}", "# {}", "- {}", "| {} |"):
            flood = shape.format(unit * (256 * 1024 // len(unit)))
            html = render_markdown(f"Intro.\n\n{flood}\n\nAfter.\n", resolve)
            assert html.count("<pre><code>") == 1 and "<em>" not in html, (unit, shape)
            assert "<p>Intro.</p>" in html and "<p>After.</p>" in html
    under = "_a_ " * ((MAX_INLINE_CHARS - 8) // 4)
    assert render_markdown(f"{under}\n", resolve).count("<em>") == len(under) // 4
    items = "".join(f"- _item_ {i} " + "words " * 20 + "\n" for i in range(2_000))  # 280 KiB
    assert render_markdown(items, resolve).count("<em>") == 2_000
