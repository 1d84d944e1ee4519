"""X Articles: the document from the content_state that the capture kept,
or from the GraphQL answer that comes while the X context renders the
article (kept as a raw file), or else from the rendered page."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from kb.store.atomic_files import write_atomic
from kb.documents.outcomes import Outcome, Target, failure_from_error, judged, read_rendered
from kb.enrich.extract import Reason, extracted_from_text
from kb.settings import Settings
from kb.x.browser import Browser
from kb.x.graphql import articles_in


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
                   record: Callable[[Outcome], None]) -> None:
    """Render X Articles in the X context, one at a time, never scrolling.
    Each outcome goes to `record` as it comes. Raises XLoginMissing when
    there is no saved login."""
    if not targets:
        return
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
                record(failure_from_error(outcome, exc))
                continue
            except Exception as exc:  # the X context left X, or any other fault
                outcome.reason, outcome.detail = Reason.ERROR.value, str(exc)[:500]
                record(outcome)
                continue
            try:
                rendered = read_rendered(page, outcome, statuses.get("main"), browser.timeout_s)
                record(article_from_graphql(target, graphql, page, browser.timeout_s, settings) or rendered)
            except Exception as exc:  # one bad page must not lose the others
                outcome.reason, outcome.detail = Reason.ERROR.value, f"{type(exc).__name__}: {exc}"[:500]
                record(outcome)
            finally:
                page.close()


class ArticleTraffic:
    """The GraphQL answers of the X context while an article renders.
    The handlers ONLY append: to read a body inside a Playwright event
    handler deadlocks or races the sync API (the X capture's traffic
    watcher in kb/x keeps the same rule)."""

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


def article_from_graphql(target: Target, traffic: ArticleTraffic, page: Page, timeout_s: float,
                         settings: Settings) -> Outcome | None:
    """The document from the GraphQL answer that carries this article, kept
    as a raw file (settings.raw_dir); None when no answer with its text came."""
    wanted = article_id_of(target.url)
    for body in traffic.bodies(page, timeout_s):
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
