"""A loopback stand-in for the Anthropic Messages API, for the wiki agent tests.

The real claude-agent-sdk starts its bundled Claude Code CLI, and the CLI
talks to ANTHROPIC_BASE_URL. This server speaks the same HTTP protocol:
`POST /v1/messages` with `"stream": true` answered as server-sent events
(message_start, content_block_*, message_delta, message_stop), the
non-streaming JSON form, and `POST /v1/messages/count_tokens`.

What the CLI 2.1.x sends, as seen in this server's log: one streaming
`POST /v1/messages?beta=true` per model turn, with `Authorization: Bearer
<ANTHROPIC_AUTH_TOKEN>`, the tools, and the whole conversation so far. With
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 it sends nothing else. Any other
request is answered 404 and kept in `unknown`, so a new CLI that calls a new
endpoint shows up in the test output instead of as a hang.

The server plays a script. Turn N of the script answers the request whose
conversation holds N assistant messages, so a retried request gets the same
answer and the script does not drift.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kb.wiki.agent import REPORT_TOOL_FULL_NAME
from tests.loopback import LoopbackServer, QuietHandler
from tests.wiki_pages import source_page


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def tool_use(name: str, **tool_input: Any) -> dict:
    return {"type": "tool_use", "name": name, "input": tool_input}


def bash(command: str) -> dict:
    return tool_use("Bash", command=command, description="run " + command.split()[0])


def write(path: str, content: str) -> dict:
    return tool_use("Write", file_path=path, content=content)


def report(**fields: Any) -> dict:
    return tool_use(REPORT_TOOL_FULL_NAME, **fields)


@dataclass
class Stall:
    """A turn that waits this many seconds before it answers (for timeouts)."""

    seconds: float


@dataclass
class FakeAnthropic(LoopbackServer):
    """Plays `turns`; each turn is a list of content blocks or a Stall."""

    turns: list[list[dict] | Stall] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __enter__(self) -> "FakeAnthropic":
        fake = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake.unknown.append(f"GET {self.path}")
                self._send(404, b"{}", "application/json")

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                if path == "/v1/messages/count_tokens":
                    self._send(200, json.dumps({"input_tokens": 1000}).encode(), "application/json")
                    return
                if path != "/v1/messages":
                    fake.unknown.append(f"POST {self.path}")
                    self._send(404, b"{}", "application/json")
                    return
                body = json.loads(raw)
                body["_authorization"] = self.headers.get("authorization", "")
                fake.requests.append(body)
                blocks = fake._answer(body)
                if blocks is None:  # a stall that outlived the client: nothing to send
                    return
                message = fake._message(body.get("model", ""), blocks)
                if body.get("stream"):
                    self._send(200, _sse(message), "text/event-stream")
                else:
                    self._send(200, json.dumps(message).encode(), "application/json")

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                try:
                    self.send_body(status, data, content_type)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a timeout test killed it)

        self.bind(Handler)
        return super().__enter__()

    # --- the script --------------------------------------------------------

    def _answer(self, body: dict) -> list[dict] | None:
        if not any(t.get("name") == REPORT_TOOL_FULL_NAME for t in body.get("tools", [])):
            # Not the agent's own conversation (a helper request of the CLI).
            self.unknown.append("POST /v1/messages without the agent tools")
            return [text("ok")]
        turn_no = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if turn_no >= len(self.turns):
            return [text("Nothing more to do.")]
        turn = self.turns[turn_no]
        if isinstance(turn, Stall):
            time.sleep(turn.seconds)
            return None
        return turn

    def _message(self, model: str, blocks: list[dict]) -> dict:
        content = []
        for block in blocks:
            if block["type"] == "tool_use":
                block = {**block, "id": block.get("id") or f"toolu_{next(self._ids):04d}"}
            content.append(block)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        return {
            "id": f"msg_{next(self._ids):04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 20},
        }

    # --- what the tests read -------------------------------------------------

    def tool_results(self) -> list[dict]:
        """Every tool_result block that the CLI sent back, in order."""
        results = []
        for body in self.requests:
            last = body.get("messages", [])[-1:] or []
            for message in last:
                content = message.get("content")
                if isinstance(content, list):
                    results += [b for b in content if b.get("type") == "tool_result"]
        return results

    def first_prompt_text(self) -> str:
        """All text of the first user message of the first request."""
        first = self.requests[0]["messages"][0]["content"]
        if isinstance(first, str):
            return first
        return "\n".join(b.get("text", "") for b in first if b.get("type") == "text")


class HeldAnthropic(FakeAnthropic):
    """The fake Messages API; it holds turn `hold_turn` until `release` is
    set (at most `wait_s`), so a test can act while the CLI waits."""

    def __init__(self, turns: list, hold_turn: int, wait_s: float = 300) -> None:
        super().__init__(turns=turns)
        self.hold_turn = hold_turn
        self.wait_s = wait_s
        self.arrived = threading.Event()
        self.release = threading.Event()

    def _answer(self, body: dict):
        if any(t.get("name") == REPORT_TOOL_FULL_NAME for t in body.get("tools", [])):
            if sum(1 for m in body.get("messages", []) if m.get("role") == "assistant") == self.hold_turn:
                self.arrived.set()
                self.release.wait(self.wait_s)
        return super()._answer(body)


def ingest_turns(slug: str) -> list:
    """A good ingest: read, write the source page, report. kb commits."""
    return [
        [tool_use("Read", file_path="index.md"), tool_use("Read", file_path="log.md")],
        [write(f"wiki/sources/{slug}.md", source_page(slug, slug, [])),
         tool_use("Edit", file_path="index.md", old_string="## Sources\n", new_string=f"## Sources\n- [[sources/{slug}]]\n"),
         tool_use("Edit", file_path="log.md", old_string="newest last.\n",
                  new_string=f"newest last.\n\n## ingest {slug}\n")],
        [report(status="done", commit_message=f"ingest: {slug}", pages_created=[f"wiki/sources/{slug}.md"],
                pages_updated=["index.md", "log.md"], log_entry=f"## ingest {slug}", summary="One source page.",
                warnings=[])],
        [text("Done.")],
    ]


def result_text(block: dict) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "\n".join(c.get("text", "") for c in content if isinstance(c, dict))
    return str(content or "")


def _sse(message: dict) -> bytes:
    """The message as the event stream of the Messages API."""
    events: list[dict] = [
        {"type": "message_start",
         "message": {**message, "content": [], "stop_reason": None,
                     "usage": {"input_tokens": 100, "output_tokens": 1}}},
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append({"type": "content_block_start", "index": index,
                           "content_block": {"type": "text", "text": ""}})
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "text_delta", "text": block["text"]}})
        else:
            events.append({"type": "content_block_start", "index": index,
                           "content_block": {"type": "tool_use", "id": block["id"],
                                             "name": block["name"], "input": {}}})
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta",
                                     "partial_json": json.dumps(block["input"])}})
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta",
                   "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                   "usage": {"output_tokens": 20}})
    events.append({"type": "message_stop"})
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
