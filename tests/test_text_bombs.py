"""Hostile text whose cost grew faster than its length (the red team, 7
December 2026). Each input here is one that the old rule would read for
minutes or hours (it then fails by the suite's timeout); the rules read it
in milliseconds and give the same answers as before on honest text."""

from __future__ import annotations

import re

import pytest


@pytest.mark.timeout(60)
def test_a_heading_with_a_long_run_of_spaces_is_read_in_one_pass():
    """first_heading's lazy group tried each split of a run of spaces: a
    line of 2,000 spaces took 13 s (a text page or a Markdown file of a
    stranger reaches it). 20,000 spaces would take hours."""
    from kb.telegram.source_parsers import first_heading

    assert first_heading("# x" + " " * 20_000 + "y") == "x" + " " * 20_000 + "y"
    assert first_heading("intro\n# Title ##\n# Second") == "Title"
    assert first_heading("#  C# tips  #") == "C# tips"
    assert first_heading("# ##\n# Next") == "Next"
    assert first_heading("#hashtag\nno heading") is None


@pytest.mark.timeout(60)
def test_wiki_links_and_comments_of_a_hostile_page_are_found_in_one_pass():
    """A wiki page may quote a stranger's text (256 KiB a change). A line
    of 40,000 "[" took 16 s to read for links, and 10,000 "<!--" that never
    close took 2.3 s, on each request of kb web or MCP. A line of 400,000
    "[" and 250,000 "<!--" would take half an hour each."""
    from kb.wiki_files import WIKILINK, blank_comments, without_comments

    assert list(WIKILINK.finditer("[" * 400_000 + "]")) == []
    line = "[[[[concepts/real|Real]] and [[a[b]] ![[x]]"
    assert [m.group(1) for m in WIKILINK.finditer(line)] == ["concepts/real|Real", "x"]
    unclosed = "<!--" * 250_000
    assert without_comments(unclosed + "text") == unclosed + "text"
    # Honest text: the comments of the rule before (a regex; quadratic on
    # the hostile text above, right on these).
    before = re.compile(r"<!--.*?-->|%%.*?%%", re.DOTALL)
    for page in ("a <!-- hidden --> b %% also\nhidden %% c <!-- open\n%% d", "%% <!-- %% -->", "%%%%x<!---->%%",
                 "<!-- a %% b --> %% c", "no comment"):
        assert without_comments(page) == before.sub("", page), page
        assert blank_comments(page) == before.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), page), page


@pytest.mark.timeout(60)
def test_urls_of_a_dropped_text_file_are_found_in_one_pass():
    """A text file dropped in the inbox is read for URLs: a count of the
    brackets for each trimmed ")" and a list look-up for each URL were
    quadratic (80,000 ")" took 3.3 s; 20,000 URLs 2.3 s)."""
    from kb.telegram.intake import extract_urls, trim_url

    assert trim_url("https://a.example/x" + ")" * 1_000_000) == "https://a.example/x"
    assert trim_url("https://en.wikipedia.org/wiki/Set_(mathematics))") == "https://en.wikipedia.org/wiki/Set_(mathematics)"
    assert trim_url("https://a.example/(x)).,") == "https://a.example/(x)"
    urls = [f"https://a.example/{n}" for n in range(200_000)]
    assert extract_urls(" ".join(urls + urls[:10])) == urls


@pytest.mark.timeout(60)
def test_t_co_addresses_of_a_post_are_expanded_in_one_pass():
    """An expanded address that holds the t.co address of a later entity
    multiplied the text at each replacement: five entities of 2.8 kB made
    76 MB, six would make 1.5 GB (a crafted file through kb import)."""
    from kb.x.post_rows import read_post

    tco = [f"https://t.co/a{n:08d}" for n in range(7)]
    urls = [{"url": tco[n], "expanded_url": "https://e.org/?" + " ".join([tco[n + 1]] * 20)} for n in range(6)]
    post = read_post({"rest_id": "1", "legacy": {"full_text": f"look {tco[0]} and {tco[1]}", "id_str": "1",
                                                  "entities": {"urls": urls}},
                      "core": {"user_results": {"result": {"rest_id": "9", "core": {"screen_name": "s"}}}}})
    assert post.text == f"look {urls[0]['expanded_url']} and {urls[1]['expanded_url']}"
