"""Deterministic checks of a wiki folder: no LLM, only the files.

`check_wiki(path)` returns one list per kind of finding. The same findings
are Dagster asset checks on `wiki_pages`, the input of the daily lint agent,
and the output of `kb wiki check [PATH] [--json]`.

The rules come from the playbook (kb/wiki/playbook.py): pages live
in wiki/, links name a page by its path under wiki/ without `.md`, a link may
carry `#section` and `|text`, and every fact on an entity, concept or topic
page cites a source page.
"""


import re
from dataclasses import dataclass, field
from pathlib import Path

from kb.wiki.coherence import (Claim, Embed, PageFacts, SourcePassages, contradiction_candidates, duplicate_pages,
                                local_embed, plain_text, unsupported_claims)
from kb.wiki_files import split_frontmatter, wiki_page_files


FINDING_KINDS = ("dangling_links", "orphans", "stubs", "index_mismatch", "frontmatter", "uncited",
                 "open_contradictions", "duplicates", "contradiction_candidates", "unsupported")
STUB_MIN_BODY_LINES = 10
WIKILINK = re.compile(r"!?\[\[([^\]\n]+?)\]\]")
FENCE = re.compile(r"^(```|~~~)")
TABLE_RULE = re.compile(r"^\|?[\s:|-]+\|?$")

# folder under wiki/ -> (type, required frontmatter keys)
SCHEMAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sources": ("source", ("title", "source_id", "source_type", "raw", "ingested")),
    "entities": ("entity", ("name", "kind", "sources", "updated")),
    "concepts": ("concept", ("name", "sources", "updated")),
    "syntheses": ("synthesis", ("kind", "period", "created")),
}
ENTITY_KINDS = {"person", "organization", "product", "place", "work", "other"}
SYNTHESIS_KINDS = {"weekly": "weekly", "lint": "lint", "topics": "topic"}
# Sections that list links, not claims: their lines need no citation.
LINK_SECTIONS = {"related", "see also", "mentions", "aliases", "links", "mentioned in syntheses", "reading list"}


@dataclass
class Page:
    rel: str  # path relative to the wiki root: wiki/entities/Ada Lovelace.md
    target: str  # how links name it: entities/Ada Lovelace
    folder: str  # entities, concepts, sources, syntheses, or "" (wiki/ itself)
    subfolder: str  # for syntheses: weekly, lint, topics
    frontmatter: dict | None
    frontmatter_error: str | None
    body: list[str] = field(default_factory=list)
    body_start: int = 1  # line number of the first body line


def check_wiki(path: str | Path, embed: Embed | None = None) -> dict[str, list[dict]]:
    """All findings for the wiki folder at `path`: one list per kind.
    `embed` turns texts into unit vectors; by default the local model
    (kb.wiki.coherence.local_embed), loaded only when a check needs it."""
    root = Path(path).expanduser().resolve()
    if not (root / "wiki").is_dir():
        raise FileNotFoundError(f"{root} is not a wiki folder: it has no wiki/ subfolder")
    pages = _load_pages(root)
    by_target = {p.target: p for p in pages}
    stems: dict[str, list[str]] = {}
    for page in pages:
        stems.setdefault(page.target.rsplit("/", 1)[-1], []).append(page.target)

    def resolve(link: str) -> str | None:
        """The page target that a link names, `root:<file>` for files outside
        wiki/ (index.md, purpose.md), or None when nothing matches."""
        target = link.split("|", 1)[0].split("#", 1)[0].strip()
        if target.endswith(".md"):
            target = target[:-3]
        if not target:
            return None
        if target in by_target:
            return target
        if target.startswith("wiki/") and target[5:] in by_target:
            return target[5:]
        for candidate in (root / "wiki" / target, root / target):
            if candidate.with_name(candidate.name + ".md").is_file() or (candidate.suffix and candidate.is_file()):
                return f"root:{candidate.relative_to(root)}"
        # Obsidian resolves a bare name when one page has it; so does the check.
        if "/" not in target and len(stems.get(target, [])) == 1:
            return stems[target][0]
        return None

    findings: dict[str, list[dict]] = {kind: [] for kind in FINDING_KINDS}
    inbound: dict[str, set[str]] = {p.target: set() for p in pages}
    for page in pages:
        for line_no, link in _links(page):
            resolved = resolve(link)
            if resolved is None:
                findings["dangling_links"].append({"page": page.rel, "line": line_no, "link": link})
            elif resolved in inbound and resolved != page.target:
                inbound[resolved].add(page.target)
        findings["frontmatter"] += _frontmatter_problems(page)
        findings["open_contradictions"] += _open_contradictions(page)
        if (redirect := _redirect(page)) is not None:
            resolved = resolve(redirect)
            if resolved is None or not resolved.startswith(("entities/", "concepts/")) or resolved == page.target:
                findings["frontmatter"].append({"page": page.rel, "problem": f"redirect {redirect!r} names no "
                                                "other entity or concept page"})
            continue  # a merged page: its one line names the page that holds its content
        findings["uncited"] += _uncited_lines(page)
        if page.folder in ("entities", "concepts", "sources"):
            body_lines = sum(1 for line in page.body if line.strip())
            if body_lines < STUB_MIN_BODY_LINES:
                findings["stubs"].append({"page": page.rel, "body_lines": body_lines})
    for page in pages:
        if page.folder in ("entities", "concepts", "sources") and not inbound[page.target] and not _redirect(page):
            findings["orphans"].append({"page": page.rel})
    findings["index_mismatch"] = _index_mismatch(root, pages, resolve)
    _coherence(findings, root, pages, resolve, embed or (lambda texts: local_embed()(texts)))
    return findings


def _coherence(findings: dict, root: Path, pages: list[Page], resolve, embed: Embed) -> None:
    """Duplicates, contradictions between pages, claims that their sources
    do not hold (kb.wiki.coherence)."""
    facts = [_page_facts(page, resolve) for page in pages
             if page.folder in ("entities", "concepts") or page.subfolder == "topics"]
    findings["duplicates"] = duplicate_pages([f for f in facts if f.kind in ("entity", "concept")], embed)
    claims = [claim for f in facts for claim in f.claims]
    known = [plain_text(line) for page in pages for _, line, section in _body_lines(page)
             if section == CONTRADICTIONS_SECTION and line.strip() and not line.strip().startswith("#")]
    findings["contradiction_candidates"] = contradiction_candidates(
        [c for c in claims if not c.page.startswith("wiki/syntheses/")], embed, known)
    findings["unsupported"] = unsupported_claims(claims, SourcePassages(root), embed)


def _redirect(page: Page) -> str | None:
    """The target that a merged page points to (frontmatter `redirect`)."""
    value = (page.frontmatter or {}).get("redirect")
    return str(value) if value and page.folder in ("entities", "concepts") else None


def _page_facts(page: Page, resolve) -> PageFacts:
    """What the coherence checks need of an entity, concept or topic page."""
    kind = {"entities": "entity", "concepts": "concept"}.get(page.folder, "topic")
    if _redirect(page):
        return PageFacts(page.rel, page.target, "redirect", [], "")
    meta = page.frontmatter or {}
    aliases = meta.get("aliases") if isinstance(meta.get("aliases"), list) else []
    names = [str(n) for n in [meta.get("name"), page.target.rsplit("/", 1)[-1], *aliases] if n]
    facts = PageFacts(page.rel, page.target, kind, names, "")
    own = {page.target} if kind != "topic" else set()
    for line_no, line, section in _body_lines(page):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ">")) or section in LINK_SECTIONS:
            continue
        if not facts.definition and section == "" and _has_prose(stripped):
            facts.definition = plain_text(re.split(r"(?<=[.!?])\s", stripped, maxsplit=1)[0])
        citations = [(target[len("sources/"):], anchor) for target, anchor in
                     (_split_link(m.group(1)) for m in WIKILINK.finditer(stripped))
                     if target.startswith("sources/")]
        if not citations or section == CONTRADICTIONS_SECTION or not _has_prose(stripped):
            continue
        linked = {resolve(m.group(1)) for m in WIKILINK.finditer(stripped)}
        subjects = own | {t for t in linked if t and t.startswith(("entities/", "concepts/"))}
        facts.claims.append(Claim(page.rel, line_no, stripped, citations, subjects))
    return facts


def _split_link(inner: str) -> tuple[str, str]:
    """`sources/a#para3|text` -> (`sources/a`, `para3`)."""
    target, _, anchor = inner.split("|", 1)[0].partition("#")
    target = target.strip()
    return (target[:-3] if target.endswith(".md") else target), anchor.strip()


def findings_count(findings: dict[str, list[dict]]) -> int:
    return sum(len(items) for items in findings.values())


def format_findings(findings: dict[str, list[dict]]) -> str:
    """The findings as text for `kb wiki check`."""
    lines = []
    for kind in FINDING_KINDS:
        items = findings.get(kind, [])
        lines.append(f"{kind}: {len(items)}")
        for item in items:
            where = item.get("page", "index.md")
            if "line" in item:
                where += f":{item['line']}"
            detail = {k: v for k, v in item.items() if k not in ("page", "line")}
            lines.append(f"  {where}" + (f"  {_short(detail)}" if detail else ""))
    lines.append(f"total: {findings_count(findings)}")
    return "\n".join(lines)


def _short(detail: dict) -> str:
    return "  ".join(f"{k}={v}" for k, v in detail.items())


# --- loading ---------------------------------------------------------------------


def _load_pages(root: Path) -> list[Page]:
    pages = []
    for file in wiki_page_files(root):
        rel_in_wiki = file.relative_to(root / "wiki")
        parts = rel_in_wiki.parts
        folder = parts[0] if len(parts) > 1 else ""
        subfolder = parts[1] if folder == "syntheses" and len(parts) > 2 else ""
        text = file.read_text(encoding="utf-8", errors="replace")
        frontmatter, error, body, body_start = split_frontmatter(text)
        pages.append(Page(
            rel=str(file.relative_to(root)),
            target=str(rel_in_wiki.with_suffix("")),
            folder=folder,
            subfolder=subfolder,
            frontmatter=frontmatter,
            frontmatter_error=error,
            body=body,
            body_start=body_start,
        ))
    return pages


def _body_lines(page: Page):
    """(line number, text, section) for body lines outside code fences."""
    in_fence = False
    section = ""
    for offset, line in enumerate(page.body):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        stripped = line.strip()
        if stripped.startswith("## "):
            section = stripped[3:].strip().lower()
        yield page.body_start + offset, line, section


def _links(page: Page):
    for line_no, line, _ in _body_lines(page):
        for match in WIKILINK.finditer(line):
            yield line_no, match.group(1)


# --- the rules -------------------------------------------------------------------


def _frontmatter_problems(page: Page) -> list[dict]:
    if page.folder not in SCHEMAS:
        return [{"page": page.rel, "problem": "page is outside the known folders (entities, concepts, sources, syntheses)"}]
    if page.frontmatter is None:
        return [{"page": page.rel, "problem": page.frontmatter_error}]
    expected_type, required = SCHEMAS[page.folder]
    if _redirect(page):
        required = ("name", "redirect")  # a merged page keeps only its name and where it went
    problems = []
    if page.frontmatter.get("type") != expected_type:
        problems.append(f"type is {page.frontmatter.get('type')!r}, expected {expected_type!r}")
    missing = [key for key in required if page.frontmatter.get(key) in (None, "")]
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if page.folder == "entities" and page.frontmatter.get("kind") not in ENTITY_KINDS | {None, ""}:
        problems.append(f"kind {page.frontmatter.get('kind')!r} is not one of {', '.join(sorted(ENTITY_KINDS))}")
    if page.folder == "syntheses":
        expected_kind = SYNTHESIS_KINDS.get(page.subfolder)
        if expected_kind and page.frontmatter.get("kind") not in (expected_kind, None, ""):
            problems.append(f"kind is {page.frontmatter.get('kind')!r}, expected {expected_kind!r}")
    if "sources" in required and not isinstance(page.frontmatter.get("sources", []), list):
        problems.append("sources is not a list")
    return [{"page": page.rel, "problem": p} for p in problems]


def _uncited_lines(page: Page) -> list[dict]:
    """Fact lines with no citation of a source page, on pages that state facts."""
    if page.folder not in ("entities", "concepts") and page.subfolder != "topics":
        return []
    found = []
    for line_no, line, section in _body_lines(page):
        stripped = line.strip()
        if (not stripped or stripped.startswith("#") or section in LINK_SECTIONS
                or TABLE_RULE.match(stripped) or stripped.startswith(">")):
            continue
        if not _has_prose(stripped):
            continue  # a line of links only, such as "- [[concepts/x]]"
        if "[[sources/" not in stripped:
            found.append({"page": page.rel, "line": line_no, "text": stripped[:160]})
    return found


def _has_prose(line: str) -> bool:
    without_links = WIKILINK.sub("", line)
    return bool(re.search(r"[A-Za-z\u00C0-\uFFFF]{2,}", without_links))


def _index_mismatch(root: Path, pages: list[Page], resolve) -> list[dict]:
    index = root / "index.md"
    if not index.exists():
        return [{"page": "index.md", "problem": "index.md is missing"}]
    listed = set()
    problems = []
    for line_no, line in enumerate(index.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for match in WIKILINK.finditer(line):
            resolved = resolve(match.group(1))
            if resolved is None:
                problems.append({"page": "index.md", "line": line_no, "link": match.group(1),
                                 "problem": "index.md lists a page that does not exist"})
            else:
                listed.add(resolved)
    for page in pages:
        if page.target not in listed:
            problems.append({"page": page.rel, "problem": "page is not in index.md"})
    return problems


# --- contradictions and cited claims ------------------------------------------------

CONTRADICTIONS_SECTION = "contradictions"
CITATION = re.compile(r"\[\[(sources/[^\]|#\n]+)")
LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
# A reworded claim still counts as kept when a line carries all its
# citations and at least this share of its words (a lint fix of a link or a
# typo must pass; a claim cut down to a stub must not).
KEPT_WORD_SHARE = 0.5


def _open_contradictions(page: Page) -> list[dict]:
    """Items of a page's "Contradictions" section that no one has resolved.
    An item is resolved when its line says "resolved"."""
    found = []
    for line_no, line, section in _body_lines(page):
        stripped = line.strip()
        if section != CONTRADICTIONS_SECTION or not stripped or stripped.startswith("#"):
            continue
        if _has_prose(stripped) and "resolved" not in stripped.lower():
            found.append({"page": page.rel, "line": line_no, "text": stripped[:160]})
    return found


def _claim_text(line: str) -> str:
    return " ".join(LIST_MARK.sub("", line).split())


def cited_claims(text: str) -> list[str]:
    """The lines of a page that state something and cite a source page, in a
    normal form (no list mark, single spaces). Code blocks do not count."""
    page = split_frontmatter(text)
    claims = []
    in_fence = False
    for line in page.body:
        stripped = line.strip()
        if FENCE.match(stripped):
            in_fence = not in_fence
            continue
        if in_fence or stripped.startswith("#") or not CITATION.search(stripped) or not _has_prose(stripped):
            continue
        claims.append(_claim_text(stripped))
    return claims


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", WIKILINK.sub("", text).lower()))


def lost_cited_claims(before: dict[str, str], after: dict[str, str]) -> list[dict]:
    """Cited claims of the pages in `before` that no page in `after` keeps.

    `before`: path -> text of each page that the change touched, as it was.
    `after`: path -> text of every page after the change.
    A claim is kept when its text is still in a page (the same page or
    another: moved, merged, or marked disputed around it), or when a line
    carries all its citations and most of its words (a small fix). Anything
    else deleted a cited claim: the wiki keeps both sides of a
    contradiction and marks a claim disputed; it never drops one."""
    after_claims = [(path, claim) for path, text in after.items() for claim in cited_claims(text)]
    after_text = {path: " ".join(_claim_text(line) for line in text.splitlines()) for path, text in after.items()}
    lost = []
    for path, text in before.items():
        for claim in cited_claims(text):
            if any(claim in joined for joined in after_text.values()):
                continue
            citations = set(CITATION.findall(claim))
            words = _words(claim)
            if any(citations <= set(CITATION.findall(other))
                   and len(words & _words(other)) >= KEPT_WORD_SHARE * len(words)
                   for _, other in after_claims):
                continue
            lost.append({"page": path, "claim": claim[:200]})
    return lost
