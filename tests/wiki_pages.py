"""Pages in the wiki's schemas (kb.wiki.schema), for the tests' wikis and
the scripted agents of tests/fake_anthropic.py. The tests build their pages
here, so that they follow the one definition of each schema."""

from __future__ import annotations

from kb.wiki.schema import CONCEPT, ENTITY, SOURCE, WEEKLY, parsed_body, parsed_frontmatter, render_page
from kb.telegram.source_parsers import render_markdown


def parsed_file(resource_id: str, title: str, paragraphs: list[str], resource_type: str = "web",
                url: str | None = None) -> str:
    """A parsed file (specification 5.2): frontmatter, `# Title`, paragraphs."""
    body = "\n\n".join(paragraphs)
    meta = parsed_frontmatter(resource_id=resource_id, resource_type=resource_type, source_url=url, title=title,
                              fetched_at="2026-11-20T09:00:00+00:00", char_count=len(body), parser=resource_type)
    return render_markdown(meta, parsed_body(title, body))


def source_page(slug: str, title: str, claims: list[str], *, resource_id: str | None = None,
                resource_type: str = "web", connections: list[str] = (), extra: dict | None = None,
                tldr: str = "One source.", more: dict[str, list[str]] | None = None) -> str:
    values = {"resource_id": resource_id or slug[:8] + "00", "resource_type": resource_type, "source_url": None,
              "title": title, "ingested_at": "2026-11-20T09:00:00+00:00",
              "parsed_path": f"raw/parsed/{resource_type}/{slug}.md", "quality_score": 70, "topics": [],
              **(extra or {})}
    return render_page(SOURCE, values, title, {"TL;DR": [tldr], "Key claims": list(claims),
                                                "Connections": list(connections), **(more or {})})


def entity_page(name: str, overview: str, roles: list[str], *, sources: list[str] = (),
                connections: list[str] = (), extra: dict | None = None, more: dict[str, list[str]] | None = None) -> str:
    values = {"type": "entity", "created": "2026-11-20", "last_updated": "2026-11-20", "sources": list(sources),
              "name": name, "kind": "person", **(extra or {})}
    return render_page(ENTITY, values, name, {"Overview": [overview], "Roles and affiliations": list(roles),
                                              "Connections": list(connections), **(more or {})})


def concept_page(name: str, definition: str, claims: list[str], *, sources: list[str] = (),
                 connections: list[str] = (), extra: dict | None = None, more: dict[str, list[str]] | None = None) -> str:
    values = {"type": "concept", "created": "2026-11-20", "last_updated": "2026-11-20", "sources": list(sources),
              "name": name, **(extra or {})}
    return render_page(CONCEPT, values, name, {"Definition": [definition], "Key claims": list(claims),
                                               "Connections": list(connections), **(more or {})})


def weekly_page(week: str, sources: list[str], theme: str, body: list[str], reading: list[str] = ()) -> str:
    values = {"type": "synthesis", "kind": "weekly", "week": week, "source_count": len(sources),
              "themes": [theme.lower()]}
    sections = {"Theme of the week": [theme + "."], theme: list(body), "Open questions": ["- none"]}
    if reading:
        sections["Reading list"] = list(reading)
    return render_page(WEEKLY, values, f"Weekly Synthesis · {week} · {theme}", sections)
