"""An obedient wiki agent: a loopback Messages API (tests/fake_anthropic.py)
that reads kb's task in the first prompt and plays the change that
CLAUDE.md and the prompt ask for, through the real Claude Code CLI.

Use it where a test or a simulation needs a model that does its job:

    with ObedientAnthropic(root) as model:           # root: the wiki folder
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.base_url)
        outcome = lint_wiki(...)                      # or ingest_source, weekly_synthesis, topic_synthesis
    model.plans  # one Plan per conversation: the pages that the agent wrote

The plan is made from the wiki on disk when the conversation starts, so a
retry after a rollback gets the same plan. What the agent does, by task:

- Ingest (`plan_ingest`): the source page (each paragraph's first sentence
  is a key claim, cited `#paraN`), one entity page for each name in
  `Hints.new_entities` (made, or updated with new lines when it exists),
  the contradictions of `Hints.contradictions` (the old claim marked
  `(disputed)`, the new one next to it, a `## Contradictions` line and a
  warning), index.md and log.md.
- Lint (`plan_lint`): each finding of the prompt's JSON, fixed as the Lint
  workflow says (`obey_findings`), the report page, log.md.
- Weekly and topic synthesis (`plan_weekly`, `plan_topic`).

`Hints.skip` names finding kinds that the agent leaves alone. A test can
also script its own turns with `script(reads, writes, ...)`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kb.wiki.agent import REPORT_TOOL_FULL_NAME
from kb.wiki.change_rules import CITATION, link_target
from kb.wiki.coherence import content_words, plain_text
from kb.wiki.schema import (AUTO_SECTION_MARKER, CONCEPT, DISPUTED_MARK, ENTITY, SOURCE, UNSUPPORTED_MARK,
                            entity_name, parsed_paragraphs, render_frontmatter, render_page, schema_for)
from kb.wiki_files import WIKILINK, split_frontmatter, wiki_page_files
from tests.fake_anthropic import FakeAnthropic, report, text, tool_use, write

# A passage holds a claim when it has this share of the claim's content words
# (kb.wiki.coherence.SUPPORT_WORD_SHARE).
HOLDS = 0.6
INDEX_SECTIONS = {"sources": "Sources", "entities": "Entities", "concepts": "Concepts", "syntheses": "Syntheses"}


@dataclass
class Hints:
    """What an obedient model would know from reading, that kb does not say."""

    new_entities: tuple[str, ...] = ()  # names to make or update an entity page for (ingest)
    # (page path, the old claim line as written, the new claim's words): an ingest that contradicts.
    contradictions: tuple[tuple[str, str, str], ...] = ()
    skip: tuple[str, ...] = ()  # finding kinds that the lint leaves alone


@dataclass
class Plan:
    task: str  # ingest, lint, weekly, topic
    reads: list[str]
    writes: dict[str, str]
    commit_message: str
    summary: str = ""
    warnings: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)

    def turns(self) -> list:
        return script(self.reads, self.writes, commit_message=self.commit_message, summary=self.summary,
                      warnings=self.warnings, created=self.created, updated=self.updated)


def script(reads: list[str], writes: dict[str, str], *, commit_message: str, summary: str = "",
           warnings: list[str] = (), created: list[str] = (), updated: list[str] = ()) -> list:
    """The turns of one change: read (the CLI writes a file that exists only
    after a Read of it), write every page, report, stop."""
    turns = []
    if reads:
        turns.append([tool_use("Read", file_path=path) for path in dict.fromkeys(reads)])
    if writes:
        turns.append([write(path, content) for path, content in writes.items()])
    turns.append([report(status="success", commit_message=commit_message, pages_created=list(created),
                         pages_updated=list(updated), log_entry=commit_message, summary=summary or commit_message,
                         warnings=list(warnings))])
    turns.append([text("Done.")])
    return turns


class ObedientAnthropic(FakeAnthropic):
    """The loopback model that plans each conversation from its first prompt."""

    def __init__(self, root: Path, hints: Hints | None = None) -> None:
        super().__init__()
        self.root = Path(root)
        self.hints = hints or Hints()
        self.plans: list[Plan] = []

    def _answer(self, body: dict):
        tools = body.get("tools", [])
        messages = body.get("messages", [])
        if any(t.get("name") == REPORT_TOOL_FULL_NAME for t in tools) and \
                not any(m.get("role") == "assistant" for m in messages):
            first = messages[0]["content"]
            prompt = first if isinstance(first, str) else "\n".join(b.get("text", "") for b in first)
            plan = plan_for(self.root, prompt, self.hints)
            self.plans.append(plan)
            self.turns = plan.turns()
        return super()._answer(body)


TASK_OPENERS = ("Ingest one source", "Lint the wiki", "Write the weekly synthesis", "Write a synthesis about the topic")


def plan_for(root: Path, prompt: str, hints: Hints) -> Plan:
    """The plan of the task in `prompt` (the CLI puts its own text before kb's task)."""
    starts = [prompt.find(opener) for opener in TASK_OPENERS if opener in prompt]
    prompt = prompt[min(starts):] if starts else prompt
    if prompt.startswith("Ingest one source"):
        return plan_ingest(root, prompt, hints)
    if prompt.startswith("Lint the wiki"):
        return plan_lint(root, prompt, hints)
    if prompt.startswith("Write the weekly synthesis"):
        return plan_weekly(root, prompt)
    if prompt.startswith("Write a synthesis about the topic"):
        return plan_topic(root, prompt)
    raise AssertionError(f"the obedient agent does not know this task: {prompt[:200]!r}")


# --- pages in memory -----------------------------------------------------------------


class Pages:
    """The files that a plan reads and writes, read from disk once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.texts: dict[str, str] = {}
        self.reads: list[str] = []
        self.created: list[str] = []

    def get(self, path: str) -> str:
        if path not in self.texts:
            file = self.root / path
            self.texts[path] = file.read_text(encoding="utf-8") if file.is_file() else ""
            if file.is_file():
                self.reads.append(path)
        return self.texts[path]

    def set(self, path: str, content: str) -> None:
        if path not in self.texts:
            self.get(path)  # the CLI writes a file that exists only after a Read of it
            if not (self.root / path).is_file():
                self.created.append(path)
        self.texts[path] = content

    def changed(self) -> dict[str, str]:
        out = {}
        for path, content in self.texts.items():
            file = self.root / path
            if not file.is_file() or file.read_text(encoding="utf-8") != content:
                out[path] = content
        return out

    def plan(self, task: str, commit_message: str, **kw) -> Plan:
        writes = self.changed()
        return Plan(task, self.reads, writes, commit_message, created=[p for p in writes if p in self.created],
                    updated=[p for p in writes if p not in self.created], **kw)

    def pages(self) -> list[str]:
        return [f.relative_to(self.root).as_posix() for f in wiki_page_files(self.root)]


def with_line(content: str, line_no: int, change) -> str:
    """`content` with its line `line_no` (1-based) put through `change`."""
    lines = content.split("\n")
    lines[line_no - 1] = change(lines[line_no - 1])
    return "\n".join(lines)


def at_end(line: str, addition: str) -> str:
    """The line with `addition` at its end: a citation, or a mark."""
    return line.rstrip() + " " + addition


def add_to_section(content: str, section: str, line: str) -> str:
    """`line` at the end of `## section` (made at the end of the page when missing)."""
    lines = content.rstrip("\n").split("\n")
    heading = f"## {section}"
    if heading not in lines:
        return "\n".join(lines + ["", heading, line]) + "\n"
    at = lines.index(heading) + 1
    while at < len(lines) and not lines[at].startswith("#") and lines[at].strip() != AUTO_SECTION_MARKER:
        at += 1
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    return "\n".join(lines[:at] + [line] + lines[at:]) + "\n"


def above_marker(content: str, new_lines: list[str]) -> str:
    """New lines just above the marker (the owner's section keeps its lines)."""
    lines = content.split("\n")
    at = lines.index(AUTO_SECTION_MARKER)
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    return "\n".join(lines[:at] + new_lines + lines[at:])


def with_frontmatter(content: str, path: str, **values) -> str:
    page = split_frontmatter(content)
    data = {**(page.data or {}), **values}
    return render_frontmatter(schema_for(path.removeprefix("wiki/")), data) + "\n" + "\n".join(page.body) + "\n"


def append_log(pages: Pages, heading: str, lines: list[str]) -> None:
    log = pages.get("log.md")
    pages.set("log.md", log.rstrip("\n") + f"\n\n## {heading}\n" + "".join(f"- {line}\n" for line in lines))


def add_to_index(pages: Pages, target: str) -> None:
    index = pages.get("index.md")
    if f"[[{target}]]" in index:
        return
    pages.set("index.md", add_to_section(index, INDEX_SECTIONS[target.split("/", 1)[0]], f"- [[{target}]]"))


def passages(root: Path, slug: str) -> list[str]:
    """The paragraphs that `[[sources/<slug>#paraN]]` counts."""
    page = root / "wiki" / "sources" / f"{slug}.md"
    if not page.is_file():
        return []
    parsed = str((split_frontmatter(page.read_text(encoding="utf-8")).data or {}).get("parsed_path") or "")
    file = root / parsed
    return parsed_paragraphs(file.read_text(encoding="utf-8")) if parsed and file.is_file() else []


def holding_passage(root: Path, claim: str, slugs: list[str]) -> str | None:
    """The citation `[[sources/<slug>#paraN]]` of a passage that holds the claim, or None."""
    words = content_words(plain_text(claim))
    for slug in slugs:
        for number, paragraph in enumerate(passages(root, slug), start=1):
            if words and len(words & content_words(paragraph)) >= HOLDS * len(words):
                return f"[[sources/{slug}#para{number}]]"
    return None


def source_slugs(root: Path) -> list[str]:
    return sorted(f.stem for f in (root / "wiki" / "sources").glob("*.md"))


def first_sentence(paragraph: str) -> str:
    return re.split(r"(?<=[.!?])\s", paragraph.strip(), maxsplit=1)[0]


# --- ingest -------------------------------------------------------------------------------


def _prompt_value(prompt: str, label: str) -> str:
    match = re.search(rf"^-? ?{re.escape(label)}:? (.+)$", prompt, re.M)
    assert match, f"the prompt has no {label}"
    return match.group(1).strip().strip("`")


def plan_ingest(root: Path, prompt: str, hints: Hints) -> Plan:
    parsed = _prompt_value(prompt, "The new source is at")
    slug = Path(parsed).stem
    day = _prompt_value(prompt, "Date")
    data = json.loads(prompt.split("```json\n", 1)[1].split("\n```", 1)[0])
    pages = Pages(root)
    for path in ("CLAUDE.md", "purpose.md", "index.md", parsed):
        pages.get(path)
    paragraphs = parsed_paragraphs(pages.get(parsed))
    claims = [f"- {first_sentence(p)} [[sources/{slug}#para{n}]]" for n, p in enumerate(paragraphs, start=1)
              if re.search(r"[A-Za-z]{2,}", p)]
    warnings, connections = [], []
    for name in hints.new_entities:
        target = f"entities/{entity_name(name)}"
        path = f"wiki/{target}.md"
        facts = [c for c in claims if name in c] or claims[:1]
        connections.append(f"- Mentions [[{target}]].")
        if pages.get(path):  # the page exists: new facts as new lines; every line stays
            content = pages.get(path)
            pages.set(path, above_marker(content, [c for c in facts if c not in content]))
        else:
            page = render_page(ENTITY, {"type": "entity", "created": day, "last_updated": day, "sources": [slug],
                                        "name": name, "kind": "person"}, name,
                               {"Overview": [facts[0][2:]], "Roles and affiliations": facts[1:],
                                "Connections": [f"- Mentioned in [[sources/{slug}]]."]})
            pages.set(path, page)
            add_to_index(pages, target)
    for path, old_line, new_words in hints.contradictions:
        content = pages.get(path)
        number = next((n for n, p in enumerate(paragraphs, start=1) if new_words in p), 1)
        new_claim = f"- {new_words} [[sources/{slug}#para{number}]]"
        content = content.replace(old_line + "\n", f"{at_end(old_line, DISPUTED_MARK)}\n{new_claim}\n", 1)
        old_cites = " ".join(m.group(0) for m in WIKILINK.finditer(old_line) if "sources/" in m.group(0))
        content = add_to_section(content, "Contradictions",
                                 f"- Disputed: {plain_text(old_line)} {old_cites} vs {new_words} "
                                 f"[[sources/{slug}#para{number}]]")
        pages.set(path, content)
        warnings.append(f"contradiction: {path}: {plain_text(old_line)[:80]}")
        target = path.removeprefix("wiki/").removesuffix(".md")
        connections.append(f"- Disputes a claim of [[{target}]].")
    meta = {"resource_id": _prompt_value(prompt, "resource_id"), "resource_type": data.get("resource_type"),
            "source_url": data.get("source_url"), "title": data.get("title"),
            "ingested_at": _prompt_value(prompt, "ingested_at"), "parsed_path": parsed,
            "quality_score": None, "topics": data.get("topics") or []}
    score = _prompt_value(prompt, "quality_score")
    meta["quality_score"] = int(score) if score.isdigit() else None
    page = f"wiki/sources/{slug}.md"
    pages.set(page, render_page(SOURCE, meta, str(data.get("title") or slug), {
        "TL;DR": [first_sentence(paragraphs[0]) if paragraphs else "An empty source."],
        "Key claims": claims, "Connections": connections or ["- none yet"]}))
    add_to_index(pages, f"sources/{slug}")
    append_log(pages, f"{day} ingest {slug}", [p for p in pages.changed() if p.startswith("wiki/")])
    return pages.plan("ingest", f"ingest: {slug}", warnings=warnings, summary=f"Ingested {slug}.")


# --- lint -------------------------------------------------------------------------------------


def plan_lint(root: Path, prompt: str, hints: Hints) -> Plan:
    day = re.search(r"The date is (\d{4}-\d{2}-\d{2})", prompt).group(1)
    findings = json.loads(prompt.split("```json\n", 1)[1].split("\n```", 1)[0])
    pages = Pages(root)
    pages.get("CLAUDE.md")
    pages.get("purpose.md")
    fixed, left = obey_findings(root, pages, findings, hints.skip)
    # The report names links as code: a report line is no link of the wiki.
    fixed, left = ([WIKILINK.sub(lambda m: f"`{m.group(1)}`", line) for line in lines] for lines in (fixed, left))
    report_path = f"wiki/syntheses/lint/{day}.md"
    body = [f"---\ntype: synthesis\nkind: lint\nperiod: {day}\ncreated: {day}\nsources: []\n---",
            f"# Lint {day}", "", "## Fixed", *([f"- {line}" for line in fixed] or ["- nothing"]), "",
            "## Left", *([f"- {line}" for line in left] or ["- nothing"]), ""]
    pages.set(report_path, "\n".join(body))
    append_log(pages, f"{day} lint", [f"{len(fixed)} fixed, {len(left)} left: [[syntheses/lint/{day}]]"])
    return pages.plan("lint", f"lint: {day}", summary=f"{len(fixed)} findings fixed.")


def obey_findings(root: Path, pages: Pages, findings: dict, skip: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Fix each finding as the Lint workflow says. First the changes of a
    line in its place (line numbers stay), then the new lines and pages."""
    fixed, left = [], []
    todo = {kind: items for kind, items in findings.items() if kind not in skip}
    for item in todo.get("uncited", []):
        line = pages.get(item["page"]).split("\n")[item["line"] - 1]
        cite = holding_passage(root, line, source_slugs(root))
        if cite:
            pages.set(item["page"], with_line(pages.get(item["page"]), item["line"], lambda s: at_end(s, cite)))
            fixed.append(f"uncited: {item['page']} line {item['line']}: added {cite}")
        else:
            left.append(f"uncited: {item['page']} line {item['line']}: no source holds it")
    for item in todo.get("unsupported", []):
        content = pages.get(item["page"])
        line = content.split("\n")[item["line"] - 1]
        cited = [link_target(m.group(1)).removeprefix("sources/") for m in CITATION.finditer(line)]
        cite = holding_passage(root, line, cited)
        if cite and cite not in line:
            pages.set(item["page"], with_line(content, item["line"], lambda s: at_end(s, cite)))
            fixed.append(f"unsupported: {item['page']} line {item['line']}: cited {cite}")
        else:
            pages.set(item["page"], with_line(content, item["line"], lambda s: at_end(s, UNSUPPORTED_MARK)))
            fixed.append(f"unsupported: {item['page']} line {item['line']}: marked {UNSUPPORTED_MARK}")
    contradictions: list[tuple[str, str]] = []
    for item in todo.get("stale_claims", []):
        content = pages.get(item["page"])
        line = content.split("\n")[item["line"] - 1]
        later = [s.strip() for s in (item.get("superseded_by") or item.get("contradicted_by") or "").split(",")]
        cite = holding_passage(root, line, later)
        if cite:
            pages.set(item["page"], with_line(content, item["line"], lambda s: at_end(s, cite)))
            fixed.append(f"stale: {item['page']} line {item['line']}: cited the later source {cite}")
        else:
            pages.set(item["page"], with_line(content, item["line"], lambda s: at_end(s, DISPUTED_MARK)))
            contradictions.append((item["page"], f"- Disputed: {plain_text(line)} vs [[sources/{later[0]}]]"))
            fixed.append(f"stale: {item['page']} line {item['line']}: marked {DISPUTED_MARK}")
    for item in todo.get("contradiction_candidates", []):
        for page, line_no in ((item["page"], item["line"]), (item["other"], item["other_line"])):
            pages.set(page, with_line(pages.get(page), line_no,
                                      lambda s: s if DISPUTED_MARK in s else at_end(s, DISPUTED_MARK)))
        first = pages.get(item["page"]).split("\n")[item["line"] - 1].removesuffix(" " + DISPUTED_MARK)
        second = pages.get(item["other"]).split("\n")[item["other_line"] - 1].removesuffix(" " + DISPUTED_MARK)
        entry = f"- Disputed: {LIST_ITEM.sub('', first)} vs {LIST_ITEM.sub('', second)}"
        contradictions += [(item["page"], entry), (item["other"], entry)]
        fixed.append(f"contradiction: {item['page']} and {item['other']}: both marked {DISPUTED_MARK}")
    existing = {path.removeprefix("wiki/").removesuffix(".md") for path in pages.pages()}
    for item in todo.get("dangling_links", []):
        link = item["link"]
        right = _same_name(link_target(link), existing)
        shown = link.split("|", 1)[1] if "|" in link else link_target(link).rsplit("/", 1)[-1].replace("-", " ")
        new = f"[[{right}|{shown}]]" if right else shown
        pages.set(item["page"], with_line(pages.get(item["page"]), item["line"],
                                          lambda s: s.replace(f"[[{link}]]", new, 1)))
        fixed.append(f"dangling link: {item['page']} line {item['line']}: [[{link}]] -> {new}")
    # New lines and pages from here on.
    for page, entry in contradictions:
        pages.set(page, add_to_section(pages.get(page), "Contradictions", entry))
    for item in todo.get("frontmatter", []):
        problem = item["problem"]
        if problem.startswith("missing keys: "):
            path = item["page"]
            defaults = {"created": "2026-01-01", "last_updated": "2026-01-01", "sources": [], "type":
                        (schema_for(path.removeprefix("wiki/")) or ENTITY).type, "topics": [], "themes": []}
            values = {key: defaults.get(key) for key in problem.removeprefix("missing keys: ").split(", ")}
            pages.set(path, with_frontmatter(pages.get(path), path, **values))
            fixed.append(f"frontmatter: {path}: {problem}")
        else:
            left.append(f"frontmatter: {item['page']}: {problem}")
    for item in todo.get("schema", []):
        path, problem = item["page"], item["problem"]
        content = pages.get(path)
        if problem.startswith("missing sections: "):
            for heading in problem.removeprefix("missing sections: ").split(", "):
                content = _add_heading(content, path, heading.removeprefix("## "))
            pages.set(path, content)
            fixed.append(f"schema: {path}: {problem}")
        elif problem.startswith("no ") and AUTO_SECTION_MARKER in problem:
            lines = content.rstrip("\n").split("\n")
            at = lines.index("## Connections") if "## Connections" in lines else len(lines)
            pages.set(path, "\n".join(lines[:at] + [AUTO_SECTION_MARKER] + lines[at:]) + "\n")
            fixed.append(f"schema: {path}: added the marker")
        else:
            left.append(f"schema: {path}: {problem}")
    for item in todo.get("duplicates", []):
        fixed.append(merge(pages, item["page"], item["other"]))
    for item in todo.get("orphans", []):
        target = item["page"].removeprefix("wiki/").removesuffix(".md")
        related = _related_page(pages, item["page"])
        if related:
            pages.set(related, add_to_section(pages.get(related), "Connections", f"- [[{target}]]"))
            fixed.append(f"orphan: {item['page']}: linked from {related}")
        else:
            left.append(f"orphan: {item['page']}: no related page")
    for item in todo.get("index_mismatch", []):
        if item["problem"] == "page is not in index.md":
            add_to_index(pages, item["page"].removeprefix("wiki/").removesuffix(".md"))
            fixed.append(f"index: added {item['page']}")
        elif "does not exist" in item["problem"]:
            pages.set("index.md", "\n".join(line for line in pages.get("index.md").split("\n")
                                            if f"[[{item['link']}]]" not in line))
            fixed.append(f"index: removed [[{item['link']}]]")
    for kind in ("stubs", "open_contradictions"):
        left += [f"{kind}: {item['page']}" for item in todo.get(kind, [])]
    return fixed, left


LIST_ITEM = re.compile(r"^\s*[-*+]\s+")


def _same_name(target: str, existing: set[str]) -> str | None:
    """The page that a dangling link means: the same name but for case, spaces and hyphens."""
    def norm(name: str) -> str:
        return re.sub(r"[\s_-]+", "-", name.rsplit("/", 1)[-1]).casefold()
    folder = target.rsplit("/", 1)[0] if "/" in target else ""
    found = [page for page in sorted(existing) if norm(page) == norm(target)
             and (not folder or page.startswith(folder + "/"))]
    return found[0] if len(found) == 1 else None


def _add_heading(content: str, path: str, heading: str) -> str:
    """`## heading` in its place: before the next section of the schema that the page has."""
    schema = schema_for(path.removeprefix("wiki/"))
    order = list(schema.sections + schema.auto_sections)
    lines = content.rstrip("\n").split("\n")
    later = [f"## {name}" for name in order[order.index(heading) + 1:]] if heading in order else []
    marker = [AUTO_SECTION_MARKER] if heading in schema.sections and schema.marker else []
    at = next((i for i, line in enumerate(lines) if line in later or line in marker), len(lines))
    return "\n".join(lines[:at] + [f"## {heading}", ""] + lines[at:]) + "\n"


def _related_page(pages: Pages, orphan: str) -> str | None:
    """A page to link an orphan from: an entity or concept page that cites a
    source that the orphan cites (or is), else the first one."""
    orphan_text = pages.get(orphan)
    cited = {m.group(1) for m in CITATION.finditer(orphan_text)}
    if orphan.startswith("wiki/sources/"):
        cited.add(orphan.removeprefix("wiki/").removesuffix(".md"))
    candidates = [p for p in pages.pages() if p != orphan and p.startswith(("wiki/entities/", "wiki/concepts/"))
                  and not (split_frontmatter(pages.get(p)).data or {}).get("redirect")]
    for page in candidates:
        if cited & {m.group(1) for m in CITATION.finditer(pages.get(page))}:
            return page
    return candidates[0] if candidates else None


def merge(pages: Pages, first: str, second: str) -> str:
    """The playbook's merge: the page with more cited claims stays; every line
    above the other page's marker moves to it, word for word; the other page
    becomes a redirect page. kb does the rest (kb.wiki.finish.finish_merges)."""
    def cited(path: str) -> int:
        return len(CITATION.findall(pages.get(path)))
    kept, other = (first, second) if cited(first) >= cited(second) else (second, first)
    other_page = split_frontmatter(pages.get(other))
    section = ""
    for line in other_page.body:
        if line.strip() == AUTO_SECTION_MARKER:
            break
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.strip() or line.strip().startswith("#"):
            continue
        content = pages.get(kept)
        if line in content.split("\n"):
            continue
        # Into the same section of the kept page, when it has one; else just above its marker.
        lines = content.split("\n")
        heading = f"## {section}"
        if section and heading in lines and lines.index(heading) < lines.index(AUTO_SECTION_MARKER):
            pages.set(kept, add_to_section(content, section, line))
        else:
            pages.set(kept, above_marker(content, [line]))
    meta = other_page.data or {}
    target = kept.removeprefix("wiki/").removesuffix(".md")
    name = str(meta.get("name") or other.rsplit("/", 1)[-1].removesuffix(".md"))
    schema = CONCEPT if other.startswith("wiki/concepts/") else ENTITY
    redirect = render_frontmatter(schema, {"type": schema.type, "created": meta.get("created"),
                                           "last_updated": meta.get("last_updated"), "sources": [], "name": name,
                                           "redirect": target})
    pages.set(other, f"{redirect}\n# {name}\n\nMerged into [[{target}]].\n")
    return f"duplicates: merged {other} into {kept}"


# --- syntheses --------------------------------------------------------------------------------


def _source_claim(root: Path, slug: str) -> str:
    """The first key claim of a source page, as written, or a link to it."""
    page = root / "wiki" / "sources" / f"{slug}.md"
    for line in (page.read_text(encoding="utf-8").split("\n") if page.is_file() else []):
        if line.startswith("- ") and f"[[sources/{slug}" in line:
            return line
    return f"- [[sources/{slug}]]"


def plan_weekly(root: Path, prompt: str) -> Plan:
    label = re.search(r"weekly synthesis for (\d{4}-W\d{2})", prompt).group(1)
    slugs = re.findall(r"^- \[\[sources/([^\]]+)\]\]$", prompt, re.M)
    thin = re.search(r"must be `(Thin week: [^`]+)`", prompt)
    pages = Pages(root)
    for slug in slugs:
        pages.get(f"wiki/sources/{slug}.md")
    body = [f"---\ntype: synthesis\nkind: weekly\nweek: {label}\nsource_count: {len(slugs)}\nthemes: [reading]\n---",
            f"# Weekly Synthesis · {label} · Reading", ""]
    if thin:
        body += [thin.group(1), ""]
    body += ["## Theme of the week", f"What the {len(slugs)} sources of the week say.", "", "## Reading",
             *[_source_claim(root, slug) for slug in slugs], "", "## Open questions", "- none yet", "",
             "## Reading list", *[f"- [[sources/{slug}]]: the source of the week." for slug in slugs], ""]
    pages.set(f"wiki/syntheses/weekly/{label}.md", "\n".join(body))
    append_log(pages, f"synthesis {label}", [f"[[syntheses/weekly/{label}]]"])
    return pages.plan("weekly", f"synthesis: weekly {label}", summary=f"The week {label}.")


def plan_topic(root: Path, prompt: str) -> Plan:
    topic = re.search(r"about the topic `([^`]+)`", prompt).group(1)
    day = re.search(r"The date is (\d{4}-\d{2}-\d{2})", prompt).group(1)
    pages = Pages(root)
    words = set(topic.split("-"))
    claims = []
    for path in pages.pages():
        if not path.startswith(("wiki/entities/", "wiki/concepts/")):
            continue
        for line in pages.get(path).split("\n"):
            if CITATION.search(line) and line.startswith("- ") and words & content_words(plain_text(line)) \
                    and line not in claims:
                claims.append(line.removesuffix(" " + DISPUTED_MARK))
    sources = sorted({m.group(1).removeprefix("sources/") for line in claims for m in CITATION.finditer(line)})
    body = [f"---\ntype: synthesis\nkind: topic\nperiod: {topic}\ncreated: {day}\nsources: [{', '.join(sources)}]\n---",
            f"# {topic}", "", "## What the wiki knows", *(claims or ["The wiki has no claim about it yet."]), "",
            "## Open questions", "- What is missing?", ""]
    path = f"wiki/syntheses/topics/{topic}.md"
    pages.set(path, "\n".join(body))
    add_to_index(pages, f"syntheses/topics/{topic}")
    append_log(pages, f"{day} topic {topic}", [f"[[syntheses/topics/{topic}]]"])
    return pages.plan("topic", f"synthesis: topic {topic}", summary=f"The topic {topic}.")
