"""Deterministic checks of a wiki folder: no LLM, only the files.

`check_wiki(path)` returns one list per kind of finding. The same findings
are Dagster asset checks on `wiki_pages`, the input of the daily lint agent,
and the output of `kb wiki check [PATH] [--json]`.

The rules come from the page schemas (kb/wiki/schema.py) and the playbook
(kb/wiki/playbook.py): pages live
in wiki/, links name a page by its path under wiki/ without `.md`, a link may
carry `#section` and `|text`, and every fact on an entity, concept or topic
page cites a source page.
"""


import re
from dataclasses import dataclass
from pathlib import Path

from kb.wiki.coherence import (Claim, Embed, PageFacts, SourcePassages, contradiction_candidates, duplicate_pages,
                                local_embed, plain_text, unsupported_claims)
from kb.wiki.schema import (AUTO_SECTION_MARKER, CLAIM_MARKS, ENTITY_KINDS, SYNTHESIS_KINDS, UNSUPPORTED_MARK,
                            PageSchema, name_problem, schema_for)
from kb.wiki_files import WIKILINK, LinkResolver, WikiPage, body_lines, parse_link, read_page_file, wiki_page_files


FINDING_KINDS = ("dangling_links", "orphans", "stubs", "index_mismatch", "frontmatter", "schema", "uncited",
                 "open_contradictions", "duplicates", "contradiction_candidates", "unsupported", "stale_claims")
STUB_MIN_BODY_LINES = 10
TABLE_RULE = re.compile(r"^\|?[\s:|-]+\|?$")

# Sections that list links, not claims, on pages of kb's earlier format
# and on the owner's pages: their lines need no citation. The schemas add
# their own (kb.wiki.schema: TL;DR, Open questions, Connections ...).
LINK_SECTIONS = {"related", "see also", "mentions", "aliases", "links", "mentioned in syntheses", "reading list"}
@dataclass
class Page:
    """A page and where it is. What it says comes from the one reader of
    kb (kb.wiki_files.read_page), as the web page, the MCP server and the
    index read it."""

    rel: str  # path relative to the wiki root: wiki/entities/Ada Lovelace.md
    folder: str  # entities, concepts, sources, syntheses, or "" (wiki/ itself)
    subfolder: str  # for syntheses: weekly, lint, topics
    read: WikiPage

    @property
    def target(self) -> str:  # how links name it: entities/Ada Lovelace
        return self.read.target

    @property
    def frontmatter(self) -> dict | None:
        return self.read.frontmatter

    @property
    def frontmatter_error(self) -> str | None:
        return self.read.frontmatter_error

    @property
    def body(self) -> list[str]:
        return self.read.body

    @property
    def body_start(self) -> int:  # line number of the first body line
        return self.read.body_start


def check_wiki(path: str | Path, embed: Embed | None = None) -> dict[str, list[dict]]:
    """All findings for the wiki folder at `path`: one list per kind.
    `embed` turns texts into unit vectors; by default the local model
    (kb.wiki.coherence.local_embed), loaded only when a check needs it."""
    root = Path(path).expanduser().resolve()
    if not (root / "wiki").is_dir():
        raise FileNotFoundError(f"{root} is not a wiki folder: it has no wiki/ subfolder")
    pages = _load_pages(root)
    # The files at the top (index.md, purpose.md) by their name, as the web page resolves them.
    top = [f.stem for f in root.glob("*.md") if f.is_file()]
    page_link = LinkResolver((p.target for p in pages), top)

    def resolve(link: str) -> str | None:
        """The page target that a link names (kb.wiki_files.LinkResolver),
        `root:<file>` for files outside wiki/ (index.md, purpose.md, a
        parsed file), or None when nothing matches."""
        found = page_link(link)
        if found is not None:
            return f"root:{found}.md" if found in page_link.top and found not in page_link.targets else found
        # Files that are no pages exist too: a link to one is not dangling.
        target = parse_link(link).target
        if not target or ".." in target.split("/"):
            return None
        for candidate in (root / "wiki" / target, root / target):
            try:
                if candidate.with_name(candidate.name + ".md").is_file() or (candidate.suffix and candidate.is_file()):
                    return f"root:{candidate.relative_to(root)}"
            except OSError:
                # A name that no file can have (more than 255 bytes, a NUL):
                # Path.is_file() raises on Python 3.11, and one such link
                # stopped the whole check (7 December 2026). It is dangling.
                continue
        return None

    findings: dict[str, list[dict]] = {kind: [] for kind in FINDING_KINDS}
    inbound: dict[str, set[str]] = {p.target: set() for p in pages}
    for page in pages:
        for link in page.read.links:
            resolved = resolve(link.inner)
            if resolved is None:
                findings["dangling_links"].append({"page": page.rel, "line": link.line, "link": link.inner})
            elif resolved in inbound and resolved != page.target:
                inbound[resolved].add(page.target)
        findings["frontmatter"] += _frontmatter_problems(page)
        findings["schema"] += _schema_problems(page)
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
    passages = SourcePassages(root)
    # A claim that the lint marked is done: (unsupported) says that no passage
    # holds it, (disputed) that it was read against the later source.
    findings["unsupported"] = unsupported_claims([c for c in claims if not _marked(c.text, UNSUPPORTED_MARK)],
                                                 passages, embed)
    findings["stale_claims"] = _stale_claims([c for c in claims if not _marked(c.text, *CLAIM_MARKS)], passages,
                                             _contradicted_sources(pages))


def _marked(line: str, *marks: str) -> bool:
    """True when the line ends with one of `marks` (its citations aside)."""
    text = WIKILINK.sub("", line).rstrip()
    return any(text.endswith(mark) for mark in marks)


def _stale_claims(claims: list[Claim], passages: SourcePassages,
                  contradicted: dict[tuple[str, str], str]) -> list[dict]:
    """Claims whose every citation is stale (spec 2.1: lint finds stale
    claims): its source page is superseded (its frontmatter names the later
    parse in `superseded_by`), or an open contradiction sets the cited
    passage against a source ingested later (_contradicted_sources). A later
    text may say something else, and nobody has read the claim against it."""
    found = []
    for claim in claims:
        superseded = [passages.superseded_by(slug) for slug, _ in claim.citations]
        if superseded and all(superseded):
            found.append({"page": claim.page, "line": claim.line,
                          "superseded_by": ", ".join(dict.fromkeys(superseded)), "text": plain_text(claim.text)[:160]})
            continue
        later = [contradicted.get((slug, anchor)) or contradicted.get((slug, "")) for slug, anchor in claim.citations]
        if later and all(later):
            found.append({"page": claim.page, "line": claim.line, "contradicted_by": ", ".join(dict.fromkeys(later)),
                          "text": plain_text(claim.text)[:160]})
    return found


def _contradicted_sources(pages: list[Page]) -> dict[tuple[str, str], str]:
    """(source slug, anchor) -> the later source that contradicts it, from
    the open items of the pages' "Contradictions" sections: an item that
    cites sources of two ingest times sets each earlier citation against
    the latest source. The ingest time is the source page's date (its
    `ingested_at`, kb.wiki_files.read_page); a source without one is not ordered."""
    ingested = {page.target[len("sources/"):]: page.read.date.isoformat() if page.read.date else ""
                for page in pages if page.folder == "sources"}
    contradicted: dict[tuple[str, str], str] = {}
    for page in pages:
        for _, text in _open_contradiction_lines(page):
            cited = [(target[len("sources/"):], anchor) for target, anchor in
                     (_split_link(m.group(1)) for m in WIKILINK.finditer(text))
                     if target.startswith("sources/")]
            timed = [(ingested.get(slug, ""), slug, anchor) for slug, anchor in cited if ingested.get(slug)]
            if len({when for when, _, _ in timed}) < 2:
                continue
            newest_time, newest, _ = max(timed)
            for when, slug, anchor in timed:
                if when < newest_time:
                    contradicted[(slug, anchor)] = newest
    return contradicted


def _redirect(page: Page) -> str | None:
    """The target that a merged page points to (frontmatter `redirect`)."""
    value = (page.frontmatter or {}).get("redirect")
    return str(value) if value and page.folder in ("entities", "concepts") else None


def _page_facts(page: Page, resolve) -> PageFacts:
    """What the coherence checks need of an entity, concept or topic page."""
    kind = {"entities": "entity", "concepts": "concept"}.get(page.folder, "topic")
    if _redirect(page):
        return PageFacts(page.rel, page.target, "redirect", [], "")
    names = [n for n in [page.read.name, page.target.rsplit("/", 1)[-1], *page.read.aliases] if n]
    facts = PageFacts(page.rel, page.target, kind, names, "")
    own = {page.target} if kind != "topic" else set()
    free = _no_citation_sections(page)
    # The specification's pages define their subject in `## Definition`
    # (concepts) or `## Overview` (entities); kb's earlier pages in the
    # first line of the body.
    defining = {"", "definition", "overview"}
    for line_no, line, section in _body_lines(page):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ">")) or section in free:
            continue
        if not facts.definition and section in defining and _has_prose(stripped):
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
    link = parse_link(inner)
    return link.target, link.anchor


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
        parts = file.relative_to(root / "wiki").parts
        folder = parts[0] if len(parts) > 1 else ""
        subfolder = parts[1] if folder == "syntheses" and len(parts) > 2 else ""
        pages.append(Page(rel=str(file.relative_to(root)), folder=folder, subfolder=subfolder,
                          read=read_page_file(root, file)))
    return pages


def _body_lines(page: Page, keep_comments: bool = False):
    """(line number, text, section) for body lines outside code fences and,
    unless keep_comments, with HTML comments blanked (kb.wiki_files.body_lines,
    the reader's rule)."""
    section = ""
    for line_no, line in body_lines(page.body, page.body_start, keep_comments):
        stripped = line.strip()
        if stripped.startswith("## "):
            section = stripped[3:].strip().lower()
        yield line_no, line, section


# --- the rules -------------------------------------------------------------------


def _schema(page: Page) -> PageSchema | None:
    return schema_for(page.target + ".md")


def _frontmatter_problems(page: Page) -> list[dict]:
    """The frontmatter against the page's schema (kb.wiki.schema): every key
    of the specification is there, `type` and `kind` agree with the folder."""
    schema = _schema(page)
    if schema is None:
        return [{"page": page.rel, "problem": "page is outside the known folders (entities, concepts, sources, "
                 "syntheses/weekly, syntheses/lint, syntheses/topics)"}]
    if page.frontmatter is None:
        return [{"page": page.rel, "problem": page.frontmatter_error}]
    meta = page.frontmatter
    required = schema.keys
    if _redirect(page):
        required = ("type", "redirect")  # a merged page keeps only where it went
    problems = []
    if schema.type is not None and meta.get("type") != schema.type:
        problems.append(f"type is {meta.get('type')!r}, expected {schema.type!r}")
    elif schema.type is None and meta.get("type") not in (None, schema.kind):
        problems.append(f"type is {meta.get('type')!r}, expected {schema.kind!r} or no type")
    missing = [key for key in required if key not in meta]
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if schema.folder == "entities" and meta.get("kind") not in (*ENTITY_KINDS, None, ""):
        problems.append(f"kind {meta.get('kind')!r} is not one of {', '.join(ENTITY_KINDS)}")
    expected_kind = SYNTHESIS_KINDS.get(schema.folder)
    if expected_kind and meta.get("kind") not in (expected_kind, None, ""):
        problems.append(f"kind is {meta.get('kind')!r}, expected {expected_kind!r}")
    for key in ("sources", "topics", "themes", "aliases"):
        if meta.get(key) is not None and not isinstance(meta.get(key), list):
            problems.append(f"{key} is not a list")
    score = meta.get("quality_score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 100):
        problems.append(f"quality_score {score!r} is not a number from 0 to 100")
    if schema.folder == "syntheses/weekly" and meta.get("week") not in (None, page.target.rsplit("/", 1)[-1]):
        problems.append(f"week {meta.get('week')!r} is not the name of the page")
    return [{"page": page.rel, "problem": p} for p in problems]


def _schema_problems(page: Page) -> list[dict]:
    """The file name and the sections against the page's schema: the
    specification's sections are there, in their order, and entity and
    concept pages carry the marker of the owner's sections before the
    auto sections."""
    schema = _schema(page)
    if schema is None or page.frontmatter is None:
        return []
    problems = []
    if (rule := name_problem(page.target + ".md")) is not None:
        problems.append(rule.removeprefix(f"{page.rel}: "))
    if _redirect(page):
        return [{"page": page.rel, "problem": p} for p in problems]
    headings, marker_at = [], None
    for _, line, _ in _body_lines(page, keep_comments=True):
        stripped = line.strip()
        if stripped.startswith("## "):
            headings.append(stripped[3:].strip())
        elif stripped == AUTO_SECTION_MARKER and marker_at is None:
            marker_at = len(headings)
    missing = [name for name in schema.required_sections if name not in headings]
    if missing:
        problems.append(f"missing sections: {', '.join('## ' + name for name in missing)}")
    order = [name for name in schema.sections + schema.auto_sections if name in headings]
    if order != sorted(order, key=headings.index):
        problems.append(f"sections out of order: expected {', '.join('## ' + name for name in order)}")
    if schema.marker:
        if marker_at is None:
            problems.append(f"no {AUTO_SECTION_MARKER} line before the auto sections")
        else:
            above = [name for name in schema.auto_sections if name in headings[:marker_at]]
            if above:
                problems.append(f"{', '.join('## ' + name for name in above)} must come after {AUTO_SECTION_MARKER}")
    return [{"page": page.rel, "problem": p} for p in problems]


def _no_citation_sections(page: Page) -> set[str]:
    schema = _schema(page)
    return LINK_SECTIONS | {name.lower() for name in (schema.uncited_sections if schema else ())}


def _claim_section(page: Page, section: str) -> bool:
    """True when the lines of `section` ("" before the first `## `) are
    claims that cite a source (specification 6.2 and 7.2: "Every claim MUST
    cite a source page"; 7.4: "Every claim cites a source").
    - Entity, concept and topic pages: every section but those that list
      links or questions (_no_citation_sections).
    - Source pages: `## Key claims` only. The specification shows each of
      its lines with a citation of the parsed paragraph; kb cites it as
      `[[sources/<the page's own slug>#paraN]]` (docs/wiki.md). The TL;DR,
      the details and the connections summarize or link; they are no claims.
    - Weekly syntheses: the theme sections ("Per-theme synthesis with
      citations"), not the lines before the first section (the thin-week
      note) and not the free sections of the schema.
    - Lint reports and pages outside the known folders: none."""
    if page.folder in ("entities", "concepts") or page.subfolder == "topics":
        return section not in _no_citation_sections(page)
    if page.folder == "sources":
        return section == KEY_CLAIMS_SECTION
    if page.subfolder == "weekly":
        return section != "" and section not in _no_citation_sections(page)
    return False


KEY_CLAIMS_SECTION = "key claims"


def _uncited_lines(page: Page) -> list[dict]:
    """Claim lines with no citation of a source page (_claim_section)."""
    found = []
    for line_no, line, section in _body_lines(page):
        stripped = line.strip()
        if (not stripped or stripped.startswith("#") or not _claim_section(page, section)
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


# --- contradictions ------------------------------------------------

CONTRADICTIONS_SECTION = "contradictions"


def _open_contradictions(page: Page) -> list[dict]:
    """Items of a page's "Contradictions" section that no one has resolved."""
    return [{"page": page.rel, "line": line_no, "text": text[:160]} for line_no, text in _open_contradiction_lines(page)]


def _open_contradiction_lines(page: Page):
    """(line number, text) of each open item of the "Contradictions"
    section. An item is resolved when its line says "resolved"."""
    for line_no, line, section in _body_lines(page):
        stripped = line.strip()
        if section != CONTRADICTIONS_SECTION or not stripped or stripped.startswith("#"):
            continue
        if _has_prose(stripped) and "resolved" not in stripped.lower():
            yield line_no, stripped
