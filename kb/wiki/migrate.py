"""`kb wiki migrate`: a wiki of kb's earlier format moves to the schemas of
the owner's specification (kb/wiki/schema.py), in one commit.

What changes: the file names (entities Title-Case-With-Hyphens, concepts
kebab case, sources `<first 8 of the id>-<kebab-title>`), the frontmatter
keys, the section names and their order, the marker of the owner's
sections, every link to a renamed page, index.md (built again from the
files), and .gitignore (kb's earlier rule kept raw/ out of git).
What stays: every line of text, word for word, in the section that holds
the same kind of line. kb checks this as it checks an agent's change: a
cited claim that the migration would lose refuses the whole migration,
and the wiki stays as it was.

The parsed files keep their names and bytes: DuckDB's rows name them, and
a source page names its parsed file in `parsed_path`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from kb.wiki.change_rules import lost_cited_claims
from kb.wiki.finish import append_log
from kb.wiki.playbook import CLAUDE_MD, EARLIER_GITIGNORES, EARLIER_PLAYBOOK_SHA256, GITIGNORE
from kb.wiki.repo import Wiki, raw_files_lock
from kb.wiki.schema import (CONCEPT, ENTITY, MIGRATE_MESSAGE, SOURCE, SOURCE_NAME, WEEKLY, concept_name,
                            entity_name, render_frontmatter, render_page, source_slug)
from kb.wiki_files import WIKILINK, inside_wiki, split_frontmatter, wiki_page_files, write_wiki_file

# Sections of kb's earlier pages -> the specification's section.
EARLIER_SECTIONS = {
    "source": {"summary": "TL;DR", "key points": "Key claims", "mentions": "Connections"},
    "entity": {"facts": "Roles and affiliations", "related": "Connections", "see also": "Connections"},
    "concept": {"facts": "Key claims", "key points": "Key claims", "related": "Connections",
                "see also": "Connections"},
    "synthesis": {},
}


class MigrateError(RuntimeError):
    """The migration would break a rule; nothing was changed."""


@dataclass
class MigrateResult:
    sha: str | None  # None: the wiki was in the specification's format already
    renamed: dict[str, str] = field(default_factory=dict)  # old page path -> new
    rewritten: list[str] = field(default_factory=list)  # pages whose text changed


def _new_target(target: str, meta: dict) -> str:
    """The new link target (`entities/Ada-Lovelace`) of an earlier page."""
    folder, _, stem = target.partition("/")
    if folder == "entities":
        return f"entities/{entity_name(str(meta.get('name') or stem)) or entity_name(stem)}"
    if folder == "concepts":
        return f"concepts/{concept_name(stem) or concept_name(str(meta.get('name') or ''))}"
    if folder == "sources" and not SOURCE_NAME.match(stem):
        source_id = str(meta.get("resource_id") or meta.get("source_id") or "")
        title = str(meta.get("title") or stem)
        try:
            return f"sources/{source_slug(source_id, title)}"
        except ValueError:
            # An id too short for the name: 8 characters of its hash, so that
            # the name stays the same for the same id.
            return f"sources/{source_slug(hashlib.sha256((source_id or stem).encode()).hexdigest(), title)}"
    return target


def _rewrite_links(text: str, renames: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        bang, inner = "!" if match.group(0).startswith("!") else "", match.group(1)
        target, bar, label = inner.partition("|")
        path, hash_, anchor = target.partition("#")
        path = path.strip().removesuffix(".md")
        path = renames.get(path, renames.get(path.removeprefix("wiki/"), path))
        return f"{bang}[[{path}{hash_}{anchor}{bar}{label}]]"
    return WIKILINK.sub(one, text)


def _sections(body: list[str]) -> tuple[str, list[str], dict[str, list[str]]]:
    """(title, lines before the first `## `, {section: lines}) of a body."""
    title, lead, sections, current = "", [], {}, None
    for line in body:
        if not title and line.startswith("# "):
            title = line[2:].strip()
            continue
        if line.startswith("## "):
            current = line[3:].strip()
            sections.setdefault(current, [])
            continue
        (sections[current] if current else lead).append(line)
    trim = lambda lines: [ln for ln in "\n".join(lines).strip("\n").split("\n")] if any(ln.strip() for ln in lines) else []
    return title, trim(lead), {name: trim(lines) for name, lines in sections.items()}


def _merge(sections: dict[str, list[str]], kind: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, lines in sections.items():
        new = EARLIER_SECTIONS[kind].get(name.lower(), name)
        out.setdefault(new, [])
        out[new] += ([""] if out[new] and lines else []) + lines
    return out


def _source_page(meta: dict, title: str, lead: list[str], sections: dict) -> str:
    sections = _merge(sections, "source")
    if lead:
        sections["TL;DR"] = lead + ([""] + sections["TL;DR"] if sections.get("TL;DR") else [])
    values = {
        "resource_id": meta.get("resource_id") or meta.get("source_id"),
        "resource_type": meta.get("resource_type") or meta.get("source_type"),
        "source_url": meta.get("source_url") or meta.get("url"),
        "title": meta.get("title") or title,
        "ingested_at": str(meta.get("ingested_at") or meta.get("ingested") or ""),
        "parsed_path": meta.get("parsed_path") or meta.get("raw"),
        "quality_score": meta.get("quality_score"),
        "topics": meta.get("topics") or [],
        "type": "source",
        **{k: v for k, v in meta.items() if k not in ("source_id", "source_type", "url", "raw", "ingested")},
    }
    return render_page(SOURCE, values, title or str(values["title"]), sections)


def _entity_or_concept(schema, meta: dict, title: str, lead: list[str], sections: dict) -> str:
    kind = schema.kind
    sections = _merge(sections, kind)
    first = "Overview" if kind == "entity" else "Definition"
    if lead:
        sections[first] = lead + ([""] + sections[first] if sections.get(first) else [])
    date_value = str(meta.get("last_updated") or meta.get("updated") or meta.get("created") or "")
    values = {"type": kind, "created": str(meta.get("created") or date_value), "last_updated": date_value,
              "sources": meta.get("sources") or [],
              **{k: v for k, v in meta.items() if k not in ("updated",)}}
    return render_page(schema, values, title or str(meta.get("name") or ""), sections)


def _weekly_page(meta: dict, title: str, lead: list[str], sections: dict, label: str) -> str:
    sections = dict(sections)
    if lead:
        sections["Theme of the week"] = lead + sections.get("Theme of the week", [])
    sources = meta.get("sources") if isinstance(meta.get("sources"), list) else []
    values = {"type": "synthesis", "kind": "weekly", "week": meta.get("week") or meta.get("period") or label,
              "source_count": meta.get("source_count", len(sources)), "themes": meta.get("themes") or [],
              **{k: v for k, v in meta.items() if k not in ("period",)}}
    return render_page(WEEKLY, values, title, sections)


def _migrated(rel: str, text: str, renames: dict[str, str]) -> str:
    """The page in the specification's schema, its links rewritten."""
    page = split_frontmatter(_rewrite_links(text, renames))
    meta = dict(page.data or {})
    if isinstance(meta.get("sources"), list):  # the short names of the sources follow their pages
        meta["sources"] = [renames.get(f"sources/{s}", f"sources/{s}").removeprefix("sources/")
                           for s in meta["sources"]]
    title, lead, sections = _sections(page.body)
    folder = rel.split("/")[1]
    if meta.get("redirect"):
        meta = {"type": meta.get("type"), "created": meta.get("created") or meta.get("updated"),
                "last_updated": meta.get("updated") or meta.get("last_updated"), "sources": meta.get("sources") or [],
                **{k: v for k, v in meta.items() if k not in ("updated",)}}
        schema = ENTITY if folder == "entities" else CONCEPT
        return "\n".join([render_frontmatter(schema, meta), f"# {title}", "", *lead]).rstrip("\n") + "\n"
    if folder == "sources":
        return _source_page(meta, title, lead, sections)
    if folder == "entities":
        return _entity_or_concept(ENTITY, meta, title, lead, sections)
    if folder == "concepts":
        return _entity_or_concept(CONCEPT, meta, title, lead, sections)
    if rel.startswith("wiki/syntheses/weekly/"):
        return _weekly_page(meta, title, lead, sections, Path(rel).stem)
    return _rewrite_links(text, renames)


def _needs_migration(rel: str, meta: dict) -> bool:
    folder = rel.split("/")[1]
    if folder == "sources":
        return "resource_id" not in meta or "parsed_path" not in meta
    if folder in ("entities", "concepts"):
        return "last_updated" not in meta
    if rel.startswith("wiki/syntheses/weekly/"):
        return "week" not in meta
    return False


def _index(root: Path) -> str:
    """index.md built from the files: every page, by type."""
    groups = {"Sources": "sources", "Entities": "entities", "Concepts": "concepts", "Syntheses": "syntheses"}
    targets = [f.relative_to(root / "wiki").with_suffix("").as_posix() for f in wiki_page_files(root)]
    out = ["# Index", ""]
    for heading, folder in groups.items():
        out.append(f"## {heading}")
        out += [f"- [[{t}]]" for t in sorted(targets) if t.split("/", 1)[0] == folder]
        out.append("")
    return "\n".join(out)


def migrate_wiki(wiki: Wiki, today: str) -> MigrateResult:
    """Move the wiki to the specification's schemas in one commit
    `manual: migrate wiki to the specification's schema`. Raises
    MigrateError, with the wiki as before, when a rule would break."""
    with raw_files_lock(wiki.root()):
        before = wiki.begin_change()
        try:
            result = _migrate(wiki, before.sha, today)
        except BaseException:
            wiki.rollback(before.sha)
            raise
        finally:
            wiki.end_change()
    return result


def _migrate(wiki: Wiki, sha: str, today: str) -> MigrateResult:
    root = wiki.root()
    pages = {f.relative_to(root).as_posix(): f.read_text(encoding="utf-8") for f in wiki_page_files(root)}
    metas = {rel: split_frontmatter(text).data or {} for rel, text in pages.items()}
    todo = [rel for rel in pages if _needs_migration(rel, metas[rel])]
    if not todo:
        return MigrateResult(sha=None)
    renames: dict[str, str] = {}
    for rel in todo:
        target = rel.removeprefix("wiki/").removesuffix(".md")
        new = _new_target(target, metas[rel])
        if new != target:
            renames[target] = new
    taken: dict[str, str] = {}
    for old, new in renames.items():
        if new in taken or (f"wiki/{new}.md" in pages and new not in renames):
            raise MigrateError(f"wiki/{old}.md and {('wiki/' + taken[new] + '.md') if new in taken else 'a page'} "
                               f"would both be wiki/{new}.md: merge them or rename one by hand, then migrate")
        taken[new] = old
    result = MigrateResult(sha=None, renamed={f"wiki/{o}.md": f"wiki/{n}.md" for o, n in renames.items()})
    after: dict[str, str] = {}
    for rel, text in pages.items():
        target = rel.removeprefix("wiki/").removesuffix(".md")
        new_rel = f"wiki/{renames.get(target, target)}.md"
        new_text = _migrated(rel, text, renames) if rel in todo else _rewrite_links(text, renames)
        after[new_rel] = new_text
        if new_text != text or new_rel != rel:
            result.rewritten.append(new_rel)
    lost = lost_cited_claims(pages, after, renames)
    if lost:
        raise MigrateError(f"the migration would lose the cited claim {lost[0]['claim']!r} of {lost[0]['page']}; "
                           f"nothing was changed")
    for rel in pages:
        if rel not in after:
            inside_wiki(root, root / rel).unlink()
    for rel, text in after.items():
        write_wiki_file(root, root / rel, text.encode())
    write_wiki_file(root, root / "index.md", _index(root).encode())
    # kb's own earlier files; the owner's changes of them stay.
    gitignore = root / ".gitignore"
    if gitignore.is_file() and gitignore.read_text(encoding="utf-8") in EARLIER_GITIGNORES:
        write_wiki_file(root, gitignore, GITIGNORE.encode())
    playbook = root / "CLAUDE.md"
    if playbook.is_file() and hashlib.sha256(playbook.read_bytes()).hexdigest() in EARLIER_PLAYBOOK_SHA256:
        write_wiki_file(root, playbook, CLAUDE_MD.encode())
    append_log(root, f"{today} migrate", [f"{len(todo)} pages to the specification's schema, "
                                          f"{len(renames)} renamed, index.md built again"])
    # The parsed files that the source pages name go into git with the
    # migration: the ingests of the earlier format did not commit them.
    for rel, text in after.items():
        parsed = str((split_frontmatter(text).data or {}).get("parsed_path") or "") if rel.startswith("wiki/sources/") else ""
        if parsed.startswith("raw/parsed/") and ".." not in parsed.split("/") and (root / parsed).is_file() \
                and not wiki.tracked(parsed) and not wiki.ignored(parsed):
            wiki.git("add", "--", parsed)
    result.sha = wiki.commit_all(MIGRATE_MESSAGE)
    return result


def migration_summary(result: MigrateResult) -> str:
    if result.sha is None:
        return "The wiki has the specification's schema already: nothing to migrate."
    lines = [f"{MIGRATE_MESSAGE}: {result.sha[:10]}",
             f"{len(result.rewritten)} pages rewritten, {len(result.renamed)} renamed:"]
    lines += [f"  {old} -> {new}" for old, new in sorted(result.renamed.items())]
    return "\n".join(lines)

