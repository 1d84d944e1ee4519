"""The one definition of the wiki's formats: page schemas, file names,
parsed files and commit prefixes.

The owner's specification (sections 3.3, 3.4, 5.2 and 6.2) gives these
formats. The playbook (kb/wiki/playbook.py) prints them for the agent, the
checks (kb/wiki/checks.py) test pages against them, the agent's allowlist
(kb/wiki/repo.py) refuses a new page with a wrong name, the parsers write
the parsed files with them, and the tests build their pages from them.
Change a format here, and all of them follow.

kb's own keys and sections come after the specification's own, so that a
page in the specification's schema is a page of kb, and a page of kb reads
as one of the specification. docs/wiki.md says where kb differs and why.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass

import yaml

from kb.wiki_files import split_frontmatter

# The line that separates the owner's text (above) from the part that the
# agent maintains (below) on entity and concept pages (specification 6.2, 6.4).
AUTO_SECTION_MARKER = "<!-- llm:auto-section -->"
# The mark of a cited claim that a later source contradicts. A claim never
# goes away; it gets this mark (specification 6.4).
DISPUTED_MARK = "(disputed)"
# The mark of a cited claim that no passage of its cited source holds (the
# lint's `unsupported` finding). The claim stays; the checks skip it.
UNSUPPORTED_MARK = "(unsupported)"
# The marks that the playbook asks for, at the end of a line: a claim with a
# mark is the same claim (kb.wiki.change_rules).
CLAIM_MARKS = (DISPUTED_MARK, UNSUPPORTED_MARK)
# The first words of the warning of a change that changed no file
# (kb/wiki/change.py): the owner's notice says "nothing new" for it
# (kb/telegram/notifier.py).
NOTHING_NEW = "nothing new"

# Commit prefixes (specification 3.4). kb verifies that each commit of the
# agent starts with the prefix of its task.
INGEST_PREFIX = "ingest:"
LINT_PREFIX = "lint:"
SYNTHESIS_PREFIX = "synthesis:"
MANUAL_PREFIX = "manual:"
GIT_PREFIXES = (INGEST_PREFIX, LINT_PREFIX, SYNTHESIS_PREFIX, MANUAL_PREFIX)
MIGRATE_MESSAGE = "manual: migrate wiki to the specification's schema"

# File names (specification 3.3).
ID_PREFIX_CHARS = 8
NAME_MAX_CHARS = 60  # without ".md"
RESOURCE_TYPES = ("web", "pdf", "youtube", "text", "voice", "md")


@dataclass(frozen=True)
class PageSchema:
    """The frontmatter keys and the `## ` sections of one kind of page."""

    kind: str  # source, entity, concept, synthesis
    folder: str  # the folder under wiki/
    type: str | None  # the value of the `type` key; None: the specification has no such key
    keys: tuple[str, ...]  # the specification's keys, in its order
    extra_keys: tuple[str, ...]  # kb's own keys, after them; optional
    sections: tuple[str, ...]  # the specification's sections above the marker, in order
    optional_sections: tuple[str, ...]  # of `sections`: a page may leave these out
    auto_sections: tuple[str, ...]  # the specification's sections below the marker
    extra_sections: tuple[str, ...]  # kb's own sections, at the end of the page
    uncited_sections: tuple[str, ...]  # sections whose lines need no citation
    marker: bool  # the page carries AUTO_SECTION_MARKER

    @property
    def all_keys(self) -> tuple[str, ...]:
        return self.keys + self.extra_keys

    @property
    def required_sections(self) -> tuple[str, ...]:
        return tuple(s for s in self.sections + self.auto_sections if s not in self.optional_sections)


# Sections that list links or questions, not facts: no citation needed.
_LINK_SECTIONS = ("Connections", "Mentioned in syntheses", "Related", "Mentions", "Reading list")

SOURCE = PageSchema(
    kind="source", folder="sources", type=None,
    keys=("resource_id", "resource_type", "source_url", "title", "ingested_at", "parsed_path",
          "quality_score", "topics"),
    # type: kb reads a page's kind from it; superseded_by: a later parse of
    # the same source (the old one is never deleted).
    extra_keys=("type", "superseded_by"),
    sections=("TL;DR", "Key claims", "Notable details", "Connections"),
    optional_sections=("Notable details",),
    auto_sections=(),
    # Passages: short quotes of the cited paragraphs, so that a reader sees
    # the words that a claim rests on without the parsed file.
    extra_sections=("Passages", "Mentioned in syntheses"),
    uncited_sections=("TL;DR", "Notable details", "Passages") + _LINK_SECTIONS,
    marker=False,
)
ENTITY = PageSchema(
    kind="entity", folder="entities", type="entity",
    keys=("type", "created", "last_updated", "sources"),
    # name: the name with its spaces; kind: person, organization ...;
    # aliases: other names (the duplicate check reads them); redirect: a
    # page merged into another.
    extra_keys=("name", "kind", "aliases", "redirect"),
    sections=("Overview", "Roles and affiliations"),
    optional_sections=(),
    auto_sections=("Connections",),
    extra_sections=("Contradictions", "Mentioned in syntheses"),
    uncited_sections=("Open questions",) + _LINK_SECTIONS,
    marker=True,
)
CONCEPT = PageSchema(
    kind="concept", folder="concepts", type="concept",
    keys=("type", "created", "last_updated", "sources"),
    extra_keys=("name", "aliases", "redirect"),
    sections=("Definition", "Key claims", "Open questions"),
    optional_sections=("Open questions",),
    auto_sections=("Connections",),
    extra_sections=("Contradictions", "Mentioned in syntheses"),
    uncited_sections=("Open questions",) + _LINK_SECTIONS,
    marker=True,
)
WEEKLY = PageSchema(
    kind="synthesis", folder="syntheses/weekly", type="synthesis",
    keys=("type", "kind", "week", "source_count", "themes"),
    extra_keys=("created",),
    # One more section per theme goes between these two; the checks do not
    # know the theme names.
    sections=("Theme of the week", "Open questions", "Reading list"),
    optional_sections=(),
    auto_sections=(),
    extra_sections=(),
    uncited_sections=("Theme of the week", "Open questions") + _LINK_SECTIONS,
    marker=False,
)
# The specification names lint digests and topic syntheses, and gives them
# no schema: these are kb's.
LINT_REPORT = PageSchema(
    kind="synthesis", folder="syntheses/lint", type="synthesis",
    keys=("type", "kind", "period", "created"), extra_keys=("sources",),
    sections=(), optional_sections=(), auto_sections=(), extra_sections=(),
    uncited_sections=(), marker=False,
)
TOPIC = PageSchema(
    kind="synthesis", folder="syntheses/topics", type="synthesis",
    keys=("type", "kind", "period", "created"), extra_keys=("sources",),
    sections=(), optional_sections=(), auto_sections=(), extra_sections=(),
    uncited_sections=("Open questions",) + _LINK_SECTIONS, marker=False,
)
SCHEMAS = (SOURCE, ENTITY, CONCEPT, WEEKLY, LINT_REPORT, TOPIC)
SYNTHESIS_KINDS = {"syntheses/weekly": "weekly", "syntheses/lint": "lint", "syntheses/topics": "topic"}
ENTITY_KINDS = ("person", "organization", "product", "place", "work", "other")


def schema_for(relative: str) -> PageSchema | None:
    """The schema of the page at `relative` (a path under wiki/, such as
    `entities/Ada-Lovelace.md`), or None for a path in no known folder."""
    folder = relative.rsplit("/", 1)[0] if "/" in relative else ""
    for schema in SCHEMAS:
        if folder == schema.folder:
            return schema
    return None


# --- file names ------------------------------------------------------------------------


def kebab(text: str, max_chars: int = NAME_MAX_CHARS) -> str:
    """Lower case ASCII words joined by hyphens, cut at a hyphen to at most
    max_chars: "Great Article!" -> "great-article"."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return slug[:max_chars].rstrip("-")


def source_slug(resource_id: str, title: str) -> str:
    """The name of a parsed file and of its source page, without `.md`:
    `<first 8 of the id>-<kebab title>`, at most 60 characters."""
    prefix = re.sub(r"[^a-z0-9]", "", resource_id.lower())[:ID_PREFIX_CHARS]
    if len(prefix) < ID_PREFIX_CHARS:
        raise ValueError(f"resource id {resource_id!r}: it needs {ID_PREFIX_CHARS} letters or digits for a file name")
    title_part = kebab(title, NAME_MAX_CHARS - ID_PREFIX_CHARS - 1)
    return f"{prefix}-{title_part}" if title_part else prefix


def entity_name(name: str) -> str:
    """The file name of an entity page, without `.md`: Title-Case-With-Hyphens.
    "Andrej Karpathy" -> "Andrej-Karpathy". Words that have capitals keep
    them ("OpenAI", "DuckDB")."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    words = [w for w in re.split(r"[^A-Za-z0-9]+", folded) if w]
    return "-".join(w if any(c.isupper() for c in w) else w[:1].upper() + w[1:] for w in words)[:NAME_MAX_CHARS]


def concept_name(name: str) -> str:
    """The file name of a concept page, without `.md`: lowercase-kebab-case."""
    return kebab(name)


SOURCE_NAME = re.compile(r"^[a-z0-9]{8}(-[a-z0-9]+)*$")
ENTITY_NAME = re.compile(r"^[A-Z0-9][A-Za-z0-9]*(-[A-Z0-9][A-Za-z0-9]*)*$")
CONCEPT_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
WEEK_NAME = re.compile(r"^\d{4}-W\d{2}$")
DAY_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_NAME_RULES = {
    "sources": (SOURCE_NAME, "<first 8 of the id>-<kebab-title>, for example 0193f7a8-great-article.md"),
    "entities": (ENTITY_NAME, "Title-Case-With-Hyphens, for example Andrej-Karpathy.md"),
    "concepts": (CONCEPT_NAME, "lowercase-kebab-case, for example mixture-of-experts.md"),
    "syntheses/weekly": (WEEK_NAME, "YYYY-Www, for example 2026-W48.md"),
    "syntheses/lint": (DAY_NAME, "YYYY-MM-DD, for example 2026-11-29.md"),
    "syntheses/topics": (CONCEPT_NAME, "lowercase-kebab-case, for example vector-search.md"),
}


def new_page_problem(relative: str) -> str | None:
    """None when the agent may make a new page at `relative` (a path under
    wiki/, with `.md`): in one of the specification's folders itself, not
    in a folder below it, and with a name of its rule (name_problem). A
    folder below had no rule, so any name passed there ("-- --force <img>.md")."""
    folder = relative.rpartition("/")[0]
    if folder not in _NAME_RULES:
        return f"wiki/{relative}: a new page goes into {', '.join(f'wiki/{f}/' for f in _NAME_RULES)} itself"
    return name_problem(relative)


def name_problem(relative: str) -> str | None:
    """None when a page at `relative` (a path under wiki/, with `.md`) has a
    name of the specification (3.3), else the rule that it breaks."""
    folder, _, file_name = relative.rpartition("/")
    rule = _NAME_RULES.get(folder)
    if rule is None:
        return None
    stem = file_name.removesuffix(".md")
    pattern, example = rule
    if not pattern.match(stem) or len(stem) > NAME_MAX_CHARS:
        return f"wiki/{relative}: a name in {folder}/ is {example} (at most {NAME_MAX_CHARS} characters)"
    return None


# --- parsed files (specification 5.2) -----------------------------------------------------

PARSED_KEYS = ("resource_id", "resource_type", "source_url", "title", "fetched_at", "char_count", "parser")
# kb's own keys of a parsed file come after these: what a parser knows more
# (channel, pages, language), `supersedes` (the earlier parse that this one
# replaces) and `superseded_by` (the later parse that replaces this one).


def parsed_frontmatter(*, resource_id: str, resource_type: str, source_url: str | None, title: str,
                       fetched_at: str, char_count: int, parser: str, extra: dict | None = None) -> dict:
    """The frontmatter of a parsed file, the specification's keys first."""
    if resource_type not in RESOURCE_TYPES:
        raise ValueError(f"resource type {resource_type!r} is not one of {', '.join(RESOURCE_TYPES)}")
    values = dict(zip(PARSED_KEYS, (resource_id, resource_type, source_url, title, fetched_at, char_count, parser)))
    return {**values, **{k: v for k, v in (extra or {}).items() if k not in values}}


def parsed_body(title: str, body: str) -> str:
    """The body of a parsed file: `# Title`, then the text. A body that
    starts with its title as a heading keeps it once."""
    text = body.strip("\n")
    heading = f"# {title.strip()}"
    if text.splitlines()[:1] == [heading]:
        return text + "\n"
    return f"{heading}\n\n{text}\n"


def parsed_paragraphs(text: str) -> list[str]:
    """The paragraphs of a parsed file, as `[[sources/<slug>#paraN]]` counts
    them from 1: the blocks of text between empty lines after the
    frontmatter, each on one line. The `# Title` line that opens the body is
    not a paragraph: it is the name of the file, not the source's text."""
    lines = split_frontmatter(text).body
    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if start < len(lines) and lines[start].startswith("# "):
        lines = lines[start + 1:]
    return [" ".join(block.split()) for block in "\n".join(lines).split("\n\n") if block.strip()]


# --- pages -------------------------------------------------------------------------------


def yaml_value(value) -> str:
    """A value as kb writes it in a frontmatter line."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    return _yaml_scalar(value)


def _yaml_scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    # Plain only when YAML reads the same string back ("12:30", "0x10",
    # "on" read back as 750, 16, True), or for an ISO date, which the
    # specification writes plain. Else a JSON string: valid YAML, any text.
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._/:+-]*", text) and (ISO_DATE.fullmatch(text) or _reads_back(text)):
        return text
    return json.dumps(text, ensure_ascii=False)


ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?([+-]\d{2}:\d{2}|Z)?)?")


def _reads_back(text: str) -> bool:
    try:
        return yaml.safe_load(f"k: {text}") == {"k": text}
    except yaml.YAMLError:
        return False


def render_frontmatter(schema: PageSchema, values: dict) -> str:
    """The frontmatter block of a page: the schema's keys in their order
    (a missing key of the specification is written empty), then kb's keys
    that have a value, then any other key of `values` (kept, not lost)."""
    lines = ["---"]
    known = schema.all_keys
    for key in schema.keys:
        lines.append(f"{key}: {yaml_value(values.get(key))}" if values.get(key) is not None else f"{key}:")
    for key in schema.extra_keys:
        if values.get(key) not in (None, "", [], ()):
            lines.append(f"{key}: {yaml_value(values[key])}")
    for key, value in values.items():
        if key not in known and value not in (None, ""):
            lines.append(f"{key}: {yaml_value(value)}")
    lines.append("---")
    return "\n".join(lines)


def render_page(schema: PageSchema, values: dict, title: str, sections: dict[str, list[str]]) -> str:
    """A whole page: frontmatter, `# title`, then each section of the
    schema in its order (the marker before the auto sections), then the
    other sections of `sections` in their order (themes of a weekly page
    after its first section, kb's own sections last)."""
    out = [render_frontmatter(schema, values), f"# {title}", ""]
    spec_sections = schema.sections + schema.auto_sections
    others = [name for name in sections if name not in spec_sections and name not in schema.extra_sections]

    def add(name: str) -> None:
        if name not in sections and name in schema.optional_sections:
            return
        out.extend([f"## {name}", *sections.get(name, []), ""])

    for position, name in enumerate(schema.sections):
        add(name)
        if position == 0 and schema is WEEKLY:
            for other in others:
                add(other)
            others = []
    if schema.marker:
        out.extend([AUTO_SECTION_MARKER])
    for name in schema.auto_sections:
        add(name)
    for name in others + [n for n in schema.extra_sections if n in sections]:
        add(name)
    return "\n".join(out).rstrip("\n") + "\n"


def with_frontmatter_key(text: str, key: str, value: str) -> str:
    """The text with `key: value` added as the last line of its frontmatter;
    the text as it is when the key is there or it has no frontmatter. Every
    other byte stays: kb marks a file superseded this way, and a parsed
    file changes in no other way after its ingest."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return text
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            if any(line.startswith(f"{key}:") for line in lines[1:end]):
                return text
            return "\n".join(lines[:end] + [f"{key}: {_yaml_scalar(value)}"] + lines[end:])
    return text


def only_key_added(old: str, new: str, key: str) -> bool:
    """True when `new` is `old` with one frontmatter line `key: ...` added."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    added = [i for i, line in enumerate(new_lines) if line.startswith(f"{key}:")]
    return len(added) == 1 and new_lines[:added[0]] + new_lines[added[0] + 1:] == old_lines \
        and not any(line.startswith(f"{key}:") for line in old_lines)
