"""Wiki pages as safe HTML, with working wikilinks.

The wiki agent writes pages from text that came from the internet, so a page
is untrusted input. The renderer allows no raw HTML (it shows as text), no
attributes outside a short list, and no link or image address with a scheme
other than http, https or mailto. The page's Content-Security-Policy is a
second guard, not the only one.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as etree
from urllib.parse import quote

import markdown
from markdown.extensions.toc import slugify
from markdown.inlinepatterns import InlineProcessor
from markdown.treeprocessors import Treeprocessor

from kb.apps.web.reader import WikiPage, WikiReader
from kb.wiki_files import BLOCK_START, FENCE, WIKILINK, LinkResolver, parse_link, without_comments

# Not "extra": its attr_list lets a page set any attribute ({: onclick=...})
# and its md_in_html lets raw HTML back in.
EXTENSIONS = ["tables", "fenced_code", "sane_lists", "toc"]
SAFE_SCHEMES = ("http", "https", "mailto")
ALLOWED_ATTRIBUTES = {"href", "src", "alt", "title", "id", "class", "align", "start", "colspan", "rowspan"}
CONTROL = re.compile(r"[\x00-\x20\x7f]+")


def wiki_href(path: str, anchor: str = "") -> str:
    """The page's own address of a wiki page: a fragment, so following a
    wikilink needs no full reload."""
    href = "#wiki=" + quote(path, safe="/")
    return href + ("&anchor=" + quote(anchor, safe="") if anchor else "")


def safe_url(url: str) -> str | None:
    """The address when it is safe in an href or src, else None. Entities
    and control characters are removed first: a browser reads
    `&#106;avascript:` and `java\\tscript:` as `javascript:`."""
    cleaned = CONTROL.sub("", html.unescape(url or ""))
    if not cleaned:
        return None
    head = re.split(r"[/?#]", cleaned, maxsplit=1)[0]
    if ":" in head and head.split(":", 1)[0].lower() not in SAFE_SCHEMES:
        return None
    return cleaned


def anchor_id(value: str, separator: str) -> str:
    """Heading ids get a prefix, so a heading such as "## Results" cannot
    take the id of an element of the page around it. `### para3` becomes
    `w-para3`: the target of `[[sources/slug#para3]]`."""
    return "w-" + slugify(value, separator)


class _WikiLinks(InlineProcessor):
    def __init__(self, resolve, md: markdown.Markdown):
        super().__init__(WIKILINK.pattern, md)
        self.resolve = resolve

    def handleMatch(self, m, data):  # noqa: N802 - the name comes from markdown
        inner = m.group(1)
        link = parse_link(inner)  # the one rule of kb: kb.wiki_files
        shown = link.text or link.target.rsplit("/", 1)[-1] or inner.strip()
        if link.anchor and not link.text:
            shown = f"{shown} §{link.anchor}"
        resolved = self.resolve(link)
        if resolved is None:
            element = etree.Element("span")
            element.set("class", "wikilink missing")
            element.set("title", f"no page {link.target}")
        else:
            element = etree.Element("a")
            element.set("class", "wikilink")
            element.set("href", wiki_href(resolved, link.anchor))
        element.text = shown
        return element, m.start(0), m.end(0)


class _Sanitizer(Treeprocessor):
    def run(self, root):
        for element in root.iter():
            for name in list(element.attrib):
                if name not in ALLOWED_ATTRIBUTES:
                    del element.attrib[name]
            for name in ("href", "src"):
                if name in element.attrib:
                    if element.attrib[name].startswith("#wiki="):
                        continue
                    url = safe_url(element.attrib[name])
                    if url is None:
                        del element.attrib[name]
                    else:
                        element.set(name, url)
            if element.tag == "a" and element.get("href", "").startswith(("http:", "https:")):
                element.set("class", "external")


# The inline links ([text](url)) of one paragraph or list item, and of one
# page, that the page renders as links. Python-Markdown 3.11 reads the
# brackets again after each link of a paragraph: 300 links took 0.6 s,
# 1,200 took 7 s on each request of the page (the red team, 7 December
# 2026). A block with more is shown as it is written, in a code block (read
# once); a page with more, whole. The cost is then at most about 0.7 s a
# page (40 blocks of 50). Wiki links ([[page]]) do not count: kb reads them
# in one pass.
MAX_INLINE_LINKS = 50
MAX_PAGE_INLINE_LINKS = 2_000
# The characters of one paragraph or list item. Python-Markdown reads the
# rest of the text again after each emphasis, code span or bracket in it:
# 256 KiB of "_a_ " in one paragraph took 16.8 s on each request, in
# paragraphs of 16 KiB 2.5 s (7 December 2026). A longer one is shown as
# the link floods are. 16 KiB is about 2,500 words, more than a wiki page
# holds in one paragraph.
MAX_INLINE_CHARS = 16 * 1024
# The headings and rules in one block (the lines between two empty lines).
# Python-Markdown copies and searches the rest of the block again after each
# of them: 64,000 setext headings in one block (256 KiB, the most that one
# change of the agent adds) took 17.5 s on each request of the page; the
# same headings in blocks of 100 take about 4 s, a cost that grows with the
# page, as for an honest page of that size (7 December 2026). A block with
# more is shown in a code block, as the link floods above. Lists, tables
# and paragraphs cost the same in one block or in many, so only these
# lines count: the wiki's own pages have one heading a block.
MAX_BLOCK_BREAKS = 100
BREAK_LINE = re.compile(r"#|[ ]{0,3}[-=*_][-=*_ ]*$")  # ATX heading; setext underline or rule


def _as_code(lines: list[str]) -> list[str]:
    """The lines in a fenced code block: a fence longer than any run of "~" in them."""
    fence = "~" * (max((len(run) for line in lines for run in re.findall("~+", line)), default=0) + 3)
    return [fence, *lines, fence]


def _inline_floods_as_code(lines: list[str]) -> list[str]:
    """The lines of a run with each block of it (a paragraph, a list item:
    BLOCK_START) of more than MAX_INLINE_LINKS inline links or more than
    MAX_INLINE_CHARS characters in a code block."""
    out, block = [], []

    def close() -> None:
        costly = (sum(line.count("](") for line in block) > MAX_INLINE_LINKS
                  or sum(len(line) + 1 for line in block) > MAX_INLINE_CHARS)
        out.extend(_as_code(block) if costly else block)
        block.clear()

    for line in lines:
        if BLOCK_START.match(line):
            close()
        block.append(line)
    close()
    return out


def _costly_blocks_as_code(text: str) -> str:
    """The text with each run of lines between empty lines (Python-Markdown's
    block) of more than MAX_BLOCK_BREAKS headings and rules in a fenced
    code block, and the inline floods of the other runs too; all of it when
    it has more than MAX_PAGE_INLINE_LINKS inline links. Fenced code stays
    as it is."""
    if text.count("](") > MAX_PAGE_INLINE_LINKS:
        return "\n".join(_as_code([text]))
    out, run, fenced = [], [], False

    def close() -> None:
        costly = sum(1 for line in run if BREAK_LINE.match(line)) > MAX_BLOCK_BREAKS
        out.extend(_as_code(run) if costly else _inline_floods_as_code(run))
        run.clear()

    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            close()
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        elif not line.strip():
            close()
            out.append(line)
        else:
            run.append(line)
    close()
    return "\n".join(out)


def render_markdown(text: str, resolve: LinkResolver) -> str:
    """The page's Markdown as safe HTML; `resolve` gives the page that a wikilink names."""
    md = markdown.Markdown(extensions=EXTENSIONS, output_format="html",
                           extension_configs={"toc": {"slugify": anchor_id}})
    # Raw HTML is shown as text, never passed through.
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    # Before the [text](url) patterns (priority 160), so [[a]] is one link.
    md.inlinePatterns.register(_WikiLinks(resolve, md), "wikilink", 175)
    md.treeprocessors.register(_Sanitizer(md), "sanitize", 0)
    # A fenced code block's {#id .class} goes into the output as raw HTML,
    # past the sanitizer: ```{#w-para3} took the anchor of a citation. Its
    # language (```python) stays; its attributes go.
    md.preprocessors["fenced_code_block"].handle_attrs = lambda attrs: ("", [], {})
    # A reader does not see an HTML comment (the marker line is one), and
    # the links in it are no links: kb.wiki_files.read_page reads so too.
    return md.convert(_costly_blocks_as_code(without_comments(text)))


def render_page(page: WikiPage, reader: WikiReader) -> dict:
    """The page as JSON for the web page: the body as safe HTML, the
    frontmatter as plain values that the page shows as text."""
    return {"path": page.path, "title": page.title, "type": page.type,
            "date": page.date.isoformat() if page.date else None,
            "frontmatter": page.frontmatter, "html": reader.rendered(page, render_markdown)}
