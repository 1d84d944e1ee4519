"""Asset `documents`: the full text behind the links and X Articles of the
bookmarks.

For each web address that a bookmark of the partition links to:
- An X Article whose GraphQL content_state the capture kept: that text is
  the document. It is the authoritative copy; no page is opened.
- Any other X Article: the X context renders it, one page at a time (X
  throttles one login across browsers), and never scrolls (the article view
  unmounts what is off screen). While the page renders, the GraphQL answer
  that carries the article (its content_state) is kept as a raw file
  (raw/x-articles/<id>.json), and its text is the document: it is the
  authoritative copy, and it proves that the render was complete. Only
  when no such answer came does the text come from the page (the DOM).
  Why: a Bookmarks page carries only the title and preview of an article.
- A file (by its Content-Type): fetched with httpx, not rendered. A PDF goes
  through pymupdf4llm; any other file fails as `binary`.
- Any other page: the clean context (no storage state) renders it, with
  several workers. A page that is thin at domcontentloaded is read once more
  at networkidle: many pages fill in their text with JavaScript.

Every connection goes through the fetch guard (kb/fetch_guard.py): a link,
a redirect or a page's script that goes to a loopback, private or cloud
metadata address fails with the reason "private address", which names the
host and the address.

Each address is fetched once. A failure is stored with its reason and is
tried again only on request (run config `retry`). Links to X posts are not
documents: the capture holds the posts that the owner sees (quoted posts).

The asset holds no DuckDB connection (so no writer lock) while it fetches:
it reads the addresses, closes, fetches, and writes the results in groups
as they come (WRITE_EVERY results, or WRITE_EVERY_S seconds), each group in
one short transaction. A killed or timed-out run loses at most one group;
the next run fetches only the addresses with no row. Only a small summary
of each result stays in memory.
"""

# No `from __future__ import annotations`: Dagster reads the config class
# from the real annotation of the asset function.
import contextlib
import json
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

import dagster as dg
import duckdb
import httpx
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from kb_assets.enrich.enrichment import (WaitingConfig, failure_line, failure_list, from_batches, goes_on_after_failure,
                                         service_stopped, with_checks)
from kb_assets.run_choices import EXCLUDE_TAG
from kb.enrich.extract import (
    Extracted,
    Reason,
    extract_html,
    extract_pdf,
    extracted_from_text,
    http_reason,
    is_pdf,
    looks_blocked,
    rewrite_arxiv,
)
from kb_assets.partitions import sync_batches
from kb.atomic_files import write_atomic
from kb.x.browser import Browser, XLoginMissing, navigation_refusal, watch_navigation
from kb.fetch_guard import FetchGuard, FetchRefused
from kb.x.graphql import articles_in
from kb.duckdb_store import DuckDBStore, insert_rows
from kb.settings import Settings, excluded_sources, get_settings
from kb_resources.services import BrowserResource
from kb_resources.stores import DuckDBResource

# Some servers refuse clients that do not look like a browser. The probe and
# file downloads send the same User-Agent as a desktop Chrome.
USER_AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
)
# A larger download is not a document that a person reads.
MAX_FILE_BYTES = 50 * 1024 * 1024
# Content types that the browser shows as a page.
PAGE_TYPES = ("application/xhtml+xml", "application/xml", "application/json")

# An X Article, by the kind that normalization gave the link or by its path.
IS_X_ARTICLE = "(l.kind = 'article' OR regexp_matches(l.url_norm, '^https://x\\.com/(i/article|[^/]+/article)/'))"
# normalize_url() writes every X host as https://x.com.
IS_X = "regexp_matches(l.url_norm, '^https://x\\.com(/|$)')"

# The addresses that can have a document, one row each. Links to X posts are
# left out (the capture holds the posts); X Articles are kept. The links of
# removed bookmarks are left out. The coverage check uses the same rule.
ELIGIBLE_LINKS = f"""
    SELECT l.url_norm,
           min(l.expanded_url) AS url,
           min(l.batch) AS batch,
           bool_or({IS_X_ARTICLE}) AS is_article,
           any_value(b.article_title) FILTER (WHERE b.article_text <> '') AS article_title,
           any_value(b.article_text) FILTER (WHERE b.article_text <> '') AS article_text
    FROM links l
    LEFT JOIN bookmarks b ON b.tweet_id = l.tweet_id AND l.kind = 'article'
    WHERE NOT EXISTS (SELECT 1 FROM bookmarks r WHERE r.tweet_id = l.tweet_id AND r.removed_at IS NOT NULL)
      {{batch_filter}}
    GROUP BY l.url_norm
    HAVING bool_or({IS_X_ARTICLE}) OR NOT bool_or({IS_X})
"""


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


# --- reading and writing DuckDB -----------------------------------------------

def targets_for_batch(conn: duckdb.DuckDBPyConnection, batch: str | None, *, retry: bool) -> list[Target]:
    """The addresses of the batch (None: of every batch) that still need a
    fetch: never fetched, or failed when `retry` is set. Oldest batch first."""
    rows = conn.execute(
        f"""WITH eligible AS ({ELIGIBLE_LINKS.format(batch_filter="AND (? OR l.batch = ?)")})
            SELECT e.url_norm, e.url, e.is_article, e.article_title, e.article_text, coalesce(d.attempts, 0),
                   e.batch
            FROM eligible e LEFT JOIN documents d ON d.url_norm = e.url_norm
            WHERE d.url_norm IS NULL OR (d.status = 'failed' AND ?)
            ORDER BY e.batch, e.url_norm""",
        [batch is None, batch or "", retry],
    ).fetchall()
    return [Target(*row) for row in rows]


def fetchable(targets: list[Target], skip: set[str]) -> list[Target]:
    """The targets of the source kinds that are not excluded: an excluded
    kind is not fetched at all (config.toml `exclude`, or `--no-link` /
    `--no-article` for one run)."""
    if "article" in skip:
        targets = [t for t in targets if not t.is_article]
    if "link" in skip:
        targets = [t for t in targets if t.is_article]
    return targets


def write_outcomes(conn: duckdb.DuckDBPyConnection, outcomes: Iterable[Outcome], batch: str) -> None:
    now = datetime.now(timezone.utc)
    insert_rows(conn, "documents", [o.row(batch, now) for o in outcomes])


def one_outcome(make: Callable[[Target], Outcome], target: Target, *, kind: str, source: str) -> Outcome:
    """make(target), or a failed outcome with the error: one bad address
    must not stop the others."""
    try:
        return make(target)
    except Exception as exc:
        return Outcome(target, url=target.url, kind=kind, source=source, reason=Reason.ERROR.value,
                       detail=f"{type(exc).__name__}: {exc}"[:500])


# A killed run loses at most this many results, or this many seconds of fetching.
WRITE_EVERY = 20
WRITE_EVERY_S = 60.0


class OutcomeWriter:
    """Writes the outcomes of the fetching threads in groups, each group in
    its own short transaction (see the module text). It keeps every outcome
    for the end report, without its text once written."""

    def __init__(self, duckdb: DuckDBStore, batch: str):
        self.duckdb = duckdb
        self.batch = batch
        self.outcomes: list[Outcome] = []
        self.groups_written = 0
        self._pending: list[Outcome] = []
        self._lock = threading.Lock()
        self._since = time.monotonic()

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)
            self._pending.append(outcome)
            if len(self._pending) >= WRITE_EVERY or time.monotonic() - self._since >= WRITE_EVERY_S:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self._since = time.monotonic()
        if not self._pending:
            return
        try:
            with self.duckdb.transaction() as conn:
                write_outcomes(conn, self._pending, self.batch)
        except duckdb.Error:
            self._write_one_by_one()
        for outcome in self._pending:
            outcome.extracted = None  # the text is in DuckDB now; the report needs the summary only
        self._pending = []
        self.groups_written += 1

    def _write_one_by_one(self) -> None:
        """A group that DuckDB refused: each result alone, so that one bad
        row fails only its own address (stored as failed, with the error)."""
        for outcome in self._pending:
            try:
                with self.duckdb.transaction() as conn:
                    write_outcomes(conn, [outcome], self.batch)
            except duckdb.Error as exc:
                outcome.extracted, outcome.reason = None, Reason.ERROR.value
                outcome.detail = f"the result could not be stored: {exc}"[:500]
                with self.duckdb.transaction() as conn:
                    write_outcomes(conn, [outcome], self.batch)


# --- X Articles ------------------------------------------------------------------

def article_from_content_state(target: Target) -> Outcome:
    outcome = Outcome(target, url=target.url, kind="article", source="content_state")
    outcome.extracted = extracted_from_text(target.article_text or "", target.article_title)
    return judged(outcome)


def x_path(url: str) -> str:
    """The path and query of an X address. The X context joins it to its own
    origin (KB_X_BASE_URL), so tests can serve X on loopback."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def fetch_articles(targets: list[Target], browser: Browser, settings: Settings,
                   record: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Render X Articles in the X context, one at a time, never scrolling.
    Each outcome goes to `record` as it comes. Raises XLoginMissing when
    there is no saved login."""
    if not targets:
        return []
    outcomes = _Recorded(record)
    with browser.x_context() as x:
        statuses: dict[str, int] = {}

        def remember_status(response) -> None:
            # An event handler only records: a call back into Playwright here
            # can deadlock.
            if response.request.is_navigation_request() and response.frame.parent_frame is None:
                statuses["main"] = response.status

        x.context.on("response", remember_status)
        graphql = ArticleTraffic()
        graphql.attach(x.context)
        for target in targets:
            outcome = Outcome(target, url=target.url, kind="article", source="browser")
            statuses.clear()
            graphql.clear()
            try:
                page = x.open(x_path(target.url))
            except PlaywrightError as exc:
                outcomes.add(failure_from_error(outcome, exc))
                continue
            except Exception as exc:  # the X context left X, or any other fault
                outcome.reason, outcome.detail = Reason.ERROR.value, str(exc)[:500]
                outcomes.add(outcome)
                continue
            try:
                rendered = read_rendered(page, outcome, statuses.get("main"), settings)
                outcomes.add(article_from_graphql(target, graphql, page, settings) or rendered)
            except Exception as exc:  # one bad page must not lose the others
                outcome.reason, outcome.detail = Reason.ERROR.value, f"{type(exc).__name__}: {exc}"[:500]
                outcomes.add(outcome)
            finally:
                page.close()
    return outcomes.all


class _Recorded:
    """The outcomes of one thread, each also handed to `record` as it comes."""

    def __init__(self, record: Callable[[Outcome], None] | None):
        self.all: list[Outcome] = []
        self.record = record

    def add(self, outcome: Outcome) -> None:
        self.all.append(outcome)
        if self.record is not None:
            self.record(outcome)


class ArticleTraffic:
    """The GraphQL answers of the X context while an article renders.
    The handlers ONLY append: to read a body inside a Playwright event
    handler deadlocks or races the sync API (see kb_assets/x/raw_pages.py)."""

    def __init__(self) -> None:
        self.responses: list = []
        self.finished: list = []

    def attach(self, context) -> None:
        context.on("response", self._on_response)
        context.on("requestfinished", self._on_finished)

    def clear(self) -> None:
        self.responses.clear()
        self.finished.clear()

    def _on_response(self, response) -> None:
        if "/i/api/graphql/" in response.url and response.request.method == "GET" and response.status == 200:
            self.responses.append(response)

    def _on_finished(self, request) -> None:
        if "/i/api/graphql/" in request.url:
            self.finished.append(request)

    def bodies(self, page: Page, timeout_s: float) -> list[bytes]:
        """The bodies that came complete. response.body() has no timeout, so
        wait for "requestfinished" first, up to the browser timeout."""
        deadline = time.monotonic() + timeout_s
        done = lambda r: any(f is r.request for f in self.finished)  # noqa: E731
        while not all(done(r) for r in self.responses) and time.monotonic() < deadline:
            page.wait_for_timeout(25)
        return [r.body() for r in list(self.responses) if done(r)]


def article_id_of(url: str) -> str:
    """The id in /i/article/<id> or /<handle>/article/<id>."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    return parts[parts.index("article") + 1] if "article" in parts[:-1] else ""


def article_from_graphql(target: Target, traffic: ArticleTraffic, page: Page, settings: Settings) -> Outcome | None:
    """The document from the GraphQL answer that carries this article, kept
    as a raw file; None when no answer with its text came."""
    wanted = article_id_of(target.url)
    for body in traffic.bodies(page, settings.kb_browser_timeout_s):
        try:
            payload = json.loads(body)
        except ValueError:
            continue
        for article in articles_in(payload):
            if not article["article_text"] or (wanted and article["article_id"] != wanted):
                continue
            write_atomic(settings.raw_dir / "x-articles" / f"{article['article_id'] or wanted}.json", body)
            outcome = Outcome(target, url=target.url, kind="article", source="graphql", final_url=page.url)
            outcome.extracted = extracted_from_text(article["article_text"], article["article_title"])
            return judged(outcome)
    return None


# --- other links -------------------------------------------------------------------

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
            data = bytearray()
            for block in response.iter_bytes():
                data += block
                if len(data) > MAX_FILE_BYTES:
                    outcome.reason = Reason.ERROR.value
                    outcome.detail = f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MB"
                    return outcome
    except httpx.TimeoutException as exc:
        outcome.reason, outcome.detail = Reason.TIMEOUT.value, str(exc)[:500] or "timed out"
        return outcome
    except httpx.HTTPError as exc:
        outcome.reason, outcome.detail = Reason.ERROR.value, f"{type(exc).__name__}: {exc}"[:500]
        return outcome
    except FetchRefused as exc:  # a redirect to a private address
        return refused(outcome, exc)
    if not is_pdf(bytes(data)):
        outcome.reason = Reason.BINARY.value
        outcome.detail = f"not a PDF: {response.headers.get('content-type', 'no content type')}"
        return outcome
    outcome.kind = "pdf"
    try:
        outcome.extracted = extract_pdf(bytes(data), outcome.url)
    except ValueError as exc:
        outcome.reason, outcome.detail = Reason.BINARY.value, str(exc)[:500]
        return outcome
    return judged(outcome)


def refused(outcome: Outcome, exc: FetchRefused) -> Outcome:
    """A failure with the guard's reason ("private address"): never a silent skip."""
    outcome.reason, outcome.detail = exc.reason, str(exc)[:500]
    return outcome


def fetch_link(get_context: Callable, client: httpx.Client, target: Target, settings: Settings,
               guard: FetchGuard | None = None) -> Outcome:
    """Fetch one address that is not on X: as a file, or rendered. The
    client and the browser context connect through the fetch guard; a link,
    a redirect or a script navigation to a private address fails with the
    reason "private address"."""
    url = rewrite_arxiv(target.url, arxiv_hosts(settings))
    outcome = Outcome(target, url=url, kind="link", source="browser")
    try:
        (guard or FetchGuard.from_settings(settings)).check_url(url)
        what, content_type = probe(client, url)
    except FetchRefused as exc:
        return refused(outcome, exc)
    if what == "binary":
        outcome.source, outcome.reason, outcome.detail = "file", Reason.BINARY.value, content_type
        return outcome
    if what == "pdf":
        return fetch_file(client, outcome)
    page = get_context().new_page()
    watch_navigation(page)
    try:
        try:
            response = page.goto(url, wait_until="domcontentloaded", timeout=settings.kb_browser_timeout_s * 1000)
        except PlaywrightError as exc:
            if (refusal := navigation_refusal(page, url)) is not None:
                return refused(outcome, refusal)
            if "Download is starting" in str(exc):
                # The probe saw a page, but the server sent a file.
                return fetch_file(client, outcome)
            return failure_from_error(outcome, exc)
        outcome = read_rendered(page, outcome, response.status if response else None, settings)
        if (refusal := navigation_refusal(page, url)) is not None:
            # A redirect or a script took the page to a private address.
            outcome.extracted = None
            return refused(outcome, refusal)
        return outcome
    finally:
        page.close()


def read_rendered(page: Page, outcome: Outcome, status: int | None, settings: Settings) -> Outcome:
    """Extract the main content of a loaded page. A page that is thin at
    domcontentloaded is read once more at networkidle."""
    outcome.final_url = page.url
    outcome.wait = "domcontentloaded"
    html = page_html(page)
    outcome.extracted = extract_html(html, page.url)
    if (status is None or status < 400) and outcome.extracted.thin:
        try:
            page.wait_for_load_state("networkidle", timeout=settings.kb_browser_timeout_s * 1000)
        except PlaywrightError:
            pass  # a page that polls never goes idle: read what it shows now
        outcome.wait = "networkidle"
        outcome.final_url = page.url
        html = page_html(page)
        outcome.extracted = extract_html(html, page.url)
    if not outcome.extracted.title:
        with contextlib.suppress(PlaywrightError):
            title = page.title().strip()
            if title:
                outcome.extracted = Extracted(
                    outcome.extracted.text_html, outcome.extracted.text, title, outcome.extracted.word_count
                )
    return judged(outcome, html, status)


def page_html(page: Page) -> str:
    """The page's HTML. A page that navigates again (a script redirect)
    refuses content() until the new page has loaded."""
    try:
        return page.content()
    except PlaywrightError:
        with contextlib.suppress(PlaywrightError):
            page.wait_for_load_state("domcontentloaded")
        return page.content()


def failure_from_error(outcome: Outcome, exc: Exception) -> Outcome:
    message = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__
    if isinstance(exc, PlaywrightTimeout):
        outcome.reason = Reason.TIMEOUT.value
    elif "ERR_BLOCKED_BY" in message:
        outcome.reason = Reason.BLOCKED.value
    elif "ERR_TIMED_OUT" in message or "ERR_CONNECTION_TIMED_OUT" in message:
        outcome.reason = Reason.TIMEOUT.value
    else:
        outcome.reason = Reason.ERROR.value
    outcome.detail = message
    return outcome


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
    record: Callable[[Outcome], None] | None = None
    targets: queue.Queue = field(default_factory=queue.Queue)
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def work(self) -> None:
        guard = FetchGuard.from_settings(self.settings)
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(
                guard.httpx_client(
                    follow_redirects=True,
                    timeout=self.settings.kb_browser_timeout_s,
                    headers={"User-Agent": USER_AGENT},
                )
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
                    outcome = fetch_link(get_context, client, target, self.settings, guard)
                except BrowserDidNotStart as exc:
                    # No other page can be rendered by this worker either. Its
                    # target stays unfetched (no row), so the next run tries it.
                    with self.lock:
                        self.errors.append(exc)
                    return
                except Exception as exc:  # one bad page must not lose the others
                    outcome = Outcome(target, url=target.url, kind="link", source="browser",
                                      reason=Reason.ERROR.value, detail=f"{type(exc).__name__}: {exc}"[:500])
                with self.lock:
                    self.outcomes.append(outcome)
                if self.record is not None:
                    self.record(outcome)


def fetch_links(targets: list[Target], browser: Browser, settings: Settings, workers: int,
                record: Callable[[Outcome], None] | None = None) -> tuple[list[Outcome], list[BaseException]]:
    """Fetch addresses that are not on X with `workers` threads; each
    outcome goes to `record` as it comes.
    Returns the outcomes, and the errors that stopped a worker."""
    pool = _Pool(browser, settings, record)
    for target in targets:
        pool.targets.put(target)
    threads = [threading.Thread(target=pool.work, name=f"documents-{n}") for n in range(min(workers, len(targets)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return pool.outcomes, pool.errors


# --- the asset -------------------------------------------------------------------------

class DocumentsConfig(WaitingConfig):
    retry: bool = False  # fetch the failed addresses again
    limit: int = 0  # most addresses in this run; 0: every address that waits
    workers: int = 4  # clean-context pages at the same time


def fetch_documents(
    context: dg.AssetExecutionContext, config: DocumentsConfig, duckdb: DuckDBResource, browser: BrowserResource
) -> dg.MaterializeResult:
    duckdb, browser = duckdb.get_client(), browser.get_client()
    batch = context.partition_key
    settings = get_settings()
    with duckdb.connect() as conn:
        targets = targets_for_batch(conn, None if config.every_batch else batch, retry=config.retry)

    targets = fetchable(targets, excluded_sources(settings, for_this_run=context.run.tags.get(EXCLUDE_TAG, "")))
    if config.limit > 0:
        targets = targets[:config.limit]
    from_state = [t for t in targets if t.is_article and t.article_text]
    articles = [t for t in targets if t.is_article and not t.article_text]
    links = [t for t in targets if not t.is_article]
    context.log.info(
        f"{len(targets)} addresses to fetch: {len(from_state)} articles from content_state, "
        f"{len(articles)} articles to render, {len(links)} other links"
    )

    writer = OutcomeWriter(duckdb, batch)
    for target in from_state:
        writer.add(one_outcome(article_from_content_state, target, kind="article", source="content_state"))
    # X Articles render in their own thread, one at a time, while the
    # workers of the clean context fetch the other links.
    rendered: dict = {}

    def render_articles() -> None:
        try:
            fetch_articles(articles, browser, settings, writer.add)
        except Exception as exc:
            rendered["error"] = exc

    x_thread = threading.Thread(target=render_articles, name="documents-x")
    x_thread.start()
    try:
        _, errors = fetch_links(links, browser, settings, max(1, config.workers), writer.add)
        x_thread.join()
    finally:
        # Write what was fetched before any error is raised: nothing is lost,
        # and the rest waits for the next run.
        writer.flush()
    outcomes = writer.outcomes
    waiting_for_login = 0
    if isinstance(rendered.get("error"), XLoginMissing):
        # Not a failure of the articles: they wait for `kb login`, and the
        # next run tries them without `retry`.
        waiting_for_login = len(articles)
        context.log.warning(f"{waiting_for_login} X Articles wait: {rendered['error']}")
    elif "error" in rendered:
        errors.append(rendered["error"])

    for outcome in outcomes:
        if not outcome.ok:
            context.log.info(f"{outcome.url}: {outcome.reason} {outcome.detail or ''}".rstrip())
    reasons = Counter(o.reason for o in outcomes if not o.ok)
    metadata = {
        "fetched": len(outcomes),
        "ok": sum(o.ok for o in outcomes),
        "failed": dg.MetadataValue.json(dict(sorted(reasons.items()))),
        "failures": failure_list([failure_line(o.url, o.reason, o.detail) for o in outcomes if not o.ok]),
        "by_kind": dg.MetadataValue.json(dict(Counter(o.kind for o in outcomes if o.ok))),
        "read_at_networkidle": sum(o.wait == "networkidle" and o.ok for o in outcomes),
        "articles_waiting_for_login": waiting_for_login,
        "from_batches": from_batches(t.batch for t in targets),
        "groups_written": writer.groups_written,
        "retry": config.retry,
    }
    if errors:
        return service_stopped(context, f"Some addresses were not fetched: {errors[0]}. The next run fetches them.",
                               metadata)
    return dg.MaterializeResult(metadata=metadata)


def documents_coverage(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    duckdb = duckdb.get_client()
    with duckdb.connect() as conn:
        total, usable, failed = conn.execute(
            f"""WITH eligible AS ({ELIGIBLE_LINKS.format(batch_filter="")})
                SELECT count(*), count(*) FILTER (WHERE d.status = 'ok'), count(*) FILTER (WHERE d.status = 'failed')
                FROM eligible e LEFT JOIN documents d ON d.url_norm = e.url_norm"""
        ).fetchone()
        reasons = dict(conn.execute(
            f"""WITH eligible AS ({ELIGIBLE_LINKS.format(batch_filter="")})
                SELECT d.reason, count(*) FROM eligible e JOIN documents d ON d.url_norm = e.url_norm
                WHERE d.status = 'failed' GROUP BY d.reason ORDER BY d.reason"""
        ).fetchall())
    pending = total - usable - failed
    coverage = usable / total if total else 1.0
    return dg.AssetCheckResult(
        passed=pending == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "coverage": dg.MetadataValue.float(round(coverage, 4)),
            "links": total,
            "usable": usable,
            "failed": failed,
            "pending": pending,
            "failed_by_reason": dg.MetadataValue.json(reasons),
        },
    )


DOCUMENTS_COVERAGE = dg.AssetCheckSpec(
    "documents_coverage", asset="documents",
    description="Share of links with a usable document. It passes when every link has a fetch result: "
    "a dead link is a fault of the web, not of the stage.")


# The coverage check runs in this step: see with_checks().
@dg.asset(
    partitions_def=sync_batches,
    deps=["links", "bookmarks"],
    group_name="enrich",
    kinds={"duckdb", "playwright"},
    description="The main content behind each link and X Article of the bookmarks, "
    "or the reason why there is none. Keyed by the normalized URL.",
    check_specs=[DOCUMENTS_COVERAGE],
)
def documents(
    context: dg.AssetExecutionContext, config: DocumentsConfig, duckdb: DuckDBResource, browser: BrowserResource
) -> dg.MaterializeResult:
    return with_checks(goes_on_after_failure(context, "kb extract", fetch_documents, context, config, duckdb, browser),
                       documents_coverage(duckdb))
