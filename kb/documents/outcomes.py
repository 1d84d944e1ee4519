"""One fetch of one address: what to fetch (Target), what came of it
(Outcome), and the rules that judge a page or an error into a result or a
failure with its reason."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from kb.enrich.extract import MAX_PAGE_CHARS, Extracted, PageTooLarge, Reason, extract_html, http_reason, looks_blocked
from kb.error_lines import error_line
from kb.guards.fetch_guard import FetchRefused
from kb.x.browser import page_html, page_title


@dataclass(frozen=True)
class Target:
    """One address to fetch."""

    url_norm: str
    url: str  # the expanded URL as X gave it
    is_article: bool
    article_title: str | None = None
    article_text: str | None = None  # from content_state, when present
    attempts: int = 0  # earlier fetches
    batch: str = ""  # the oldest sync batch that links to it


@dataclass
class Outcome:
    """The result of one fetch: a usable document or a failure with its reason."""

    target: Target
    url: str
    kind: str  # link, article, pdf
    source: str  # content_state, graphql, browser, file
    final_url: str | None = None
    extracted: Extracted | None = None
    reason: str | None = None  # set on failure
    detail: str | None = None
    wait: str | None = None  # the load state that the text was read at

    @property
    def ok(self) -> bool:
        return self.reason is None

    def row(self, batch: str, now: datetime) -> dict:
        ex = self.extracted
        return {
            "url_norm": self.target.url_norm,
            "url": self.url,
            "final_url": self.final_url,
            "kind": self.kind,
            "source": self.source,
            "title": ex.title if ex else None,
            "html": ex.text_html if ex else None,
            "text": ex.text if ex else None,
            "word_count": ex.word_count if ex else 0,
            "status": "ok" if self.ok else "failed",
            "reason": self.reason,
            "detail": self.detail,
            "batch": batch,
            "fetched_at": now,
            "attempts": self.target.attempts + 1,
        }


def judged(outcome: Outcome, page_html: str | None = None, status: int | None = None) -> Outcome:
    """Set the failure reason from the HTTP status and the extracted text.
    A bot wall is `blocked`, whatever status it came with."""

    def blocked() -> bool:
        return page_html is not None and looks_blocked(page_html)

    if status is not None and status >= 400:
        outcome.reason = Reason.BLOCKED.value if blocked() else http_reason(status)
    elif outcome.extracted is None or outcome.extracted.thin:
        outcome.reason = Reason.BLOCKED.value if blocked() else Reason.THIN.value
    return outcome


def one_outcome(make: Callable[[Target], Outcome], target: Target, *, kind: str, source: str) -> Outcome:
    """make(target), or a failed outcome with the error: one bad address
    must not stop the others."""
    try:
        return make(target)
    except Exception as exc:
        return Outcome(target, url=target.url, kind=kind, source=source, reason=Reason.ERROR.value,
                       detail=f"{type(exc).__name__}: {exc}"[:500])


def refused(outcome: Outcome, exc: FetchRefused) -> Outcome:
    """A failure with the guard's reason ("private address"): never a silent skip."""
    outcome.reason, outcome.detail = exc.reason, str(exc)[:500]
    return outcome


def failure_from_error(outcome: Outcome, exc: Exception) -> Outcome:
    message = error_line(exc, 500)
    if isinstance(exc, PlaywrightTimeout):
        outcome.reason = Reason.TIMEOUT.value
    elif isinstance(exc, PageTooLarge):
        outcome.reason = Reason.TOO_LARGE.value
    elif "ERR_BLOCKED_BY" in message:
        outcome.reason = Reason.BLOCKED.value
    elif "ERR_TIMED_OUT" in message or "ERR_CONNECTION_TIMED_OUT" in message:
        outcome.reason = Reason.TIMEOUT.value
    else:
        outcome.reason = Reason.ERROR.value
    outcome.detail = message
    return outcome


def read_rendered(page: Page, outcome: Outcome, status: int | None, timeout_s: float) -> Outcome:
    """Extract the main content of a loaded page. A page that is thin at
    domcontentloaded is read once more at networkidle."""
    outcome.final_url = page.url
    outcome.wait = "domcontentloaded"
    html = page_html(page, timeout_s, MAX_PAGE_CHARS)
    outcome.extracted = extract_html(html, page.url)
    if (status is None or status < 400) and outcome.extracted.thin:
        try:
            page.wait_for_load_state("networkidle", timeout=timeout_s * 1000)
        except PlaywrightError:
            pass  # a page that polls never goes idle: read what it shows now
        outcome.wait = "networkidle"
        outcome.final_url = page.url
        html = page_html(page, timeout_s, MAX_PAGE_CHARS)
        outcome.extracted = extract_html(html, page.url)
    if not outcome.extracted.title:
        with contextlib.suppress(PlaywrightError):
            title = page_title(page, timeout_s).strip()
            if title:
                outcome.extracted = Extracted(
                    outcome.extracted.text_html, outcome.extracted.text, title, outcome.extracted.word_count
                )
    return judged(outcome, html, status)
