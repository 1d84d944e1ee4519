"""Asset `documents`: the full text behind the links and X Articles of the
bookmarks, or the reason why there is none (kb/documents/ holds the rules).

The asset reads its resources and the run's choices, calls
kb.documents.fetcher.fetch_documents(), and turns its report into Dagster
metadata. The coverage check runs in the same step (see with_checks())."""

# No `from __future__ import annotations`: Dagster reads the config class
# from the real annotation of the asset function.
from collections import Counter

import dagster as dg

from kb.documents.document_store import document_coverage
from kb.documents.fetcher import fetch_documents
from kb_assets.enrich.enrichment import (batches_of_run, coverage_spec, failure_line, failure_list, from_batches,
                                         goes_on_after_failure,
                                         service_stopped, stage_check_spec, with_checks)
from kb_assets.partitions import sync_batches
from kb_assets.run_choices import excluded_in_run
from kb_resources.services import BrowserResource
from kb_resources.stores import DuckDBResource


class DocumentsConfig(dg.Config):
    retry: bool = False  # fetch the failed addresses again
    limit: int = 0  # most addresses in this run; 0: every address that waits
    workers: int = 4  # clean-context pages at the same time


def fetch_batch(
    context: dg.AssetExecutionContext, config: DocumentsConfig, duckdb: DuckDBResource, browser: BrowserResource
) -> dg.MaterializeResult:
    report = fetch_documents(duckdb.get_client(), browser.get_client(), context.partition_key,
                             retry=config.retry, limit=config.limit,
                             workers=config.workers, skip=excluded_in_run(context), logger=context.log)
    outcomes = report.outcomes
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
        "articles_waiting_for_login": report.articles_waiting_for_login,
        "from_batches": from_batches(t.batch for t in report.targets),
        "waiting": report.waiting,
        "groups_written": report.groups_written,
        "retry": config.retry,
    }
    if report.errors:
        return service_stopped(context, f"Some addresses were not fetched: {report.errors[0]}. "
                               "The next run fetches them.", metadata)
    return dg.MaterializeResult(metadata=metadata)


def documents_coverage(duckdb: DuckDBResource, batches: list[str]) -> dg.AssetCheckResult:
    with duckdb.get_client().connect() as conn:
        numbers, reasons = document_coverage(conn, batches)
    coverage = numbers["usable"] / numbers["links"] if numbers["links"] else 1.0
    return dg.AssetCheckResult(
        check_name="documents_coverage",
        passed=numbers["pending"] == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "coverage": dg.MetadataValue.float(round(coverage, 4)),
            **numbers,
            "failed_by_reason": dg.MetadataValue.json(reasons),
        },
    )


DOCUMENTS_COVERAGE = coverage_spec(
    "documents_coverage", "documents",
    description="Share of links with a usable document. It passes when every link has a fetch result: "
    "a dead link is a fault of the web, not of the stage.")


# The coverage check runs in this step: see with_checks().
@dg.asset(
    partitions_def=sync_batches,
    deps=["links", "bookmarks"],
    group_name="documents",
    kinds={"duckdb", "playwright"},
    description="The main content behind each link and X Article of the bookmarks, "
    "or the reason why there is none. Keyed by the normalized URL.",
    check_specs=[DOCUMENTS_COVERAGE, stage_check_spec("documents")],
)
def documents(
    context: dg.AssetExecutionContext, config: DocumentsConfig, duckdb: DuckDBResource, browser: BrowserResource
) -> dg.MaterializeResult:
    result = goes_on_after_failure(context, "kb extract", fetch_batch, context, config, duckdb, browser)
    return with_checks(context, result, documents_coverage(duckdb, batches_of_run(context)))
