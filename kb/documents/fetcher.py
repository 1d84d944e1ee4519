"""One fetch run: read the addresses that wait, fetch them (X Articles in
the X context, the other links in a pool of clean contexts, at the same
time), write the results as they come, and report what happened."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from kb.documents.document_store import OutcomeWriter, fetchable, targets_for_batch
from kb.documents.outcomes import Outcome, Target, one_outcome
from kb.documents.web_links import fetch_links
from kb.documents.x_articles import article_from_content_state, fetch_articles
from kb.store.duckdb_store import DuckDBStore
from kb.settings import Settings, get_settings
from kb.x.browser import Browser, XLoginMissing

log = logging.getLogger(__name__)


@dataclass
class FetchReport:
    """What one fetch run did. `errors` holds what stopped a part of the
    run (the browser did not start, the X context failed): the addresses
    that it did not fetch have no row, so the next run fetches them."""

    targets: list[Target]
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    articles_waiting_for_login: int = 0
    groups_written: int = 0
    waiting: int = 0  # the addresses of the batch that still wait after the run (over `limit`, the X login)


def fetch_documents(duckdb: DuckDBStore, browser: Browser, batch: str, *, retry: bool = False, limit: int = 0, workers: int = 4, skip: frozenset[str] | set[str] = frozenset(),
                    settings: Settings | None = None, logger: logging.Logger | logging.LoggerAdapter = log
                    ) -> FetchReport:
    """Fetch the addresses of `batch` that wait, with the failed ones when
    `retry`, at most `limit` (0: all), leaving out the source kinds in
    `skip`. The results go to DuckDB in groups under `batch`. The addresses
    of other batches wait for the runs of their own batches."""
    settings = settings or get_settings()
    with duckdb.connect() as conn:
        targets = targets_for_batch(conn, batch, retry=retry)
    targets = fetchable(targets, set(skip))
    all_targets = len(targets)
    if limit > 0:
        targets = targets[:limit]
    from_state = [t for t in targets if t.is_article and t.article_text]
    articles = [t for t in targets if t.is_article and not t.article_text]
    links = [t for t in targets if not t.is_article]
    logger.info(
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
        errors = fetch_links(links, browser, settings, max(1, workers), writer.add)
        x_thread.join()
    finally:
        # Write what was fetched before any error is raised: nothing is lost,
        # and the rest waits for the next run.
        writer.flush()
    report = FetchReport(targets, writer.outcomes, errors, groups_written=writer.groups_written)
    if isinstance(rendered.get("error"), XLoginMissing):
        # Not a failure of the articles: they wait for `kb login`, and the
        # next run tries them without `retry`.
        report.articles_waiting_for_login = len(articles)
        logger.warning(f"{len(articles)} X Articles wait: {rendered['error']}")
    elif "error" in rendered:
        errors.append(rendered["error"])
    report.waiting = all_targets - len(report.outcomes)
    return report
