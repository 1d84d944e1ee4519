"""One browser capture of one timeline (the bookmarks, or one folder) into
one batch: open the page, scroll, keep each GraphQL answer as it came, and
stop one page after the watermark, at the end, or at max_pages. Under HTTP
429 it waits as X says and goes on from the last kept page.

The rules of when to stop and how to resume are in kb/x/capture_run.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from playwright.sync_api import Page, Response
from pydantic import BaseModel

from kb.settings import Settings, get_settings
from kb.x.browser import XContext
from kb.x.capture_traffic import (BOOKMARKS_TIMELINE, FIRST_BACKOFF_S, MAX_BACKOFF_S, POLL_MS, BookmarksTraffic,
                                  CaptureCutOff, RateLimited, Timeline, check_wait_budget, close_pages,
                                  rate_limit_wait, request_cursor, sleep_for, with_cursor)
from kb.x.graphql import PageShapeError, load_page, summarize_page
from kb.x.raw_store import CaptureManifest, RawStore

# Sign-in paths of the X web client. X sends a logged-out browser there.
LOGIN_PATHS = ("/login", "/i/flow/login", "/i/flow/signup")


class CaptureRules(BaseModel):
    """How a browser capture paces itself, and what it reads after the
    bookmarks. capture_batch() takes timeout_s from the Browser client (the
    browser resource), so one timeout holds for the pages and the answers."""

    timeout_s: float
    scroll_wait_s: float
    max_idle_scrolls: int
    max_wait_s: float
    read_folders: bool
    thread_reads: int

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> CaptureRules:
        settings = settings or get_settings()
        return cls(**{"timeout_s": settings.kb_browser_timeout_s, "scroll_wait_s": settings.kb_capture_scroll_wait_s,
                      "max_idle_scrolls": settings.kb_capture_max_idle_scrolls,
                      "max_wait_s": settings.kb_capture_max_wait_s, "read_folders": settings.kb_capture_folders,
                      "thread_reads": settings.kb_capture_threads, **overrides})


@dataclass
class CaptureProgress:
    """What a capture has kept so far. The manifest and the metadata come from it."""

    pages: list[str] = field(default_factory=list)
    tweet_ids: set[str] = field(default_factory=set)
    newest: tuple[str, str] | None = None  # (tweet_id, sort_index) of the first tweet of the first page
    met_watermark: bool = False
    complete: bool = False
    stop_reason: str = ""
    bad_pages: list[str] = field(default_factory=list)
    resume_cursor: str | None = None  # the bottom cursor of the last kept page in the chain
    rate_limit_waits: list[float] = field(default_factory=list)
    with_replies: list[tuple[str, str]] = field(default_factory=list)  # (tweet_id, handle), newest first
    folders: list[str] = field(default_factory=list)  # the ids that the folder list named
    folders_done: list[str] = field(default_factory=list)  # folders read to their end
    folder_notes: list[str] = field(default_factory=list)  # why a folder was not read to its end
    threads: list[str] = field(default_factory=list)  # bookmarks whose TweetDetail this batch keeps
    thread_notes: list[str] = field(default_factory=list)

    def add_tweets(self, tweets: list[tuple[str, str]]) -> None:
        if self.newest is None and tweets:
            self.newest = tweets[0]
        self.tweet_ids.update(tweet_id for tweet_id, _ in tweets)


class BookmarksCapture:
    """One browser capture of the bookmarks timeline (or of one folder's
    timeline) into one batch."""

    def __init__(self, *, raw_store: RawStore, batch: str, watermark_id: str | None, max_pages: int,
                 log, resume: CaptureManifest | None = None, timeline: Timeline = BOOKMARKS_TIMELINE,
                 rules: CaptureRules, waits: list[float] | None = None) -> None:
        self.raw_store = raw_store
        self.batch = batch
        self.watermark_id = watermark_id
        self.max_pages = max_pages
        self.log = log
        self.timeline = timeline
        self.scroll_wait_s = rules.scroll_wait_s
        self.max_idle_scrolls = rules.max_idle_scrolls
        self.timeout_s = rules.timeout_s
        self.progress = CaptureProgress()
        self.traffic = BookmarksTraffic(timeline)
        self.max_wait_s = rules.max_wait_s
        if waits is not None:
            # One wait budget for the whole capture: a folder read gets what the bookmarks left.
            self.progress.rate_limit_waits = waits
        self.bottom_cursors: set[str] = set()
        self.last_bottom_cursor: str | None = None
        # Where the X client's first Bookmarks request starts: None is the top.
        self.start_cursor: str | None = None
        if resume is not None:
            self.start_cursor = resume.resume_cursor
            self.progress.resume_cursor = resume.resume_cursor
            if resume.newest_tweet_id and resume.newest_sort_index:
                # The chain's newest bookmark: the watermark moves to it when the chain completes.
                self.progress.newest = (resume.newest_tweet_id, resume.newest_sort_index)
        self.backoff_s = FIRST_BACKOFF_S

    def run(self, x: XContext) -> CaptureProgress:
        self.traffic.attach(x)  # before the page opens: the first page comes at load
        x.context.route(self.timeline.matches, self._start_at_cursor)
        try:
            while True:
                try:
                    return self._run_page(x)
                except RateLimited as limit:
                    self._wait_for_rate_limit(x, limit)
        finally:
            self.traffic.detach()
            x.context.unroute(self.timeline.matches, self._start_at_cursor)

    def _start_at_cursor(self, route) -> None:
        """Send the X client's first Bookmarks request (no cursor) to the
        cursor where this capture goes on. Other requests pass unchanged."""
        request = route.request
        if self.start_cursor and request.method == "GET" and request_cursor(request.url) is None:
            route.fallback(url=with_cursor(request.url, self.start_cursor))
        else:
            route.fallback()

    def _wait_for_rate_limit(self, x: XContext, limit: RateLimited) -> None:
        check_wait_budget(limit, self.progress.rate_limit_waits, self.max_wait_s,
                          then="The next sync goes on from the last kept page.")
        self.log.warning(f"{limit}: waiting {limit.wait_s:.0f} s, then going on from the last kept page.")
        self.progress.rate_limit_waits.append(limit.wait_s)
        self.backoff_s = min(MAX_BACKOFF_S, self.backoff_s * 2)
        close_pages(x)  # the X client shows an error and asks for no more pages
        self.traffic.reset()
        if self.last_bottom_cursor:
            self.start_cursor = self.last_bottom_cursor
        sleep_for(limit.wait_s)

    def _run_page(self, x: XContext) -> CaptureProgress:
        page = x.open(self.timeline.path)
        if self.start_cursor:
            self.bottom_cursors.add(self.start_cursor)  # the first page then follows one of ours
        handled = 0
        idle_scrolls = 0
        while True:
            # The first page comes at load; each later one after a scroll.
            if self._wait_for_traffic(page, handled):
                idle_scrolls = 0
            else:
                idle_scrolls += 1
                if idle_scrolls >= self.max_idle_scrolls:
                    return self._stop_idle(page, idle_scrolls)
            x.raise_if_left_x()
            # Keep the pages that came before a failure is raised: they are kept.
            while handled < len(self.traffic.responses):
                response = self.traffic.responses[handled]
                handled += 1
                if self._keep(page, response):
                    return self.progress
            self._raise_if_failed()
            self._raise_if_logged_out(page)
            self._scroll(page)

    def _keep(self, page: Page, response: Response) -> bool:
        """Write one page of the timeline as it came. True when the capture must stop."""
        number = len(self.progress.pages) + 1
        if response.status == 429:
            raise RateLimited(rate_limit_wait(response.headers, self.backoff_s), number, self.timeline.label)
        if response.status != 200:
            raise CaptureCutOff(f"X answered HTTP {response.status} for {self.timeline.label} page {number} "
                                f"({response.url[:120]}).")
        self._wait_for_body(page, response, number)
        body = response.body()  # main flow: safe here, not in the handler
        path = self.timeline.write(self.raw_store, self.batch, number, body)
        self.progress.pages.append(path.name)
        try:
            summary = summarize_page(load_page(body, name=path.name), name=path.name,
                                     operation=self.timeline.operation)
        except PageShapeError as exc:
            raise CaptureCutOff(f"{exc}. The page is kept as it came.") from exc

        cursor = request_cursor(response.url)
        # X may ask again for the top of the timeline (with its top cursor).
        # Such a page is kept, but only a page that follows one of ours (first
        # page, or a bottom cursor we saw) can be the end or a step forward.
        follows = cursor is None or cursor in self.bottom_cursors
        if summary.bottom_cursor:
            self.bottom_cursors.add(summary.bottom_cursor)
        if not follows:
            self.log.info(f"Kept {path.name}: its cursor is not one of ours (X refreshed the top).")
            return False
        self.last_bottom_cursor = summary.bottom_cursor
        if summary.bottom_cursor:
            self.progress.resume_cursor = summary.bottom_cursor
        self.progress.add_tweets(summary.tweets)
        self.progress.with_replies += summary.with_replies
        self.log.info(f"Kept {path.name}: {len(summary.tweets)} bookmarks.")

        if self.progress.met_watermark:
            return self._stop(complete=True, reason="one page after the watermark")
        if self.watermark_id and any(tweet_id == self.watermark_id for tweet_id, _ in summary.tweets):
            self.progress.met_watermark = True
            self.log.info(f"{path.name} holds the watermark {self.watermark_id}: one more page, then stop.")
        if not summary.tweets:
            return self._stop(complete=True, reason="end of the bookmarks (a page with no tweets)")
        if self.max_pages and len(self.progress.pages) >= self.max_pages:
            return self._stop(complete=False, reason=f"max_pages={self.max_pages} reached")
        return False

    def _stop(self, *, complete: bool, reason: str) -> bool:
        self.progress.complete = complete
        self.progress.stop_reason = reason
        return True

    def _stop_idle(self, page: Page, idle_scrolls: int) -> CaptureProgress:
        if not self.progress.pages:
            raise CaptureCutOff(
                f"No {self.timeline.label} page came from X after {idle_scrolls} scrolls (the browser is at {page.url}). "
                "If the X login expired, run `kb login`."
            )
        if self.last_bottom_cursor:
            # X gave a cursor to go on, but did not ask for the next page: a
            # stall, not the end. To call it the end would move the watermark
            # over bookmarks we never saw, or mark them removed after --full.
            raise CaptureCutOff(
                f"X loaded no new {self.timeline.label} page after {idle_scrolls} scrolls, and the last page "
                f"({self.progress.pages[-1]}) still had a bottom cursor. The pages are kept; run the sync again."
            )
        self._stop(complete=True, reason="end of the bookmarks (no bottom cursor)")
        return self.progress

    def _wait_for_traffic(self, page: Page, handled: int) -> bool:
        """Wait for a new response or failure. True when one came. While a
        request is open, wait on, up to the browser timeout."""
        deadline = time.monotonic() + self.scroll_wait_s
        while True:
            if len(self.traffic.responses) > handled or self.traffic.failures:
                return True
            age = self.traffic.oldest_pending_age()
            if age is not None and age > self.timeout_s:
                raise CaptureCutOff(
                    f"X did not answer {self.timeline.label} page {len(self.progress.pages) + 1} "
                    f"within {self.timeout_s:g} s.")
            if age is None and time.monotonic() >= deadline:
                return False
            page.wait_for_timeout(POLL_MS)  # Playwright delivers events while it waits

    def _wait_for_body(self, page: Page, response: Response, number: int) -> None:
        # response.body() has no timeout: it waits until the body has fully
        # come, which can be never. So wait for "requestfinished" here, with
        # the browser timeout.
        deadline = time.monotonic() + self.timeout_s
        while not self.traffic.body_done(response):
            if time.monotonic() >= deadline:
                raise CaptureCutOff(f"The body of {self.timeline.label} page {number} did not come "
                                    f"within {self.timeout_s:g} s.")
            page.wait_for_timeout(POLL_MS // 4)

    def _scroll(self, page: Page) -> None:
        # The wheel is what a person does; scrollTo makes sure the page
        # reaches the bottom, where the X client asks for the next page.
        page.mouse.wheel(0, 4000)
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")

    def _raise_if_failed(self) -> None:
        if self.traffic.failures:
            request = self.traffic.failures[0]
            raise CaptureCutOff(
                f"The request for {self.timeline.label} page {len(self.progress.pages) + 1} failed: "
                f"{request.failure or 'no answer'}.")

    def _raise_if_logged_out(self, page: Page) -> None:
        path = urlsplit(page.url).path
        if any(path.startswith(p) for p in LOGIN_PATHS):
            raise CaptureCutOff(f"X sent the browser to its sign-in page ({path}): the login expired. Run `kb login`.")
