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

With `files`, the asset imports saved Bookmarks pages byte for byte, with no
browser (the demo and `kb import`). An import does not move the watermark:
we cannot know that the files reach down to the last capture, and a
watermark above a gap would hide that gap from every later sync.
"""

# No `from __future__ import annotations` here: Dagster reads the type of
# the `config` parameter at definition time and cannot resolve a string.
import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from email.utils import parsedate_to_datetime
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import dagster as dg
from pydantic import Field
from playwright.sync_api import Page, Request, Response

from kb_assets.partitions import sync_batches
from kb.x_graphql import PageShapeError, is_bookmarks_response, load_page, summarize_page
from kb.browser import XContext
from kb.raw_store import CaptureManifest, RawStore
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


class CaptureConfig(dg.Config):
    full: bool = Field(False, description="Ignore the watermark and capture to the end. Normalize marks bookmarks that are gone.")
    files: list[str] = Field(default_factory=list, description="Import these saved Bookmarks pages byte for byte, with no browser.")
    max_pages: int = Field(0, description="Stop after this many pages (0: no limit). Such a capture is not complete.")


class CaptureCutOff(RuntimeError):
    """The capture stopped before it met the watermark or the end."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def request_cursor(url: str) -> str | None:
    """The `cursor` in the `variables` JSON of a GraphQL GET URL, or None."""
    values = parse_qs(urlsplit(url).query).get("variables")
    if not values:
        return None
    try:
        variables = json.loads(values[0])
    except ValueError:
        return None
    cursor = variables.get("cursor") if isinstance(variables, dict) else None
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
    """X answered HTTP 429 for a Bookmarks page."""

    def __init__(self, wait_s: float, number: int) -> None:
        super().__init__(f"X answered HTTP 429 (rate limit) for Bookmarks page {number}")
        self.wait_s = wait_s
        self.number = number


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

    def add_tweets(self, tweets: list[tuple[str, str]]) -> None:
        if self.newest is None and tweets:
            self.newest = tweets[0]
        self.tweet_ids.update(tweet_id for tweet_id, _ in tweets)


class BookmarksTraffic:
    """Event handlers for the Bookmarks GraphQL traffic of a context.

    The handlers ONLY append. Hard-won fact: to read a response body inside
    a Playwright event handler deadlocks or races the sync API, so the
    capture loop reads bodies later, in the main flow."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, Request]] = []
        self.responses: list[Response] = []
        self.failures: list[Request] = []
        self.finished: list[Request] = []

    @staticmethod
    def wanted(request: Request) -> bool:
        # The query ID in the URL changes with each X deploy: match the
        # operation name only. OPTIONS is a CORS preflight, not a page.
        return request.method != "OPTIONS" and is_bookmarks_response(request.url)

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

    def attach(self, x: XContext) -> None:
        x.context.on("request", self.on_request)
        x.context.on("response", self.on_response)
        x.context.on("requestfailed", self.on_request_failed)
        x.context.on("requestfinished", self.on_request_finished)

    def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest Bookmarks request that has no answer yet."""
        answered = {id(r.request) for r in self.responses} | {id(r) for r in self.failures}
        answered |= {id(r) for r in self.finished}
        pending = [t for t, request in self.requests if id(request) not in answered]
        return time.monotonic() - min(pending) if pending else None


class BookmarksCapture:
    """One browser capture of the bookmarks timeline into one batch."""

    def __init__(self, *, raw_store: RawStore, batch: str, watermark_id: str | None, max_pages: int,
                 log, resume: CaptureManifest | None = None) -> None:
        settings = get_settings()
        self.raw_store = raw_store
        self.batch = batch
        self.watermark_id = watermark_id
        self.max_pages = max_pages
        self.log = log
        self.scroll_wait_s = settings.kb_capture_scroll_wait_s
        self.max_idle_scrolls = settings.kb_capture_max_idle_scrolls
        self.timeout_s = settings.kb_browser_timeout_s
        self.progress = CaptureProgress()
        self.traffic = BookmarksTraffic()
        self.max_wait_s = settings.kb_capture_max_wait_s
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
        x.context.route(lambda url: is_bookmarks_response(url), self._start_at_cursor)
        while True:
            try:
                return self._run_page(x)
            except RateLimited as limit:
                self._wait_for_rate_limit(x, limit)

    def _start_at_cursor(self, route) -> None:
        """Send the X client's first Bookmarks request (no cursor) to the
        cursor where this capture goes on. Other requests pass unchanged."""
        request = route.request
        if self.start_cursor and request.method == "GET" and request_cursor(request.url) is None:
            route.fallback(url=with_cursor(request.url, self.start_cursor))
        else:
            route.fallback()

    def _wait_for_rate_limit(self, x: XContext, limit: RateLimited) -> None:
        waited = sum(self.progress.rate_limit_waits)
        if waited + limit.wait_s > self.max_wait_s:
            raise CaptureCutOff(
                f"{limit} and asks to wait {limit.wait_s:.0f} s; this capture has waited {waited:.0f} s of "
                f"KB_CAPTURE_MAX_WAIT_S={self.max_wait_s:g}. The next sync goes on from the last kept page.")
        self.log.warning(f"{limit}: waiting {limit.wait_s:.0f} s, then going on from the last kept page.")
        self.progress.rate_limit_waits.append(limit.wait_s)
        self.backoff_s = min(MAX_BACKOFF_S, self.backoff_s * 2)
        for page in list(x.context.pages):
            page.close()  # the X client shows an error and asks for no more pages
        self.traffic.reset()
        if self.last_bottom_cursor:
            self.start_cursor = self.last_bottom_cursor
        deadline = time.monotonic() + limit.wait_s
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _run_page(self, x: XContext) -> CaptureProgress:
        page = x.open(BOOKMARKS_PATH)
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
        """Write one Bookmarks page as it came. True when the capture must stop."""
        number = len(self.progress.pages) + 1
        if response.status == 429:
            raise RateLimited(rate_limit_wait(response.headers, self.backoff_s), number)
        if response.status != 200:
            raise CaptureCutOff(f"X answered HTTP {response.status} for Bookmarks page {number} ({response.url[:120]}).")
        self._wait_for_body(page, response, number)
        body = response.body()  # main flow: safe here, not in the handler
        path = self.raw_store.write_page(self.batch, number, body)
        self.progress.pages.append(path.name)
        try:
            summary = summarize_page(load_page(body, name=path.name), name=path.name)
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
                f"No Bookmarks page came from X after {idle_scrolls} scrolls (the browser is at {page.url}). "
                "If the X login expired, run `kb login`."
            )
        if self.last_bottom_cursor:
            # X gave a cursor to go on, but did not ask for the next page: a
            # stall, not the end. To call it the end would move the watermark
            # over bookmarks we never saw, or mark them removed after --full.
            raise CaptureCutOff(
                f"X loaded no new Bookmarks page after {idle_scrolls} scrolls, and the last page "
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
                    f"X did not answer Bookmarks page {len(self.progress.pages) + 1} within {self.timeout_s:g} s."
                )
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
                raise CaptureCutOff(f"The body of Bookmarks page {number} did not come within {self.timeout_s:g} s.")
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
                f"The request for Bookmarks page {len(self.progress.pages) + 1} failed: {request.failure or 'no answer'}."
            )

    def _raise_if_logged_out(self, page: Page) -> None:
        path = urlsplit(page.url).path
        if any(path.startswith(p) for p in LOGIN_PATHS):
            raise CaptureCutOff(f"X sent the browser to its sign-in page ({path}): the login expired. Run `kb login`.")


def import_files(raw_store: RawStore, batch: str, files: list[str], log) -> CaptureProgress:
    """Copy saved Bookmarks pages into the batch, byte for byte. A page that
    does not parse is kept too; normalize reports it."""
    paths = [Path(f).expanduser() for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise dg.Failure(description=f"Cannot import: no such file: {', '.join(missing)}. Nothing was imported.")
    progress = CaptureProgress()
    for number, source in enumerate(paths, start=1):
        body = source.read_bytes()
        target = raw_store.write_page(batch, number, body)
        progress.pages.append(target.name)
        try:
            progress.add_tweets(summarize_page(load_page(body, name=str(source)), name=str(source)).tweets)
        except PageShapeError as exc:
            progress.bad_pages.append(str(exc))
            log.warning(f"Kept {target.name} as it came, but it is not a Bookmarks page: {exc}")
    progress.complete = True
    progress.stop_reason = f"imported {len(paths)} files"
    return progress


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


def capture_metadata(progress: CaptureProgress, batch_dir: Path) -> dict:
    return {
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
    description="Raw X Bookmarks GraphQL pages of one sync batch, kept as they came.",
)
def x_raw_pages(
    context: dg.AssetExecutionContext,
    config: CaptureConfig,
    browser: BrowserResource,
    raw_store: RawStoreResource,
) -> dg.MaterializeResult:
    browser, raw_store = browser.get_client(), raw_store.get_client()
    batch = context.partition_key
    mode = "files" if config.files else "browser"
    moved = set_aside_earlier_attempt(raw_store, batch)
    if moved:
        context.log.warning(f"Batch {batch} held pages of an earlier attempt; they are kept in {moved}.")
    # Before this batch's first manifest: the last capture before this one.
    resume = None if config.files else raw_store.resume_point(full=config.full)
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
            with browser.x_context() as x:
                capture.run(x)
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
        manifest.resume_cursor = None if manifest.complete else progress.resume_cursor
        if progress.newest:
            manifest.newest_tweet_id, manifest.newest_sort_index = progress.newest
        manifest.finished_at = now_iso()
        raw_store.write_manifest(manifest)  # the manifest comes last

    metadata = capture_metadata(progress, raw_store.batch_dir(batch))
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
