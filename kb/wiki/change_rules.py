"""What a change may do to the text of the pages: two rules that kb checks
on every agent change before the commit stays (kb/wiki/repo.py). Both use
one relation, `keeps(old, new)`: the line `new` keeps the line `old`.

`new` keeps `old` when a reader reads the same words in both, and `new`
holds each link of `old` to a page that exists. What does not count:
white space, the list mark, the marks `(disputed)` and `(unsupported)` at
the end of the line, a citation that was added, the anchor of a link
(`#para3`), `.md` in a link, and the form of a link to a page that does
not exist (a dangling link may get its right target, or become plain
text, when its words stay). A link to a page that a lint merged into
another (a redirect page) is a link to that other page. So each
instruction of the playbook keeps its lines: the marks, "add its
citation", "fix or remove dangling links", a merge that moves each line
word for word. A changed word, a changed year, an inserted "did not", an
"It is a myth that ..." in front, a citation taken away, a mark in the
middle of the line: each is a lost line.

1. A cited claim is kept. Each line of a page that states something and
   cites a source page must be kept by a line of some page after the
   change (the same page or another: moved, merged). A line in a comment
   (HTML or Obsidian's %%), in a code block or in the frontmatter keeps
   nothing: a reader does not see it there. Nor does a line that Markdown
   joins to new text above it into one paragraph or list item ("- It is a
   myth, spread by a forged source, that" and, on the next line, the
   claim): a reader reads them as one sentence. Lines that were there
   before may stand above it (a merge puts moved lines under the owner's).
2. The owner's sections stay the owner's. On an entity or concept page
   with the marker line, each line above the marker is kept by a line
   above the marker after the change, in the same order, and the marker
   stays. New lines may come between them. In a lint, a page may become a
   redirect page when each line above its marker is kept by a line of
   some page (a merge moves the text, never drops it).

Why every line above the marker, and not only the lines that git blames on
a `manual:` commit: an allowed change of the owner's line (a mark, a
citation) moves its blame to kb's commit, and then the next change could
reword it. The allowed changes above cover every instruction that kb gives
the agent, so the owner's rule needs no history.

No model: the same text gives the same answer every time. The agent
writes from text off the internet; a source can ask it to "correct" a
claim, and a check that reads meanings could be talked round.
"""

from __future__ import annotations

import re

from kb.wiki.schema import AUTO_SECTION_MARKER, CLAIM_MARKS, DISPUTED_MARK, UNSUPPORTED_MARK
from kb.wiki_files import BLOCK_START, FENCE, WIKILINK, blank_comments, split_frontmatter

CITATION = re.compile(r"\[\[(sources/[^\]|#\n]+)")
LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
PROSE = re.compile(r"[A-Za-z\u00C0-\uFFFF]{2,}")
SOURCES_FOLDER = "sources/"


def link_target(inner: str, renames: dict[str, str] | None = None) -> str:
    """The page that a link names: `sources/a#para3|text` -> `sources/a`;
    no `.md`; through `renames` (old target -> new: a migration, a merge)."""
    target = inner.split("|", 1)[0].split("#", 1)[0].strip().removesuffix(".md")
    return (renames or {}).get(target, target)


def claim_key(line: str, renames: dict[str, str] | None = None) -> str:
    """The words that a reader reads in a line, in one form: the citations
    of source pages left out (they are compared as links), each other link
    as the text that it shows (`|text`, else the name of its page, without
    hyphens), no list mark, no mark at the end, single
    spaces. Two lines with the same key say the same thing."""
    def shown(match: re.Match) -> str:
        target = link_target(match.group(1), renames)
        if target.startswith(SOURCES_FOLDER):
            return ""
        _, bar, label = match.group(1).partition("|")
        text = label if bar else target.rsplit("/", 1)[-1].replace("-", " ").replace("_", " ")
        return text.strip()

    text = LIST_MARK.sub("", WIKILINK.sub(shown, line))
    return without_trailing_marks(" ".join(text.split()))


def without_trailing_marks(text: str) -> str:
    """The text without the claim marks (CLAIM_MARKS) at its end. A loop
    from the end: a regex anchored at the end ("(?:\\s*mark)+\\s*$") was
    tried from each mark of a line that does not end in one, and a line of
    64 KiB took 2.9 s in each of three rules of a change (7 December 2026)."""
    text = text.rstrip()
    while True:
        mark = next((m for m in CLAIM_MARKS if text.endswith(m)), None)
        if mark is None:
            return text
        text = text[:-len(mark)].rstrip()


def line_links(line: str, renames: dict[str, str] | None = None) -> set[str]:
    """The pages that the links of a line name."""
    return {link_target(m.group(1), renames) for m in WIKILINK.finditer(line)}


def needed_links(line: str, renames: dict[str, str] | None, live: set[str] | None) -> set[str]:
    """The links that a line which keeps `line` must hold: each link to a
    page in `live` (the pages before the change; None: every link)."""
    return {link_target(m.group(1), renames) for m in WIKILINK.finditer(line)
            if live is None or link_target(m.group(1)) in live}


def keeps(old: str, new: str, renames: dict[str, str] | None = None, live: set[str] | None = None,
          merged: dict[str, str] | None = None) -> bool:
    """True when the line `new` keeps the line `old` (the module's doc).
    `renames`: pages that got a new name (a migration): a link shows the new
    name. `merged`: pages that a lint merged into another: a link to one is
    a link to the other, and shows its own words (kb.wiki.finish)."""
    targets = {**(renames or {}), **(merged or {})}
    return kept_by(claim_key(old, renames), needed_links(old, targets, live), claim_key(new, renames),
                   line_links(new, targets))


def kept_by(old_key: str, old_needed: set[str], new_key: str, new_links: set[str]) -> bool:
    """keeps() on the forms of two lines, for a rule that compares each line
    with many: the forms are made once a line."""
    return old_key == new_key and old_needed <= new_links


def joined_to_new_text(lines: list[str], old_keys: set[str], renames: dict[str, str] | None = None) -> list[bool]:
    """For each line: True when Markdown joins it to text above it in one
    paragraph or list item (no empty line between, and the line starts no
    block of its own), and some of that text is new (its key is not in
    `old_keys`, the keys of the lines before the change). Such a line keeps
    nothing (rule 1 of the module's text)."""
    out, new_above, joinable = [], False, False
    for line in lines:
        stripped = line.strip()
        joined = bool(stripped) and joinable and not BLOCK_START.match(line)
        if not joined:
            new_above = False
        out.append(joined and new_above)
        if stripped:
            new_above = new_above or claim_key(line, renames) not in old_keys
        joinable = bool(stripped) and not stripped.startswith("#")  # a heading is a block of one line
    return out


def old_line_keys(texts, renames: dict[str, str] | None = None) -> set[str]:
    """The keys of the visible lines of pages before a change."""
    return {claim_key(line, renames) for text in texts for line in visible_body(text) if line.strip()}


class KeptLines:
    """The visible lines of pages, by their words: which line keeps a line?
    `old`: the pages before the change; a line joined to new text above it
    keeps nothing (joined_to_new_text)."""

    def __init__(self, texts, renames: dict[str, str] | None = None, merged: dict[str, str] | None = None,
                 old=()) -> None:
        self.renames = renames
        self.targets = {**(renames or {}), **(merged or {})}
        self.links: dict[str, list[set[str]]] = {}
        old_keys = old_line_keys(old, renames)
        for text in texts:
            lines = visible_body(text)
            for line, joined in zip(lines, joined_to_new_text(lines, old_keys, renames)):
                if line.strip() and not joined:
                    self.links.setdefault(claim_key(line, renames), []).append(line_links(line, self.targets))

    def keep(self, old: str, live: set[str] | None = None) -> bool:
        needed = needed_links(old, self.targets, live)
        return any(needed <= links for links in self.links.get(claim_key(old, self.renames), []))


def visible_body(text: str) -> list[str]:
    """The body lines that a reader sees: no frontmatter; each HTML comment
    and each code block blanked (line for line, so numbers stay)."""
    body = split_frontmatter(text).body
    blanked = blank_comments("\n".join(body)).split("\n")
    out, in_fence = [], False
    for line in blanked:
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            out.append("")
            continue
        out.append("" if in_fence else line)
    return out


def cited_claims(text: str) -> list[str]:
    """The lines of a page that state something and cite a source page, as
    written (stripped). Headings do not count."""
    claims = []
    for line in visible_body(text):
        stripped = line.strip()
        if (stripped.startswith("#") or not CITATION.search(stripped)
                or not PROSE.search(WIKILINK.sub("", stripped))):
            continue
        claims.append(stripped)
    return claims


def lost_cited_claims(before: dict[str, str], after: dict[str, str],
                      renames: dict[str, str] | None = None, live: set[str] | None = None,
                      merged: dict[str, str] | None = None, kept: KeptLines | None = None) -> list[dict]:
    """Cited claims of the pages in `before` that no page in `after` keeps.

    `before`: path -> text of each page that the change touched, as it was.
    `after`: path -> text of every page after the change.
    `renames`: old link target -> new one (a migration).
    `merged`: a merged page -> the page that holds its lines now (a lint).
    `live`: the link targets of the pages before the change (None: every
    link counts as live). `kept`: KeptLines of `after` (with `before` as
    its old pages), when the caller has made it already."""
    kept = kept or KeptLines(after.values(), renames, merged, old=before.values())
    lost = []
    for path, text in before.items():
        for claim in cited_claims(text):
            if not kept.keep(claim, live):
                lost.append({"page": path, "claim": " ".join(LIST_MARK.sub("", claim).split())[:200]})
    return lost


def owner_lines(text: str) -> list[str] | None:
    """The body lines above the marker, the marker line last; None when the
    page has no marker (then it has no owner's section)."""
    body = split_frontmatter(text).body
    for at, line in enumerate(body):
        if line.strip() == AUTO_SECTION_MARKER:
            return body[:at + 1]
    return None


OWNER_RULE = (f"the lines above {AUTO_SECTION_MARKER} are the owner's; a change may add a line there (as a list "
              f"item, or after an empty line: not joined above an owner's line), and add a citation or the mark "
              f"{DISPUTED_MARK} or {UNSUPPORTED_MARK} at the end of a line; never change, move or delete one")


def owner_section_problem(path: str, before: str, after: str | None, *, may_merge: bool = False,
                          kept: KeptLines | None = None, merged: dict[str, str] | None = None,
                          live: set[str] | None = None) -> str | None:
    """Why the change of the page at `path` breaks its owner's section, or
    None. `after` is None when the change deleted the page. With
    `may_merge` (a lint), a page may become a redirect page or go, when
    each line of its owner's section is kept by a line in `kept` (the
    pages after the change): a merge moves the text, never drops it."""
    old = owner_lines(before)
    if old is None:
        return None
    rule = f"{path}: {OWNER_RULE}"
    gone = after is None or bool((split_frontmatter(after).data or {}).get("redirect"))
    if gone and may_merge:
        moved = [line.strip() for line in old if line.strip() and not line.strip().startswith("#")
                 and line.strip() != AUTO_SECTION_MARKER]
        missing = [line for line in moved if kept is None or not kept.keep(line, live)]
        return f"{rule} (the merge lost the line {missing[0][:120]!r})" if missing else None
    if after is None:
        return f"{rule} (the page was deleted)"
    new = owner_lines(after)
    if new is None:
        return f"{rule} (the marker line is gone)"
    # Each old line, in order, must be kept by a new line (new ones may come
    # between, but not joined above it: joined_to_new_text).
    joined = joined_to_new_text(new, {claim_key(line) for line in old if line.strip()})
    # The forms of each line once: keeps() in the loop made the old line's
    # again for each new line, and 8,000 new lines under a line of 32 KiB
    # took 13.5 s (7 December 2026).
    targets = dict(merged or {})
    new_forms = [(claim_key(line), line_links(line, targets)) for line in new]
    at = 0
    for line in old:
        if not line.strip():
            continue
        old_key, old_needed = claim_key(line), needed_links(line, targets, live)
        while at < len(new) and (joined[at] or not kept_by(old_key, old_needed, *new_forms[at])):
            at += 1
        if at == len(new):
            return f"{rule} (the line {line.strip()[:120]!r} was changed or removed)"
        at += 1
    return None


def redirects(pages: dict[str, str]) -> dict[str, str]:
    """Link target -> the target that it redirects to, for each entity and
    concept page (path under the wiki root -> text) with `redirect` in its
    frontmatter: what is left of a page that a lint merged into another. A
    chain (a -> b -> c) goes to its end; a loop is left out."""
    found = {}
    for path, text in pages.items():
        target = path.removeprefix("wiki/").removesuffix(".md")
        if not target.startswith(("entities/", "concepts/")):
            continue
        value = (split_frontmatter(text).data or {}).get("redirect")
        if isinstance(value, str) and value.strip():
            found[target] = link_target(value.strip().removeprefix("[[").removesuffix("]]")).removeprefix("wiki/")
    ends = {}
    for start in found:
        seen, at = {start}, found[start]
        while at in found and at not in seen:
            seen.add(at)
            at = found[at]
        if at not in seen:
            ends[start] = at
    return ends
