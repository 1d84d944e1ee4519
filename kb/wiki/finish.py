"""kb's own part of a lint and a weekly synthesis: deterministic edits and
checks on the agent's files, after the agent and before kb's checks and
commit (kb/wiki/tasks.py, `finish`).

The agent writes the synthesis; kb does not trust it to keep the rules that
a program can keep: the index lists the page, each page that the synthesis
names links back to it ("Mentioned in syntheses"), the reading list names
every source of the week, and the page stays short. kb adds what is
missing and refuses the change that it cannot fix (a page that is too long).
Every edit goes through the same allowlist and checks as the agent's.
"""

from __future__ import annotations

import re
from pathlib import Path

from kb.store.atomic_files import write_atomic
from kb.wiki.checks import findings_count
from kb.wiki.schema import with_frontmatter_key
from kb.wiki_files import WIKILINK, split_frontmatter, wiki_page_files

# The spec: a weekly synthesis of about 1,500 words. The prompt says 1,500;
# kb refuses a page of more than WEEKLY_WORD_LIMIT ("about": a tenth more).
WEEKLY_MAX_WORDS = 1500
WEEKLY_WORD_LIMIT = 1650
READING_LIST = "Reading list"
MENTIONED_IN = "Mentioned in syntheses"
UNSUPPORTED_SECTION = "Unsupported claims"
# Pages that a synthesis names and that get a back-link.
BACKLINK_FOLDERS = ("sources/", "entities/", "concepts/")


def add_to_index(root: Path, section: str, link: str) -> None:
    """Add `- [[link]]` under `## section` of index.md, once."""
    index = root / "index.md"
    lines = index.read_text(encoding="utf-8").splitlines() if index.exists() else ["# Index"]
    entry = f"- [[{link}]]"
    if entry in lines:
        return
    heading = f"## {section}"
    if heading not in lines:
        lines += ["", heading]
    at = lines.index(heading) + 1
    while at < len(lines) and not lines[at].startswith("## "):
        at += 1
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    lines.insert(at, entry)
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")


def add_section_line(path: Path, section: str, line: str) -> bool:
    """Add `line` under `## section` at the end of the page (the section is
    made when it is missing), once. True when the page changed."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if line in lines:
        return False
    heading = f"## {section}"
    if heading not in lines:
        lines += ["", heading, line]
    else:
        at = lines.index(heading) + 1
        while at < len(lines) and not lines[at].startswith("#"):
            at += 1
        while at > 0 and not lines[at - 1].strip():
            at -= 1
        lines.insert(at, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return True


def word_count(text: str) -> int:
    """Words of a page body: links count as their text, frontmatter does not."""
    body = "\n".join(split_frontmatter(text).body)
    body = WIKILINK.sub(lambda m: m.group(1).split("|", 1)[-1].rsplit("/", 1)[-1], body)
    return len(re.findall(r"[^\W_]+(?:['’-][^\W_]+)*", body))


def section_text(text: str, section: str) -> str:
    """The lines of `## section` of a page ("" when it has none)."""
    lines = split_frontmatter(text).body
    heading = f"## {section}".lower()
    out, inside = [], False
    for line in lines:
        if line.strip().startswith("## "):
            inside = line.strip().lower() == heading
            continue
        if inside:
            out.append(line)
    return "\n".join(out)


def finish_weekly(root: Path, label: str, slugs: list[str]) -> list[str]:
    """kb's part of the weekly synthesis `label`. Returns the problems that
    refuse the change; else it has made the page whole."""
    target = f"syntheses/weekly/{label}"
    page = root / "wiki" / f"{target}.md"
    pages = {f.relative_to(root / "wiki").with_suffix("").as_posix(): f for f in wiki_page_files(root)}
    if target not in pages:
        return [f"the synthesis wiki/{target}.md is missing"]
    text = page.read_text(encoding="utf-8")
    words = word_count(text)
    if words > WEEKLY_WORD_LIMIT:
        return [f"the synthesis wiki/{target}.md has {words} words: the limit is about {WEEKLY_MAX_WORDS} "
                f"(at most {WEEKLY_WORD_LIMIT})"]
    listed = {link.split("|", 1)[0].split("#", 1)[0].strip() for link in WIKILINK.findall(section_text(text, READING_LIST))}
    for slug in slugs:
        if f"sources/{slug}" not in listed and f"sources/{slug}" in pages:
            add_section_line(page, READING_LIST, f"- [[sources/{slug}]]")
    named = {link.split("|", 1)[0].split("#", 1)[0].strip() for link in WIKILINK.findall(page.read_text(encoding="utf-8"))}
    for name in sorted(named):
        if name.startswith(BACKLINK_FOLDERS) and name in pages:
            add_section_line(pages[name], MENTIONED_IN, f"- [[{target}]]")
    add_to_index(root, "Syntheses", target)
    return []


def finish_topic(root: Path, topic: str) -> list[str]:
    """kb's part of a topic synthesis: the index lists the page. The topic
    prompt does not ask the agent for it, and the lint's checks found the
    page missing from index.md (found by the month of issue 55)."""
    target = f"syntheses/topics/{topic}"
    page = root / "wiki" / f"{target}.md"
    if not page.is_file() or page.is_symlink():
        return [f"the topic synthesis wiki/{target}.md is missing"]
    add_to_index(root, "Syntheses", target)
    return []


def finish_lint(root: Path, day: str, unsupported: list[dict]) -> list[str]:
    """kb's part of the lint of `day`: the report lists the claims that the
    check found unsupported before the lint (the lint digest), and the
    index lists the report and every redirect page (what is left of a
    merged page: an old link or bookmark still finds its way)."""
    target = f"syntheses/lint/{day}"
    page = root / "wiki" / f"{target}.md"
    if not page.is_file() or page.is_symlink():
        return [f"the lint report wiki/{target}.md is missing"]
    index = root / "index.md"
    listed = index.read_text(encoding="utf-8") if index.is_file() else ""
    for file in wiki_page_files(root):
        relative = file.relative_to(root / "wiki").with_suffix("").as_posix()
        folder = relative.split("/", 1)[0]
        if folder not in ("entities", "concepts") or f"[[{relative}]]" in listed:
            continue
        if (split_frontmatter(file.read_text(encoding="utf-8", errors="replace")).data or {}).get("redirect"):
            add_to_index(root, folder.title(), relative)
    if unsupported and f"## {UNSUPPORTED_SECTION}" not in page.read_text(encoding="utf-8"):
        for item in unsupported:
            add_section_line(page, UNSUPPORTED_SECTION,
                             f"- `{item['page']}` line {item['line']}: {item['reason']}: {item['text']}")
    add_to_index(root, "Syntheses", target)
    return []


def finish_ingest(root: Path, parsed_path: str) -> list[str]:
    """kb's part of an ingest of a new parse of a source: the earlier parse
    that the new parsed file names (`supersedes`) and its source page get
    `superseded_by`. Nothing is deleted; the checks then find the claims
    that cite only the earlier parse (stale_claims)."""
    old = superseded_parse(root, parsed_path)
    if not old:
        return []
    old_file = root / old
    if not old.startswith("raw/parsed/") or ".." in old.split("/") or not old_file.is_file():
        return [f"{parsed_path}: supersedes {old!r}, which is not a parsed file of this wiki"]
    new_slug = Path(parsed_path).stem
    old_file.write_text(with_frontmatter_key(old_file.read_text(encoding="utf-8"), "superseded_by", parsed_path),
                        encoding="utf-8")
    page = root / "wiki" / "sources" / f"{Path(old).stem}.md"
    if page.is_file() and not page.is_symlink():
        page.write_text(with_frontmatter_key(page.read_text(encoding="utf-8"), "superseded_by", new_slug),
                        encoding="utf-8")
    return []


def superseded_parse(root: Path, parsed_path: str) -> str | None:
    """The earlier parsed file that the parsed file at `parsed_path` supersedes, or None."""
    parsed = root / parsed_path
    if not parsed.is_file():
        return None
    return str((split_frontmatter(parsed.read_text(encoding="utf-8", errors="replace")).data or {})
               .get("supersedes") or "") or None


def append_log(root: Path, heading: str, lines: list[str]) -> None:
    log = root / "log.md"
    text = log.read_text(encoding="utf-8") if log.exists() else "# Log\n"
    write_atomic(log, (text.rstrip("\n") + f"\n\n## {heading}\n"
                       + "".join(f"- {line}\n" for line in lines)).encode())


def write_lint_report(root: Path, day: str, findings: dict) -> None:
    page = root / "wiki" / "syntheses" / "lint" / f"{day}.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    body = [f"---\ntype: synthesis\nkind: lint\nperiod: {day}\nsources: []\ncreated: {day}\n---",
            f"# Lint {day}", "",
            "The wiki agent has no endpoint, so nothing was fixed. These are the findings of the checks.", ""]
    for kind, items in findings.items():
        body.append(f"## {kind.replace('_', ' ')} ({len(items)})")
        body += [f"- `{item.get('page', 'index.md')}`" + (f" line {item['line']}" if "line" in item else "")
                 + "".join(f" {k}: {v}" for k, v in item.items() if k not in ("page", "line"))
                 for item in items] or ["- none"]
        body.append("")
    page.write_text("\n".join(body), encoding="utf-8")
    add_to_index(root, "Syntheses", f"syntheses/lint/{day}")
    append_log(root, f"{day} lint", [f"{findings_count(findings)} findings, report [[syntheses/lint/{day}]]"])
