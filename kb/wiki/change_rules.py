"""What a change may do to the text of the pages: two rules that kb checks
on every agent change before the commit stays (kb/wiki/repo.py).

1. A cited claim keeps its words. Each line of a page that states
   something and cites a source page must still be a line of some page
   after the change, word for word. Only these differences do not count:
   white space, the list mark, the form of a link (`|text`, `.md`), and
   the mark `(disputed)`. A changed word, a changed year, an inserted "did
   not" or an "It is a myth that ..." in front: each is a lost claim.
   A claim in an HTML comment, in a code block or in the frontmatter is
   not kept: a reader does not see it there.
2. The owner's sections stay the owner's. On an entity or concept page
   with the marker line, the lines above the marker stay as they were,
   in their order, and the marker stays. New lines above the marker are
   allowed (the schema keeps the cited facts there), and so is the mark
   `(disputed)` at the end of a line (the playbook's way to record a
   contradiction).

No model: the same text gives the same answer every time. The agent
writes from text off the internet; a source can ask it to "correct" a
claim, and a check that reads meanings could be talked round.
"""

from __future__ import annotations

import re

from kb.wiki.schema import AUTO_SECTION_MARKER, DISPUTED_MARK
from kb.wiki_files import FENCE, WIKILINK, blank_comments, split_frontmatter

CITATION = re.compile(r"\[\[(sources/[^\]|#\n]+)")
LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
PROSE = re.compile(r"[A-Za-z\u00C0-\uFFFF]{2,}")


def _link_key(match: re.Match, renames: dict[str, str]) -> str:
    """One form for each link: `[[target#anchor]]`, no `|text`, no `.md`,
    the target through `renames` (old target -> new, for a migration)."""
    target, _, anchor = match.group(1).split("|", 1)[0].partition("#")
    target = target.strip().removesuffix(".md")
    target = renames.get(target, target)
    return f"[[{target}#{anchor.strip()}]]" if anchor.strip() else f"[[{target}]]"


def claim_key(line: str, renames: dict[str, str] | None = None) -> str:
    """The form in which two lines hold the same claim."""
    text = WIKILINK.sub(lambda m: _link_key(m, renames or {}), line)
    text = LIST_MARK.sub("", text).replace(DISPUTED_MARK, " ")
    return " ".join(text.split())


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
                      renames: dict[str, str] | None = None) -> list[dict]:
    """Cited claims of the pages in `before` that no page in `after` keeps.

    `before`: path -> text of each page that the change touched, as it was.
    `after`: path -> text of every page after the change.
    `renames`: old link target -> new one, when the change renames pages.
    A claim is kept when a cited line of a page after the change has the
    same claim_key: the same page or another (moved, merged), or marked
    (disputed)."""
    kept = {claim_key(claim) for text in after.values() for claim in cited_claims(text)}
    lost = []
    for path, text in before.items():
        for claim in cited_claims(text):
            if claim_key(claim, renames) not in kept:
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


def _same_owner_line(old: str, new: str) -> bool:
    if old.rstrip() == new.rstrip():
        return True
    # The one change that the playbook asks for on a claim: the mark at its end.
    return new.rstrip().endswith(DISPUTED_MARK) and new.rstrip()[:-len(DISPUTED_MARK)].rstrip() == old.rstrip()


def owner_section_problem(path: str, before: str, after: str | None, *, may_merge: bool = False,
                          lines_after: set[str] = frozenset()) -> str | None:
    """Why the change of the page at `path` breaks its owner's section, or
    None. `after` is None when the change deleted the page. With
    `may_merge` (a lint), a page may become a redirect page or go, when
    each line of its owner's section is on a page after the change
    (`lines_after`, stripped lines): a merge moves the text, never drops it."""
    old = owner_lines(before)
    if old is None:
        return None
    rule = (f"{path}: the lines above {AUTO_SECTION_MARKER} are the owner's; a change may add a line there, "
            f"never change, move or delete one")
    merged = after is None or bool((split_frontmatter(after).data or {}).get("redirect"))
    if merged and may_merge:
        moved = [line.strip() for line in old if line.strip() and not line.strip().startswith("#")
                 and line.strip() != AUTO_SECTION_MARKER]
        missing = [line for line in moved if line not in lines_after
                   and line + " " + DISPUTED_MARK not in lines_after]
        return f"{rule} (the merge lost the line {missing[0][:120]!r})" if missing else None
    if after is None:
        return f"{rule} (the page was deleted)"
    new = owner_lines(after)
    if new is None:
        return f"{rule} (the marker line is gone)"
    # Each old line, in order, must be in the new lines (new ones may come between).
    at = 0
    for line in old:
        if not line.strip():
            continue
        while at < len(new) and not _same_owner_line(line, new[at]):
            at += 1
        if at == len(new):
            return f"{rule} (the line {line.strip()[:120]!r} was changed or removed)"
        at += 1
    return None
