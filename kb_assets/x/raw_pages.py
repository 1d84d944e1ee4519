"""Stage 1, X: capture the owner's bookmarks as raw GraphQL pages.

The asset `x_raw_pages` opens the X bookmarks page with the saved login,
scrolls, and keeps every GraphQL response of the `Bookmarks` operation as it
came, one file per page, under the sync batch. There is no X API here: the
X web client asks for the pages, and we keep what X answers.

When to stop:
- one page after the page that holds the watermark (the newest bookmark of
  the last complete capture). The extra page overlaps the last capture, so
  a page boundary that moved between two captures (a bookmark removed, or
  added again) hides no bookmark;
- at the end of the bookmarks: a page with no tweets, as X ends a timeline;
- when X asks for no more pages and the last page had no bottom cursor;
- with `full`, the watermark does not count: the capture goes to the end.

Under a rate limit (HTTP 429) the capture waits as X says (retry-after or
x-rate-limit-reset, else a growing back-off), then opens the page again and
goes on from the last kept page: it rewrites the X client's first Bookmarks
request to carry that page's bottom cursor. When the waits would pass
KB_CAPTURE_MAX_WAIT_S, the capture is cut off, and its manifest keeps the
cursor: the next sync goes on from there (RawStore.resume_point) and counts
the chain as one capture. Only a chain that reached the end or the watermark
is complete and moves the watermark, to the newest bookmark of its first
batch. Hard-won fact: a first capture of thousands of bookmarks meets 429,
and when each sync started at the top again, it never completed.

A capture that is cut off (an error, a timeout, a stall) keeps its pages,
writes a manifest with complete=False, and fails. A capture stopped by
`max_pages` is not complete either, but it succeeds. Neither moves the
watermark, so the next sync goes back over the same ground, and normalize
must not mark bookmarks removed after an incomplete `full` capture.

After a capture that met the watermark or the end, two more reads follow in
the same browser (kb/x/raw_store.py names their files):
- Folders (KB_CAPTURE_FOLDERS). The bookmarks page asks for the folder list
  (BookmarkFoldersSlice); the capture keeps it, then opens each folder
  (/i/bookmarks/<id>) and scrolls it to its end, as it scrolls the bookmarks,
  and keeps its BookmarkFolderTimeline pages. Every folder is read to its end
  at each sync: only a whole folder shows which posts left it. The 429 rules
  and the cursor resume above apply, with one wait budget for the whole
  capture. A folder that a limit or an error cut off is named in the
  metadata; its earlier bookmarks stay, and the next sync reads it first.
- Threads (KB_CAPTURE_THREADS). For the newest bookmarked posts with replies
  whose thread no batch holds yet, the capture opens the post and keeps its
  TweetDetail answer once. Normalize takes the author's own chain from it.
Neither read makes the bookmarks capture fail: the batch stays complete.

With `files`, the asset imports saved answers byte for byte, with no browser
(the demo and `kb import`): Bookmarks pages, folder lists, folder pages and
TweetDetail answers, in any order; it sorts them by their shape. An import
does not move the watermark: we cannot know that the files reach down to
the last capture, and a watermark above a gap would hide that gap from every
later sync.
"""

# No `from __future__ import annotations` here: Dagster reads the type of
# the `config` parameter at definition time and cannot resolve a string.
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from email.utils import parsedate_to_datetime
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import dagster as dg
from pydantic import Field
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, Request, Response

from kb_assets.partitions import sync_batches
from kb_assets.run_config_rules import check_import_files
from kb.x.graphql import (BOOKMARKS, FOLDER_LIST, FOLDER_TIMELINE, TWEET_DETAIL, PageShapeError, answer_kind,
                          focal_post_id, is_bookmarks_response, load_page, operation_name, parse_folder_list,
                          summarize_page)
from kb.x.browser import XContext
from kb.x.raw_store import FOLDER_PAGE_FILE, THREAD_FILE, CaptureManifest, RawStore
from kb.settings import get_settings
from kb_resources.services import BrowserResource
from kb_resources.stores import RawStoreResource

BOOKMARKS_PATH = "/i/bookmarks"
# Sign-in paths of the X web client. X sends a logged-out browser there.
LOGIN_PATHS = ("/login", "/i/flow/login", "/i/flow/signup")
POLL_MS = 50
# The back-off after a 429 that names no wait: doubles each time, up to the limit.
FIRST_BACKOFF_S = 15.0
MAX_BACKOFF_S = 300.0
METADATA_LIST_LIMIT = 20  # keep the run metadata readable in the UI
# An X handle: the thread read opens x.com/<handle>/status/<id>. A handle of
# another form (from a hostile page) is not put into a path.
HANDLE = re.compile(r"^[A-Za-z0-9_]{1,15}$")


class CaptureConfig(dg.Config):
    full: bool = Field(False, description="Ignore the watermark and capture to the end. Normalize marks bookmarks that are gone.")
    files: list[str] = Field(default_factory=list, description="Import these saved answers (Bookmarks pages, folder lists, folder pages, TweetDetail) byte for byte, with no browser.")
    max_pages: int = Field(0, description="Stop after this many pages (0: no limit). Such a capture is not complete.")


class CaptureCutOff(RuntimeError):
    """The capture stopped before it met the watermark or the end."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


class BookmarksCapture:
    """One browser capture of the bookmarks timeline (or of one folder's
    timeline) into one batch."""

    def __init__(self, *, raw_store: RawStore, batch: str, watermark_id: str | None, max_pages: int,
                 log, resume: CaptureManifest | None = None, timeline: Timeline = BOOKMARKS_TIMELINE,
                 waits: list[float] | None = None) -> None:
        settings = get_settings()
        self.raw_store = raw_store
        self.batch = batch
        self.watermark_id = watermark_id
        self.max_pages = max_pages
        self.log = log
        self.timeline = timeline
        self.scroll_wait_s = settings.kb_capture_scroll_wait_s
        self.max_idle_scrolls = settings.kb_capture_max_idle_scrolls
        self.timeout_s = settings.kb_browser_timeout_s
        self.progress = CaptureProgress()
        self.traffic = BookmarksTraffic(timeline)
        self.max_wait_s = settings.kb_capture_max_wait_s
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


# --- folders and threads, after the bookmarks ---------------------------------------


class ExtraReads:
    """The folder and thread reads that follow a bookmarks capture in the
    same browser context. They share the capture's wait budget. A limit or
    an error stops them, and is named: it never fails the batch, whose
    bookmarks are complete."""

    def __init__(self, *, raw_store: RawStore, batch: str, progress: CaptureProgress, log,
                 previous: CaptureManifest | None) -> None:
        settings = get_settings()
        self.raw_store = raw_store
        self.batch = batch
        self.progress = progress
        self.log = log
        self.previous = previous
        self.timeout_s = settings.kb_browser_timeout_s
        self.max_wait_s = settings.kb_capture_max_wait_s
        self.read_folders = settings.kb_capture_folders
        self.thread_reads = settings.kb_capture_threads
        self.folder_list = BookmarksTraffic(Timeline(BOOKMARKS_PATH, FOLDER_LIST))

    def run(self, x: XContext) -> None:
        try:
            if self.read_folders:
                self.folders(x)
            if self.thread_reads:
                self.threads(x)
        finally:
            self.folder_list.detach()
            close_pages(x)

    # --- folders ---------------------------------------------------------------
    def folders(self, x: XContext) -> None:
        """Keep the folder list that the bookmarks page asked for, then read
        each folder to its end. Folders that the last capture did not finish go first."""
        body = self._folder_list_body(x)
        if body is None:
            return
        path = self.raw_store.write_answer(self.batch, "folders-0001.json", body)
        try:
            folders, problems = parse_folder_list(load_page(body, name=path.name), name=path.name)
        except PageShapeError as exc:
            self.progress.folder_notes.append(f"{exc}. The answer is kept as it came.")
            return
        self.progress.folder_notes += problems
        ids = [folder["folder_id"] for folder in folders]
        self.progress.folders = ids
        unfinished = set(ids) - set(self.previous.folders_done if self.previous else ids)
        for folder_id in sorted(ids, key=lambda f: f not in unfinished):
            capture = BookmarksCapture(raw_store=self.raw_store, batch=self.batch, watermark_id=None, max_pages=0,
                                       log=self.log, timeline=folder_timeline(folder_id),
                                       waits=self.progress.rate_limit_waits)
            try:
                capture.run(x)
            except WaitBudgetSpent as exc:
                self.progress.folder_notes.append(f"folder {folder_id}: {exc} The next sync reads it first.")
                return
            except (CaptureCutOff, PlaywrightError) as exc:
                self.progress.folder_notes.append(f"folder {folder_id}: {exc}")
                continue
            finally:
                close_pages(x)
            if capture.progress.complete:
                self.progress.folders_done.append(folder_id)
            self.log.info(f"Folder {folder_id}: {len(capture.progress.tweet_ids)} bookmarks in "
                          f"{len(capture.progress.pages)} pages.")

    def _folder_list_body(self, x: XContext) -> bytes | None:
        """The body of the bookmarks page's BookmarkFoldersSlice answer. None
        when it asked for none (an account without folders) or it failed."""
        traffic = self.folder_list
        deadline = time.monotonic() + self.timeout_s
        while traffic.requests and not traffic.responses and not traffic.failures:
            if time.monotonic() >= deadline:
                self.progress.folder_notes.append(f"X did not answer {FOLDER_LIST} within {self.timeout_s:g} s")
                return None
            _pause(x)
        if not traffic.responses:
            if traffic.failures:
                self.progress.folder_notes.append(f"the request for {FOLDER_LIST} failed")
            return None
        response = traffic.responses[-1]
        if response.status != 200:
            self.progress.folder_notes.append(f"X answered HTTP {response.status} for {FOLDER_LIST}; "
                                              "the folders wait for the next sync")
            return None
        while not traffic.body_done(response):
            if time.monotonic() >= deadline:
                self.progress.folder_notes.append(f"the body of {FOLDER_LIST} did not come within {self.timeout_s:g} s")
                return None
            _pause(x)
        return response.body()

    # --- threads ---------------------------------------------------------------
    def threads(self, x: XContext) -> None:
        """Keep the TweetDetail answer of the newest bookmarked posts with
        replies whose thread no batch holds yet."""
        todo = thread_targets(self.progress.with_replies, self.raw_store.threads_read(), self.thread_reads)
        for tweet_id, handle in todo:
            try:
                body = self._thread_body(x, tweet_id, handle)
            except (CaptureCutOff, PlaywrightError) as exc:
                # X that does not answer one thread read seldom answers the
                # next: each one costs up to the browser timeout. Stop here.
                self.progress.thread_notes.append(f"post {tweet_id}: {exc} The next sync reads the other threads.")
                return
            finally:
                close_pages(x)
            if body is not None:
                self.raw_store.write_answer(self.batch, f"thread-{tweet_id}.json", body)
                self.progress.threads.append(tweet_id)

    def _thread_body(self, x: XContext, tweet_id: str, handle: str) -> bytes | None:
        path = f"/{handle}/status/{tweet_id}"
        backoff = FIRST_BACKOFF_S
        while True:
            traffic = BookmarksTraffic(Timeline(path, TWEET_DETAIL))
            traffic.attach(x)
            try:
                page = x.open(path)
                response = self._focal_answer(page, traffic, tweet_id)
                if response.status == 429:
                    limit = RateLimited(rate_limit_wait(response.headers, backoff), 1, f"{TWEET_DETAIL} ({tweet_id})")
                elif response.status != 200:
                    raise CaptureCutOff(f"X answered HTTP {response.status} for {TWEET_DETAIL}")
                else:
                    deadline = time.monotonic() + self.timeout_s
                    while not traffic.body_done(response):
                        if time.monotonic() >= deadline:
                            raise CaptureCutOff(f"the body of {TWEET_DETAIL} did not come within {self.timeout_s:g} s")
                        page.wait_for_timeout(POLL_MS // 4)
                    return response.body()
            finally:
                traffic.detach()
            check_wait_budget(limit, self.progress.rate_limit_waits, self.max_wait_s, then="")
            self.log.warning(f"{limit}: waiting {limit.wait_s:.0f} s.")
            self.progress.rate_limit_waits.append(limit.wait_s)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            close_pages(x)
            sleep_for(limit.wait_s)

    def _focal_answer(self, page: Page, traffic: BookmarksTraffic, tweet_id: str) -> Response:
        """The TweetDetail answer about `tweet_id` (the page may ask about others too)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for response in traffic.responses:
                if str(request_variables(response.url).get("focalTweetId")) == tweet_id:
                    return response
            if traffic.failures:
                raise CaptureCutOff(f"the request for {TWEET_DETAIL} failed: {traffic.failures[0].failure}")
            if time.monotonic() >= deadline:
                raise CaptureCutOff(f"X did not answer {TWEET_DETAIL} within {self.timeout_s:g} s")
            page.wait_for_timeout(POLL_MS)


# A post id: it goes into an X address and a file name (thread-<id>.json).
POST_ID = re.compile(r"^[0-9]{1,30}$")


def thread_targets(with_replies: list[tuple[str, str]], read: set[str], limit: int) -> list[tuple[str, str]]:
    """The posts whose thread to read: newest first, each once, none that a
    batch holds already, at most `limit`. An id that is not a number (a
    hostile page) is never put into an address or a file name."""
    todo: dict[str, str] = {}
    for tweet_id, handle in with_replies:
        if POST_ID.match(tweet_id) and tweet_id not in read and tweet_id not in todo:
            todo[tweet_id] = handle if HANDLE.match(handle) else "i"  # x.com/i/status/<id> opens any post
    return list(todo.items())[:limit]


def _pause(x: XContext) -> None:
    """Let Playwright deliver events for a moment."""
    pages = x.context.pages
    if pages:
        pages[0].wait_for_timeout(POLL_MS)
    else:
        time.sleep(POLL_MS / 1000)


# --- import -------------------------------------------------------------------------


def import_files(raw_store: RawStore, batch: str, files: list[str], log) -> CaptureProgress:
    """Copy saved answers into the batch, byte for byte, in any order: each
    gets the file name of its kind (kb/x/raw_store.py). A file that does not
    parse is kept too, and named with the reason."""
    paths = [Path(f).expanduser() for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise dg.Failure(description=f"Cannot import: no such file: {', '.join(missing)}. Nothing was imported.")
    progress = CaptureProgress()
    counts: Counter = Counter()
    for source in paths:
        body = source.read_bytes()
        try:
            payload = load_page(body, name=str(source))
        except PageShapeError:
            payload = None
        kind = answer_kind(payload)
        if kind == FOLDER_LIST:
            _import_folder_list(raw_store, batch, source, body, payload, counts, progress)
        elif kind in (FOLDER_TIMELINE, TWEET_DETAIL):
            _import_named_answer(raw_store, batch, source, body, payload, kind, counts, progress)
        else:
            counts["page"] += 1
            target = raw_store.write_page(batch, counts["page"], body)
            progress.pages.append(target.name)
            try:
                progress.add_tweets(summarize_page(load_page(body, name=str(source)), name=str(source)).tweets)
            except PageShapeError as exc:
                progress.bad_pages.append(str(exc))
                log.warning(f"Kept {target.name} as it came, but it is not a Bookmarks page: {exc}")
    # The owner gave these folders' pages: they say what each folder holds now.
    progress.folders_done = sorted(set(progress.folders_done))
    progress.complete = True
    progress.stop_reason = f"imported {len(paths)} files"
    return progress


def _import_folder_list(raw_store, batch, source, body, payload, counts, progress) -> None:
    counts["folders"] += 1
    target = raw_store.write_answer(batch, f"folders-{counts['folders']:04d}.json", body)
    try:
        folders, _problems = parse_folder_list(payload, name=str(source))
    except PageShapeError as exc:
        progress.bad_pages.append(f"{exc} (kept as {target.name})")
        return
    progress.folders += [folder["folder_id"] for folder in folders if folder["folder_id"] not in progress.folders]


def _import_named_answer(raw_store, batch, source, body, payload, kind, counts, progress) -> None:
    """A folder page or a TweetDetail answer. Neither names its folder or
    post inside; the capture's file name does (folder-<id>-0001.json,
    thread-<id>.json). A TweetDetail answer of another name is about its focal post."""
    if kind == FOLDER_TIMELINE:
        found = FOLDER_PAGE_FILE.match(source.name)
        key = found["id"] if found else None
        why = ("a BookmarkFolderTimeline answer does not name its folder: give the file the name that the "
               "capture gives it, folder-<folder id>-0001.json")
    else:
        found = THREAD_FILE.match(source.name)
        key = found["id"] if found else focal_post_id(payload, name=str(source))
        why = "a TweetDetail answer with no post in it"
    if key is None:
        counts["unsorted"] += 1
        target = raw_store.write_answer(batch, f"unsorted-{counts['unsorted']:04d}.json", body)
        progress.bad_pages.append(f"{source}: {why} (kept as {target.name})")
        return
    counts[(kind, key)] += 1
    if kind == FOLDER_TIMELINE:
        raw_store.write_answer(batch, f"folder-{key}-{counts[(kind, key)]:04d}.json", body)
        progress.folders_done.append(key)
    else:
        n = counts[(kind, key)]
        raw_store.write_answer(batch, f"thread-{key}.json" if n == 1 else f"thread-{key}-{n}.json", body)
        progress.threads.append(key)


def set_aside_earlier_attempt(raw_store: RawStore, batch: str) -> Path | None:
    """Move the pages of an earlier attempt at this batch (a retry, a
    re-materialization) out of the way, so that pages of two attempts never
    mix. Raw files are never deleted: they go to .superseded/."""
    folder = raw_store.batch_dir(batch)
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = raw_store.x_dir() / ".superseded" / f"{batch}-{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(folder, target)
    return target


def capture_metadata(progress: CaptureProgress, batch_dir: Path, answers: int = 0) -> dict:
    return {
        "answers": answers,  # folder lists, folder pages and threads: the batch holds them besides the pages
        "folders": len(progress.folders),
        "folders_read": len(progress.folders_done),
        "folder_notes": dg.MetadataValue.json(progress.folder_notes[:METADATA_LIST_LIMIT]),
        "threads_read": len(progress.threads),
        "thread_notes": dg.MetadataValue.json(progress.thread_notes[:METADATA_LIST_LIMIT]),
        "pages": len(progress.pages),
        "tweets": len(progress.tweet_ids),
        "met_watermark": progress.met_watermark,
        "complete": progress.complete,
        "stop_reason": progress.stop_reason,
        "bad_pages": len(progress.bad_pages),
        # "<file>: <reason>" for each page that is not a Bookmarks page: the end report names them.
        "unreadable_pages": dg.MetadataValue.json(progress.bad_pages[:METADATA_LIST_LIMIT]),
        "rate_limit_waits": len(progress.rate_limit_waits),
        "batch_dir": dg.MetadataValue.path(str(batch_dir)),
    }


@dg.asset(
    partitions_def=sync_batches,
    group_name="x",
    kinds={"playwright", "json"},
    description="Raw X GraphQL answers of one sync batch, kept as they came: Bookmarks pages, the folder list "
                "and each folder's pages, and TweetDetail answers of bookmarked threads.",
)
def x_raw_pages(
    context: dg.AssetExecutionContext,
    config: CaptureConfig,
    browser: BrowserResource,
    raw_store: RawStoreResource,
) -> dg.MaterializeResult:
    if config.files:
        # Before any write: the launchpad of the UI can set these paths too.
        check_import_files(config.files)
    browser, raw_store = browser.get_client(), raw_store.get_client()
    batch = context.partition_key
    mode = "files" if config.files else "browser"
    moved = set_aside_earlier_attempt(raw_store, batch)
    if moved:
        context.log.warning(f"Batch {batch} held pages of an earlier attempt; they are kept in {moved}.")
    # Before this batch's first manifest: the last capture before this one.
    resume = None if config.files else raw_store.resume_point(full=config.full)
    previous = None if config.files else raw_store.last_browser_capture()
    if resume is not None:
        context.log.info(f"Batch {resume.batch} did not complete: this capture goes on from its last kept page.")
    manifest = CaptureManifest(batch=batch, mode=mode, full=config.full, complete=False, started_at=now_iso(),
                               error="the capture started and did not finish",
                               resumed_from=resume.batch if resume else None)
    # A manifest first, so that a capture that is killed is seen as cut off.
    raw_store.write_manifest(manifest)

    watermark = None if (config.full or config.files) else raw_store.watermark()
    progress = CaptureProgress()
    try:
        if config.files:
            progress = import_files(raw_store, batch, config.files, context.log)
        else:
            capture = BookmarksCapture(raw_store=raw_store, batch=batch,
                                       watermark_id=watermark["tweet_id"] if watermark else None,
                                       max_pages=config.max_pages, log=context.log, resume=resume)
            progress = capture.progress
            extras = ExtraReads(raw_store=raw_store, batch=batch, progress=progress, log=context.log,
                                previous=previous)
            with browser.x_context() as x:
                extras.folder_list.attach(x)  # the bookmarks page asks for the folder list at load
                capture.run(x)
                extras.run(x)
        manifest.error = None
    except BaseException as exc:
        manifest.error = str(exc.description if isinstance(exc, dg.Failure) else exc) or type(exc).__name__
        raise_as = exc
    else:
        raise_as = None
    finally:
        manifest.pages = list(progress.pages)
        manifest.complete = progress.complete and manifest.error is None
        manifest.met_watermark = progress.met_watermark
        manifest.folders, manifest.folders_done = list(progress.folders), list(progress.folders_done)
        manifest.threads = list(progress.threads)
        manifest.resume_cursor = None if manifest.complete else progress.resume_cursor
        if progress.newest:
            manifest.newest_tweet_id, manifest.newest_sort_index = progress.newest
        manifest.finished_at = now_iso()
        raw_store.write_manifest(manifest)  # the manifest comes last

    metadata = capture_metadata(progress, raw_store.batch_dir(batch), answers=len(raw_store.answers(batch)))
    if raise_as is not None:
        if isinstance(raise_as, dg.Failure) or not isinstance(raise_as, Exception):
            raise raise_as  # already clear (bad import input), or KeyboardInterrupt/SystemExit
        raise dg.Failure(
            description=(f"The capture of batch {batch} was cut off after {len(progress.pages)} pages: "
                         f"{manifest.error} The pages are kept; the watermark did not move."),
            metadata=metadata,
        ) from raise_as

    if mode == "browser" and manifest.complete and progress.newest:
        raw_store.move_watermark(progress.newest[0], progress.newest[1], batch)
    elif not manifest.complete:
        context.log.warning(f"Batch {batch} is not complete ({progress.stop_reason}); the watermark did not move.")
    return dg.MaterializeResult(metadata=metadata)
