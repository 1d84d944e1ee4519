"""An obedient wiki agent for the month (tests/month.py): a loopback
Messages API that reads kb's own prompt and does what it asks, through the
real Claude Code CLI.

It is the minimal agent of issue 55, part 3, until tests/obedient_agent.py
(issue 55, part 1) lands. Each workflow writes a valid change:
- ingest: the source page with the first paragraphs of the parsed file as
  cited claims (word for word, so the cited passage holds them), the link in
  index.md and one entry at the end of log.md;
- lint: the report page; each `unsupported` claim gets `(unsupported)` at
  the end of its line, as the lint prompt says;
- weekly synthesis: the week's page in the weekly schema, a reading list of
  the week's sources, the thin-week line when the prompt asks for it;
- topic synthesis: the topic's page, with links to the source pages that
  name the topic.

The server reads the wiki from the disk (it runs on the same machine as the
test), so it writes with the Write tool the whole new file: an index or a
log that it extends keeps every old line. `down` makes every request fail
as an overloaded endpoint does (HTTP 529), for the day of the outage.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path

from kb.wiki.agent import REPORT_TOOL_FULL_NAME
from kb.wiki.finish import index_with_link
from kb.wiki.schema import LINT_REPORT, TOPIC, WEEKLY, parsed_paragraphs, render_page
from tests.fake_anthropic import FakeAnthropic, report, text, tool_use, write
from tests.wiki_pages import source_page

CLAIMS_PER_SOURCE = 2
CLAIM_MAX_CHARS = 300


def _field(prompt: str, name: str) -> str:
    found = re.search(rf"^- {re.escape(name)}: (.*)$", prompt, re.M)
    return found.group(1).strip() if found else ""


def _data_block(prompt: str) -> dict:
    """The quoted source data of an ingest prompt (kb.wiki.prompt_data)."""
    for block in re.findall(r"```json\n(.*?)\n```", prompt, re.S):
        try:
            data = json.loads(block)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return {}


class ObedientAgent(FakeAnthropic):
    """Plays, for each conversation, the turns that kb's prompt asks for."""

    def __init__(self, wiki_root: Path) -> None:
        super().__init__(turns=[])
        self.wiki_root = Path(wiki_root)
        self.down = False
        self.failed_requests = 0
        self.tasks: Counter[str] = Counter()  # conversations started, by workflow
        self._plans: dict[str, list] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> "ObedientAgent":
        super().__enter__()
        handler = self.server.RequestHandlerClass
        agent = self
        answer_post = handler.do_POST

        def do_POST(request) -> None:
            if agent.down and request.path.split("?")[0] == "/v1/messages":
                length = int(request.headers.get("content-length") or 0)
                if length:
                    request.rfile.read(length)
                agent.failed_requests += 1
                body = json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                              "message": "Overloaded"}}).encode()
                request._send(529, body, "application/json")
                return
            answer_post(request)

        handler.do_POST = do_POST
        return self

    # --- the script of one conversation -------------------------------------------------
    def _answer(self, body: dict) -> list[dict] | None:
        if not any(t.get("name") == REPORT_TOOL_FULL_NAME for t in body.get("tools", [])):
            return [text("ok")]
        messages = body.get("messages", [])
        prompt = _text_of(messages[0]) if messages else ""
        turn_no = sum(1 for m in messages if m.get("role") == "assistant")
        with self._lock:
            plan = self._plans.get(prompt)
            if plan is None or turn_no == 0:
                plan = self._plans[prompt] = self._plan(prompt)
        return plan[turn_no] if turn_no < len(plan) else [text("Done.")]

    def _plan(self, prompt: str) -> list:
        if "Ingest one source into the wiki." in prompt:
            self.tasks["ingest"] += 1
            return self._ingest(prompt)
        if "Lint the wiki." in prompt:
            self.tasks["lint"] += 1
            return self._lint(prompt)
        if "Write the weekly synthesis for" in prompt:
            self.tasks["synthesis"] += 1
            return self._weekly(prompt)
        if "Write a synthesis about the topic" in prompt:
            self.tasks["topic"] += 1
            return self._topic(prompt)
        return [[text("I do not know this task.")]]

    def _read(self, relative: str) -> str:
        path = self.wiki_root / relative
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    def _appended(self, relative: str, lines: list[str]) -> str:
        old = self._read(relative)
        return old.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"

    def _with_index_link(self, section: str, link: str) -> str:
        # The agent writes index.md as kb's own finishing step does (one rule).
        return index_with_link(self._read("index.md"), section, link)

    def _ingest(self, prompt: str) -> list:
        parsed = re.search(r"The new source is at: (\S+)", prompt).group(1)
        page = re.search(r"Source page to make or update: (\S+)", prompt).group(1)
        slug = Path(page).stem
        data = _data_block(prompt)
        paragraphs = parsed_paragraphs(self._read(parsed))
        claims = []
        for number, paragraph in enumerate(paragraphs[:CLAIMS_PER_SOURCE], start=1):
            sentence = paragraph if len(paragraph) <= CLAIM_MAX_CHARS else paragraph[:CLAIM_MAX_CHARS].rsplit(" ", 1)[0]
            claims.append(f"- {sentence} [[sources/{slug}#para{number}]]")
        score = _field(prompt, "quality_score")
        content = source_page(
            slug, data.get("title") or slug, claims, resource_id=_field(prompt, "resource_id"),
            resource_type=data.get("resource_type") or Path(parsed).parent.name,
            tldr=(paragraphs[0][:200] if paragraphs else "A source."),
            extra={"source_url": data.get("source_url"), "ingested_at": _field(prompt, "ingested_at"),
                   "parsed_path": parsed, "topics": list(data.get("topics") or []),
                   "quality_score": int(score) if score.isdigit() else None})
        return [
            # The CLI's Write tool refuses to replace a file that the session has not read.
            [tool_use("Read", file_path=parsed), tool_use("Read", file_path="index.md"),
             tool_use("Read", file_path="log.md")],
            [write(page, content),
             write("index.md", self._with_index_link("Sources", f"sources/{slug}")),
             write("log.md", self._appended("log.md", [f"## ingest {slug}", f"- [[sources/{slug}]]"]))],
            [report(status="done", commit_message=f"ingest: {slug}", pages_created=[page],
                    pages_updated=["index.md", "log.md"], log_entry=f"## ingest {slug}",
                    summary="One source page.", warnings=[])],
            [text("Done.")],
        ]

    def _lint(self, prompt: str) -> list:
        day = re.search(r"The date is (\d{4}-\d{2}-\d{2})", prompt).group(1)
        findings = _data_block(prompt)
        writes, fixed = {}, []
        for finding in findings.get("unsupported", []):
            relative, line_no = finding["page"], int(finding["line"])
            content = writes.get(relative) or self._read(relative)
            lines = content.split("\n")
            if 0 < line_no <= len(lines) and not lines[line_no - 1].rstrip().endswith("(unsupported)"):
                lines[line_no - 1] = lines[line_no - 1].rstrip() + " (unsupported)"
                writes[relative] = "\n".join(lines)
                fixed.append(f"- unsupported: marked {relative}:{line_no}")
        # Orphans: "link orphan pages from related pages" (the playbook's
        # lint, step 1): each orphan source page from the Connections of
        # another source page.
        orphans = [f["page"] for f in findings.get("orphans", [])]
        others = sorted(str(p.relative_to(self.wiki_root).as_posix())
                        for p in (self.wiki_root / "wiki" / "sources").glob("*.md"))
        for orphan in orphans:
            host = next((p for p in others if p != orphan), None)
            if host is None:
                continue
            content = writes.get(host) or self._read(host)
            link = f"- [[{Path(orphan).relative_to('wiki').with_suffix('').as_posix()}]]"
            lines = content.split("\n")
            if link in lines or "## Connections" not in lines:
                continue
            lines.insert(lines.index("## Connections") + 1, link)
            writes[host] = "\n".join(lines)
            fixed.append(f"- orphan: linked {orphan} from {host}")
        counts = [f"- {kind}: {len(items)}" for kind, items in findings.items() if items]
        report_path = f"wiki/syntheses/lint/{day}.md"
        report_page = render_page(LINT_REPORT, {"type": "synthesis", "kind": "lint", "period": day,
                                                "created": day, "sources": []},
                                  f"Lint {day}", {"Findings": counts or ["- none"],
                                                  "Fixes": fixed or ["- none"]})
        writes[report_path] = report_page
        return [
            [tool_use("Read", file_path=path) for path in ["index.md", *writes] if (self.wiki_root / path).is_file()],
            [write(path, content) for path, content in writes.items()],
            [report(status="done", commit_message=f"lint: {day}", pages_created=[report_path],
                    pages_updated=sorted(p for p in writes if p != report_path), log_entry="",
                    summary=f"Lint of {day}.", warnings=[])],
            [text("Done.")],
        ]

    def _weekly(self, prompt: str) -> list:
        label = re.search(r"Write the weekly synthesis for (\S+)\.", prompt).group(1)
        slugs = re.findall(r"^- \[\[sources/([^\]]+)\]\]$", prompt, re.M)
        thin = re.search(r"must be `(Thin week: only \d+ new sources\.)`", prompt)
        theme = "Sources of the week"
        values = {"type": "synthesis", "kind": "weekly", "week": label, "source_count": len(slugs),
                  "themes": [theme.lower()]}
        content = render_page(WEEKLY, values, f"Weekly Synthesis · {label} · {theme}", {
            "Theme of the week": [thin.group(1) if thin else f"{len(slugs)} sources."],
            theme: [f"- [[sources/{slug}]] is one of the sources of the week." for slug in slugs],
            "Open questions": ["- none"],
            "Reading list": [f"- [[sources/{slug}]]: read it for its claims." for slug in slugs]})
        page = f"wiki/syntheses/weekly/{label}.md"
        return [
            [tool_use("Read", file_path=f"wiki/sources/{slug}.md") for slug in slugs[:3]] or [text("No reads.")],
            [write(page, content)],
            [report(status="done", commit_message=f"synthesis: weekly {label}", pages_created=[page],
                    pages_updated=[], log_entry="", summary=f"The week {label}.", warnings=[])],
            [text("Done.")],
        ]

    def _topic(self, prompt: str) -> list:
        topic = re.search(r"about the topic `([^`]+)`", prompt).group(1)
        today = re.search(r"The date is (\d{4}-\d{2}-\d{2})", prompt).group(1)
        words = topic.replace("-", " ")
        pages = sorted(p.relative_to(self.wiki_root / "wiki").with_suffix("").as_posix()
                       for p in (self.wiki_root / "wiki" / "sources").glob("*.md")
                       if words in p.read_text(encoding="utf-8").lower())
        content = render_page(TOPIC, {"type": "synthesis", "kind": "topic", "period": topic, "created": today,
                                      "sources": []},
                              words.capitalize(), {"Related": [f"- [[{p}]]" for p in pages] or ["- none"]})
        path = f"wiki/syntheses/topics/{topic}.md"
        return [
            [tool_use("Grep", pattern=words, path="wiki"), tool_use("Glob", pattern="wiki/**/*.md")],
            [write(path, content)],
            [report(status="done", commit_message=f"synthesis: topic {topic}", pages_created=[path],
                    pages_updated=[], log_entry="", summary=f"Topic {topic}.", warnings=[])],
            [text("Done.")],
        ]


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")

