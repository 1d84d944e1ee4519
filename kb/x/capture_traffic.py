"""The X web client's GraphQL traffic, as a capture sees it: the timelines
that it scrolls, the requests and answers of one operation, the cursors in
request addresses, and the waits that X asks for after HTTP 429.

No Dagster here: the asset x_raw_pages (kb_assets/x/raw_pages.py) calls
kb/x/capture_run.py, which uses this module through kb/x/capture.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from playwright.sync_api import Request, Response

from kb.x.browser import XContext
from kb.x.graphql import BOOKMARKS, FOLDER_TIMELINE, is_bookmarks_response, operation_name
from kb.x.raw_store import RawStore

BOOKMARKS_PATH = "/i/bookmarks"
POLL_MS = 50
# The back-off after a 429 that names no wait: doubles each time, up to the limit.
FIRST_BACKOFF_S = 15.0
MAX_BACKOFF_S = 300.0


class CaptureCutOff(RuntimeError):
    """The capture stopped before it met the watermark or the end."""


def request_cursor(url: str) -> str | None:
    """The `cursor` in the `variables` JSON of a GraphQL GET URL, or None."""
    cursor = request_variables(url).get("cursor")
    return cursor if isinstance(cursor, str) else None


def with_cursor(url: str, cursor: str) -> str:
    """The GraphQL GET URL with `cursor` set in its `variables` JSON."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    variables = json.loads(query.get("variables", ["{}"])[0])
    variables["cursor"] = cursor
    query["variables"] = [json.dumps(variables, separators=(",", ":"))]
    return urlunsplit(parts._replace(query=urlencode(query, doseq=True)))


def rate_limit_wait(headers: dict[str, str], backoff_s: float, now: float | None = None) -> float:
    """Seconds to wait after a 429: retry-after (seconds or an HTTP date),
    else x-rate-limit-reset (epoch seconds, as X sends), else the back-off."""
    now = time.time() if now is None else now
    value = headers.get("retry-after", "").strip()
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, parsedate_to_datetime(value).timestamp() - now)
            except (TypeError, ValueError):
                pass
    reset = headers.get("x-rate-limit-reset", "").strip()
    if reset:
        try:
            return max(0.0, float(reset) - now)
        except ValueError:
            pass
    return backoff_s


class RateLimited(Exception):
    """X answered HTTP 429 for a page of a timeline."""

    def __init__(self, wait_s: float, number: int, label: str = BOOKMARKS) -> None:
        super().__init__(f"X answered HTTP 429 (rate limit) for {label} page {number}")
        self.wait_s = wait_s
        self.number = number


class WaitBudgetSpent(CaptureCutOff):
    """X asks for a longer wait than KB_CAPTURE_MAX_WAIT_S leaves."""


def check_wait_budget(limit: RateLimited, waits: list[float], max_wait_s: float, *, then: str) -> None:
    """WaitBudgetSpent when the wait that X asks for would pass the budget."""
    waited = sum(waits)
    if waited + limit.wait_s > max_wait_s:
        raise WaitBudgetSpent(
            f"{limit} and asks to wait {limit.wait_s:.0f} s; this capture has waited {waited:.0f} s of "
            f"KB_CAPTURE_MAX_WAIT_S={max_wait_s:g}. {then}")


def sleep_for(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def close_pages(x: XContext) -> None:
    """Close every page of the context: a page that stays open goes on asking X."""
    for page in list(x.context.pages):
        page.close()


def request_variables(url: str) -> dict:
    """The `variables` JSON of a GraphQL GET URL ({} when it has none)."""
    values = parse_qs(urlsplit(url).query).get("variables")
    try:
        variables = json.loads(values[0]) if values else {}
    except ValueError:
        return {}
    return variables if isinstance(variables, dict) else {}


@dataclass(eq=False)  # not frozen: Playwright keeps a note on the object of a bound-method handler
class Timeline:
    """One timeline of the X web client that a capture scrolls: the page
    that asks for it, the operation of its answers, and their file names."""

    path: str
    operation: str
    folder_id: str | None = None

    @property
    def label(self) -> str:
        """How messages name its pages: "Bookmarks page 3"."""
        return self.operation if self.folder_id is None else f"{self.operation} (folder {self.folder_id})"

    def matches(self, url: str) -> bool:
        # The query ID in the URL changes with each X deploy: match the operation name only.
        return is_bookmarks_response(url) if self.operation == BOOKMARKS else operation_name(url) == self.operation

    def write(self, raw_store: RawStore, batch: str, number: int, body: bytes) -> Path:
        if self.folder_id is None:
            return raw_store.write_page(batch, number, body)
        return raw_store.write_answer(batch, f"folder-{self.folder_id}-{number:04d}.json", body)


BOOKMARKS_TIMELINE = Timeline(BOOKMARKS_PATH, BOOKMARKS)


def folder_timeline(folder_id: str) -> Timeline:
    return Timeline(f"{BOOKMARKS_PATH}/{folder_id}", FOLDER_TIMELINE, folder_id)


class BookmarksTraffic:
    """Event handlers for the GraphQL traffic of one operation in a context
    (Bookmarks unless told otherwise).

    The handlers ONLY append. Hard-won fact: to read a response body inside
    a Playwright event handler deadlocks or races the sync API, so the
    capture loop reads bodies later, in the main flow."""

    def __init__(self, timeline: Timeline = BOOKMARKS_TIMELINE) -> None:
        self.timeline = timeline
        self.requests: list[tuple[float, Request]] = []
        self.responses: list[Response] = []
        self.failures: list[Request] = []
        self.finished: list[Request] = []
        self._attached: XContext | None = None

    def wanted(self, request: Request) -> bool:
        # OPTIONS is a CORS preflight, not a page.
        return request.method != "OPTIONS" and self.timeline.matches(request.url)

    def on_request(self, request: Request) -> None:
        if self.wanted(request):
            self.requests.append((time.monotonic(), request))

    def on_response(self, response: Response) -> None:
        if self.wanted(response.request):
            self.responses.append(response)

    def on_request_failed(self, request: Request) -> None:
        if self.wanted(request):
            self.failures.append(request)

    def on_request_finished(self, request: Request) -> None:
        if self.wanted(request):
            self.finished.append(request)

    def reset(self) -> None:
        """Forget the traffic of a closed page: its open requests never answer."""
        for seen in (self.requests, self.responses, self.failures, self.finished):
            seen.clear()

    def body_done(self, response: Response) -> bool:
        request = response.request
        return any(r is request for r in self.finished) or any(r is request for r in self.failures)

    def _handlers(self) -> dict:
        return {"request": self.on_request, "response": self.on_response,
                "requestfailed": self.on_request_failed, "requestfinished": self.on_request_finished}

    def attach(self, x: XContext) -> None:
        for event, handler in self._handlers().items():
            x.context.on(event, handler)
        self._attached = x

    def detach(self) -> None:
        """Stop listening: the next timeline of the same context has its own traffic."""
        if self._attached is not None:
            for event, handler in self._handlers().items():
                self._attached.context.remove_listener(event, handler)
            self._attached = None

    def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest Bookmarks request that has no answer yet."""
        answered = {id(r.request) for r in self.responses} | {id(r) for r in self.failures}
        answered |= {id(r) for r in self.finished}
        pending = [t for t, request in self.requests if id(request) not in answered]
        return time.monotonic() - min(pending) if pending else None


def pause(x: XContext) -> None:
    """Let Playwright deliver events for a moment."""
    pages = x.context.pages
    if pages:
        pages[0].wait_for_timeout(POLL_MS)
    else:
        time.sleep(POLL_MS / 1000)
