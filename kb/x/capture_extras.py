"""The folder and thread reads that follow a bookmarks capture in the same
browser context (kb/x/capture_run.py gives the rules): the folder list and
each folder to its end, then the TweetDetail answer of the newest
bookmarked posts with replies."""

from __future__ import annotations

import re
import time

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, Response

from kb.x.browser import XContext
from kb.x.capture import BookmarksCapture, CaptureProgress, CaptureRules
from kb.x.capture_traffic import (BOOKMARKS_PATH, FIRST_BACKOFF_S, MAX_BACKOFF_S, POLL_MS, BookmarksTraffic,
                                  CaptureCutOff, RateLimited, Timeline, WaitBudgetSpent, check_wait_budget,
                                  close_pages, folder_timeline, pause, rate_limit_wait, request_variables, sleep_for)
from kb.x.folder_list import parse_folder_list
from kb.x.graphql import FOLDER_LIST, POST_ID, TWEET_DETAIL, PageShapeError, load_page
from kb.x.raw_store import CaptureManifest, RawStore

# An X handle: the thread read opens x.com/<handle>/status/<id>. A handle of
# another form (from a hostile page) is not put into a path.
HANDLE = re.compile(r"^[A-Za-z0-9_]{1,15}$")


class ExtraReads:
    """The folder and thread reads that follow a bookmarks capture in the
    same browser context. They share the capture's wait budget. A limit or
    an error stops them, and is named: it never fails the batch, whose
    bookmarks are complete."""

    def __init__(self, *, raw_store: RawStore, batch: str, progress: CaptureProgress, log,
                 previous: CaptureManifest | None, rules: CaptureRules) -> None:
        self.raw_store = raw_store
        self.batch = batch
        self.progress = progress
        self.log = log
        self.previous = previous
        self.rules = rules
        self.timeout_s = rules.timeout_s
        self.max_wait_s = rules.max_wait_s
        self.read_folders = rules.read_folders
        self.thread_reads = rules.thread_reads
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
                                       log=self.log, timeline=folder_timeline(folder_id), rules=self.rules,
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
            pause(x)
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
            pause(x)
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




def thread_targets(with_replies: list[tuple[str, str]], read: set[str], limit: int) -> list[tuple[str, str]]:
    """The posts whose thread to read: newest first, each once, none that a
    batch holds already, at most `limit`. An id that is not a number (a
    hostile page) is never put into an address or a file name."""
    todo: dict[str, str] = {}
    for tweet_id, handle in with_replies:
        if POST_ID.match(tweet_id) and tweet_id not in read and tweet_id not in todo:
            todo[tweet_id] = handle if HANDLE.match(handle) else "i"  # x.com/i/status/<id> opens any post
    return list(todo.items())[:limit]
