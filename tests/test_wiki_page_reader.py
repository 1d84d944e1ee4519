"""One reader of a wiki page (kb.wiki_files.read_page): the web page, the MCP
server, the search index and the checks read the same title, type, date and
links from the same tricky pages. They once had four rules, and they
disagreed."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kb.apps.web.reader import WikiReader
from kb.apps.web.wiki_html import render_page
from kb.settings import get_settings
from kb.wiki.checks import check_wiki
from kb.wiki_files import LinkResolver, parse_link, read_page
from kb_assets.index.wiki_index import page_rows
from mcp_server.server import read_wiki_page

TRICKY = """\
---
type: concept
created: 2026-11-01
last_updated: "2026-11-20"
aliases: [Tricky]
sources: [0193f7a8-notes]
---
<!-- # A title in a comment -->
```
# A title in a code block
[[concepts/in-code]]
```
# The Tricky Page

## Definition
A page with links of every form. [[sources/0193f7a8-notes|the notes]] [[sources/0193f7a8-notes#para2]]
See [[concepts/other.md]], [[wiki/concepts/other]], [[other]] and [[concepts/missing-page|gone]].
The [[index]] lists it. <!-- [[concepts/in-comment]] -->
"""
# The specification's source page: no `type` key. This one has no `# ` heading:
# its title comes from the `title` key. YAML reads its time as a datetime.
SOURCE = """\
---
resource_id: 0193f7a8-1111-2222-3333-444455556666
resource_type: web
title: "Notes on the engine"
ingested_at: 2026-11-21T08:30:00+01:00
---
## TL;DR
Notes. [[concepts/tricky-page]]
"""
# No title key and no heading: the title is the `name`. A YAML date.
ENTITY = """\
---
type: entity
name: Ada Lovelace
created: 2026-11-02
last_updated: 2026-11-22
---
She wrote the first program. [[sources/0193f7a8-notes]]
"""
# No frontmatter at all: the file name, the folder's type, no date.
BARE = "A page with nothing. [[concepts/tricky-page#Definition|back]]\n"

PAGES = {
    "concepts/tricky-page": (TRICKY, "The Tricky Page", "concept", datetime(2026, 11, 20, tzinfo=timezone.utc),
                             ["sources/0193f7a8-notes", "concepts/other", "other", "concepts/missing-page", "index"]),
    "sources/0193f7a8-notes": (SOURCE, "Notes on the engine", "source",
                               datetime(2026, 11, 21, 7, 30, tzinfo=timezone.utc), ["concepts/tricky-page"]),
    "entities/Ada-Lovelace": (ENTITY, "Ada Lovelace", "entity", datetime(2026, 11, 22, tzinfo=timezone.utc),
                              ["sources/0193f7a8-notes"]),
    "concepts/other": (BARE, "other", "concept", None, ["concepts/tricky-page"]),
}


@pytest.fixture
def wiki(kb_home) -> Path:
    root = get_settings().wiki_dir
    for target, (text, *_) in PAGES.items():
        file = root / "wiki" / f"{target}.md"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    (root / "index.md").write_text("# Index\n\n" + "".join(f"- [[{t}]]\n" for t in PAGES))
    return root


@pytest.mark.parametrize("target", list(PAGES))
def test_the_web_page_the_mcp_server_and_the_index_read_one_title_type_date_and_links(wiki, target):
    _, title, kind, date, links = PAGES[target]
    file = wiki / "wiki" / f"{target}.md"
    web = WikiReader(wiki).read(target)
    shown = render_page(web, WikiReader(wiki))
    mcp = read_wiki_page(path=f"wiki/{target}.md")
    rows = page_rows(wiki, file)

    assert web.title == shown["title"] == mcp["title"] == title
    assert web.type == shown["type"] == mcp["type"] == kind
    iso = date.isoformat() if date else None
    assert web.date == date and shown["date"] == mcp["date"] == iso
    # The index dates the passages with the page's date; a page without one gets its file's time.
    expected_row_date = date or datetime.fromtimestamp(file.stat().st_mtime, tz=timezone.utc)
    assert rows and {row["created_at"] for row in rows} == {expected_row_date}
    assert mcp["links"] == links


def test_the_checks_and_the_web_page_resolve_the_same_links(wiki):
    findings = check_wiki(wiki, embed=lambda texts: __import__("numpy").eye(len(texts), 8))
    dangling = {(f["page"], f["link"]) for f in findings["dangling_links"]}
    # Not the links in the code block or the comment; every other form names a page.
    assert dangling == {("wiki/concepts/tricky-page.md", "concepts/missing-page|gone")}
    reader = WikiReader(wiki)
    for target in PAGES:
        html = render_page(reader.read(target), reader)["html"]
        missing = re.findall(r'class="wikilink missing" title="no page ([^"]+)"', html)
        assert {(f"wiki/{target}.md", m) for m in missing} == {
            (page, link.split("|")[0]) for page, link in dangling if page == f"wiki/{target}.md"}
    tricky = render_page(reader.read("concepts/tricky-page"), reader)["html"]
    assert "in-comment" not in tricky and 'href="#wiki=concepts/other"' in tricky and 'href="#wiki=index"' in tricky
    # The words of a comment are not the page's words for the web's search either.
    assert reader.search("comment") == [] and "concepts/tricky-page" in [h["path"] for h in reader.search("tricky")]
    # The page that four link forms name has an inbound link: no orphan.
    assert "wiki/concepts/other.md" not in {f["page"] for f in findings["orphans"]}


def test_a_link_has_one_reading():
    link = parse_link(" wiki/sources/a.md #para3 | the book ")
    assert (link.target, link.anchor, link.text) == ("sources/a", "para3", "the book")
    resolve = LinkResolver(["sources/a", "concepts/x", "entities/x"], ["index"])
    assert [resolve(t) for t in ("sources/a.md", "wiki/sources/a", "a", "x", "index", "sources/b", "")] == [
        "sources/a", "sources/a", "sources/a", None, "index", None, None]


def test_the_date_is_the_schemas_key_first():
    """The schema writes `last_updated` and `ingested_at`; kb's earlier keys
    count only when the schema's key is not there."""
    def date_of(meta: str):
        return read_page(f"---\n{meta}\n---\n# T\n", "concepts/t").date
    assert date_of("created: 2026-01-01\nlast_updated: 2026-02-02\nupdated: 2025-12-31") == datetime(
        2026, 2, 2, tzinfo=timezone.utc)
    assert date_of("ingested_at: '2026-03-03T10:00:00Z'") == datetime(2026, 3, 3, 10, tzinfo=timezone.utc)
    assert date_of("updated: 2025-12-31\ncreated: 2025-01-01") == datetime(2025, 12, 31, tzinfo=timezone.utc)
    assert date_of("last_updated: soon\ncreated: 2026-04-04") == datetime(2026, 4, 4, tzinfo=timezone.utc)
    assert date_of("title: none") is None


def test_the_weekly_finish_reads_links_by_the_same_rule(tmp_path):
    """kb's part of a weekly synthesis lists each source once, whatever the
    form of its link, and links back only from pages that a reader sees linked."""
    from kb.wiki.finish import finish_weekly
    from tests.wiki_pages import weekly_page

    root = tmp_path / "w"
    for target in ("sources/0193f7a8-notes", "sources/1b2c3d4e-more", "concepts/engine", "concepts/hidden"):
        (root / "wiki" / f"{target}.md").parent.mkdir(parents=True, exist_ok=True)
        (root / "wiki" / f"{target}.md").write_text(f"# {target}\n")
    (root / "index.md").write_text("# Index\n")
    page = weekly_page("2026-W48", ["0193f7a8-notes", "1b2c3d4e-more"], "Engines",
                       ["The [[concepts/engine.md|engine]] again. [[sources/0193f7a8-notes#para1]]",
                        "<!-- [[concepts/hidden]] -->"],
                       reading=["- [[wiki/sources/0193f7a8-notes.md]]: the notes."])
    weekly = root / "wiki/syntheses/weekly/2026-W48.md"
    weekly.parent.mkdir(parents=True)
    weekly.write_text(page)
    assert finish_weekly(root, "2026-W48", ["0193f7a8-notes", "1b2c3d4e-more"]) == []
    text = weekly.read_text()
    # The notes are listed (as wiki/sources/...md): no second line; the other source gets its line.
    assert "- [[sources/0193f7a8-notes]]" not in text and "- [[sources/1b2c3d4e-more]]" in text
    assert "[[syntheses/weekly/2026-W48]]" in (root / "wiki/concepts/engine.md").read_text()
    assert "syntheses" not in (root / "wiki/concepts/hidden.md").read_text()
