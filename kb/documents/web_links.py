"""Addresses that are not on X: a probe of the Content-Type, then a file
download (a PDF is read, another file fails as `binary`) or a render in a
clean browser context, by a pool of worker threads. Every connection goes
through the fetch guard."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from playwright.sync_api import Error as PlaywrightError

from kb.documents.outcomes import Outcome, Target, failure_from_error, judged, read_rendered, refused
from kb.enrich.extract import PageTooLarge, Reason, extract_pdf, http_reason, is_pdf, rewrite_arxiv
from kb.guards.fetch_guard import FetchGuard, FetchRefused
from kb.guards.response_body import BodyRefused, read_body
from kb.settings import Settings
from kb.x.browser import Browser, navigation_refusal, watch_navigation

# Some servers refuse clients that do not look like a browser. The probe and
# file downloads send the same User-Agent as a desktop Chrome.
USER_AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
)
# A larger download is not a document that a person reads.
MAX_FILE_BYTES = 50 * 1024 * 1024
# Content types that the browser shows as a page.
PAGE_TYPES = ("application/xhtml+xml", "application/xml", "application/json")


def probe(client: httpx.Client, url: str) -> tuple[str, str | None]:
    """What the address holds, from its Content-Type: (`page`, `pdf` or
    `binary`, the Content-Type). Unknown (the server refuses HEAD and GET,
    or does not answer) is `page`: the browser then finds out, and reports
    its own error."""
    content_type = None
    try:
        response = client.head(url)
        if response.status_code < 400:
            content_type = response.headers.get("content-type")
        else:
            # Many servers answer HEAD with 403, 404 or 405 but serve GET.
            # Read the headers of a GET and close before the body.
            with client.stream("GET", url) as response:
                if response.status_code < 400:
                    content_type = response.headers.get("content-type")
    except httpx.HTTPError:
        return "page", None
    return kind_of_content(content_type, url), content_type


def kind_of_content(content_type: str | None, url: str) -> str:
    """`page`, `pdf` or `binary` for a Content-Type header. No header is a
    page: the browser finds out."""
    media_type = (content_type or "").split(";")[0].strip().lower()
    if not media_type or media_type in PAGE_TYPES or media_type.startswith("text/") or media_type.endswith(("+xml", "json")):
        return "page"
    if media_type == "application/pdf":
        return "pdf"
    if media_type in ("application/octet-stream", "binary/octet-stream") and urlsplit(url).path.lower().endswith(".pdf"):
        return "pdf"  # a PDF served with a generic type; fetch_file checks the bytes
    return "binary"


def fetch_file(client: httpx.Client, outcome: Outcome) -> Outcome:
    """Download a file and read it when it is a PDF."""
    outcome.source = "file"
    try:
        with client.stream("GET", outcome.url) as response:
            outcome.final_url = str(response.url)
            if response.status_code >= 400:
                outcome.reason = http_reason(response.status_code)
                return outcome
            data = read_body(response, limit=MAX_FILE_BYTES, what="the file")
    except BodyRefused as exc:
        outcome.reason = (Reason.TIMEOUT if exc.reason == "too_slow" else Reason.ERROR).value
        outcome.detail = str(exc)
        return outcome
    except httpx.TimeoutException as exc:
        outcome.reason, outcome.detail = Reason.TIMEOUT.value, str(exc)[:500] or "timed out"
        return outcome
    except httpx.HTTPError as exc:
        outcome.reason, outcome.detail = Reason.ERROR.value, f"{type(exc).__name__}: {exc}"[:500]
        return outcome
    except FetchRefused as exc:  # a redirect to a private address
        return refused(outcome, exc)
    if not is_pdf(data):
        outcome.reason = Reason.BINARY.value
        outcome.detail = f"not a PDF: {response.headers.get('content-type', 'no content type')}"
        return outcome
    outcome.kind = "pdf"
    try:
        outcome.extracted = extract_pdf(data, outcome.url)
    except PageTooLarge as exc:
        return failure_from_error(outcome, exc)
    except ValueError as exc:
        outcome.reason, outcome.detail = Reason.BINARY.value, str(exc)[:500]
        return outcome
    return judged(outcome)


def fetch_link(get_context: Callable, client: httpx.Client, target: Target, *, timeout_s: float,
               arxiv: frozenset[str], guard: FetchGuard) -> Outcome:
    """Fetch one address that is not on X: as a file, or rendered. The
    client and the browser context connect through the fetch guard; a link,
    a redirect or a script navigation to a private address fails with the
    reason "private address"."""
    url = rewrite_arxiv(target.url, arxiv)
    outcome = Outcome(target, url=url, kind="link", source="browser")
    try:
        guard.check_url(url)
        what, content_type = probe(client, url)
    except FetchRefused as exc:
        return refused(outcome, exc)
    if what == "binary":
        outcome.source, outcome.reason, outcome.detail = "file", Reason.BINARY.value, content_type
        return outcome
    if what == "pdf":
        return fetch_file(client, outcome)
    page = get_context().new_page()
    # A pop-up that the last page opened can be told to Playwright after
    # that page closed; new_page() has taken in such news, so it goes now.
    close_other_pages(page)
    watch_navigation(page)
    try:
        try:
            response = page.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
        except PlaywrightError as exc:
            if (refusal := navigation_refusal(page, url)) is not None:
                return refused(outcome, refusal)
            if "Download is starting" in str(exc):
                # The probe saw a page, but the server sent a file.
                return fetch_file(client, outcome)
            return failure_from_error(outcome, exc)
        try:
            outcome = read_rendered(page, outcome, response.status if response else None, timeout_s)
        except (PlaywrightError, PageTooLarge) as exc:  # PageHeld: a script of the page holds it
            return failure_from_error(outcome, exc)
        if (refusal := navigation_refusal(page, url)) is not None:
            # A redirect or a script took the page to a private address.
            outcome.extracted = None
            return refused(outcome, refusal)
        return outcome
    finally:
        # Every page of the context goes, also the pop-ups that this page
        # opened: five pop-ups of a hostile page went on sending requests and
        # using the CPU until the worker ended, and shared cookies with the
        # next links (the red team, 7 December 2026). Each worker reads one
        # link at a time.
        close_other_pages(page)
        with contextlib.suppress(PlaywrightError):
            page.close()


def close_other_pages(page) -> None:
    """Close each page of `page`'s context but `page`: the pop-ups that a
    script opened. Chromium blocks a pop-up without a click (kb/x/browser.py),
    but a page can still open one."""
    for other in page.context.pages:
        if other is not page:
            with contextlib.suppress(PlaywrightError):
                other.close()


def arxiv_hosts(settings: Settings) -> frozenset[str]:
    return frozenset(h.strip().lower() for h in settings.kb_arxiv_hosts.split(",") if h.strip())


class BrowserDidNotStart(RuntimeError):
    """The clean context could not be opened."""


@dataclass
class _Pool:
    """Workers that share one queue of targets. Each worker opens its own
    clean context, and only when it meets its first page: the sync Playwright
    API is bound to one thread, and a run of PDFs needs no browser."""

    browser: Browser
    settings: Settings
    record: Callable[[Outcome], None]
    targets: queue.Queue = field(default_factory=queue.Queue)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def work(self) -> None:
        guard = FetchGuard.from_settings(self.settings)
        timeout_s, arxiv = self.browser.timeout_s, arxiv_hosts(self.settings)
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(
                guard.httpx_client(follow_redirects=True, timeout=timeout_s, headers={"User-Agent": USER_AGENT})
            )
            context = None

            def get_context():
                nonlocal context
                if context is None:
                    try:
                        context = stack.enter_context(self.browser.clean_context(guard))
                    except Exception as exc:
                        raise BrowserDidNotStart(f"{type(exc).__name__}: {exc}") from exc
                return context

            while True:
                try:
                    target = self.targets.get_nowait()
                except queue.Empty:
                    return
                try:
                    outcome = fetch_link(get_context, client, target, timeout_s=timeout_s, arxiv=arxiv, guard=guard)
                except BrowserDidNotStart as exc:
                    # No other page can be rendered by this worker either. Its
                    # target stays unfetched (no row), so the next run tries it.
                    with self.lock:
                        self.errors.append(exc)
                    return
                except Exception as exc:  # one bad page must not lose the others
                    outcome = Outcome(target, url=target.url, kind="link", source="browser",
                                      reason=Reason.ERROR.value, detail=f"{type(exc).__name__}: {exc}"[:500])
                self.record(outcome)


def fetch_links(targets: list[Target], browser: Browser, settings: Settings, workers: int,
                record: Callable[[Outcome], None]) -> list[BaseException]:
    """Fetch addresses that are not on X with `workers` threads; each
    outcome goes to `record` as it comes (called from the workers' threads).
    Returns the errors that stopped a worker."""
    pool = _Pool(browser, settings, record)
    for target in targets:
        pool.targets.put(target)
    threads = [threading.Thread(target=pool.work, name=f"documents-{n}") for n in range(min(workers, len(targets)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return pool.errors
