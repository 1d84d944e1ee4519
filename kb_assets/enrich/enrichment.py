"""What the enrichment assets (captions, transcripts, translations, and
the documents) share in Dagster: the batches of a run, the
metadata of failures, the result of a stage that stopped, and the checks
that run in the stage's step. The items that wait and the writer of their
results are in the core (kb/enrich/waiting_items.py)."""

import warnings
from collections import Counter
from collections.abc import Callable

import dagster as dg

from kb_assets.keys import STOPPED
from kb_assets.partitions import sync_batches


def batches_of_run(context) -> list[str]:
    """The sync batches whose items the run takes: its own partition, or
    the partitions of its range (captions runs a range in one run). Never
    another batch's items: the materialization of a partition says what
    that partition holds, and a backfill of it does its work. The items
    of older batches get runs of their own partitions (the catch-up of
    kb/apps/sync.py and sensors/capture_failed.py)."""
    return list(context.partition_keys)


def from_batches(batches) -> dg.MetadataValue:
    """How many items came from each sync batch, as JSON metadata: the
    Dagster UI shows the origin of the work that a run did."""
    return dg.MetadataValue.json(dict(sorted(Counter(batches).items())))


def failure_reasons(rows: list[dict]) -> dg.MetadataValue:
    """How many rows failed, per reason, as JSON metadata."""
    reasons = Counter(row["reason"] for row in rows if row["status"] == "failed")
    return dg.MetadataValue.json(dict(sorted(reasons.items())))


# Failed items that the metadata names ("<item>: <reason>"), so that `kb
# extract` and `kb transcribe` can name them. More would make the UI hard to read.
FAILURES_NAMED = 20


def failure_line(item: str, reason: str, detail: str | None) -> str:
    """One failed item for the metadata: "<item>: <reason> (<detail>)", on one line."""
    detail = " ".join((detail or "").split())[:200]
    return f"{item}: {reason}" + (f" ({detail})" if detail else "")


def failure_list(lines: list[str]) -> dg.MetadataValue:
    """The first failed items, one "<item>: <reason>" line each, as JSON metadata."""
    extra = len(lines) - FAILURES_NAMED
    return dg.MetadataValue.json(lines[:FAILURES_NAMED] + ([f"... and {extra} more"] if extra > 0 else []))




# The check that tells whether a stage did its work: ERROR when its outside
# service failed or stopped. The materialization stays (the results before
# the stop are stored, and the index after it must still be built), but the
# UI shows the stage red, and `kb sync` reads this check, not a metadata key.
def stage_check_name(asset: str) -> str:
    return f"{asset}_stage"


def stage_check_spec(asset: str) -> dg.AssetCheckSpec:
    return coverage_spec(
        stage_check_name(asset), asset,
        "Fails (severity ERROR) when the stage's service failed or stopped. The results before "
        "the stop are stored; the other items wait for the next run.")


# The stage's checks are per partition (sync batch): the UI shows, for each
# batch, whether its stage stopped and what of its items waits. A run of a
# range of partitions (a backfill with a single-run policy) records its check
# results for the range as a whole: Dagster gives them no partition then.
def coverage_spec(name: str, asset: str, description: str) -> dg.AssetCheckSpec:
    """A check of a stage, per sync batch (the stage check and the coverage checks)."""
    # A partitions_def on a check is a preview of Dagster 1.13 (a PreviewWarning
    # at each load of the graph). pyproject.toml keeps Dagster below 1.14, and
    # tests/test_partitions.py checks the partition of each evaluation.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, asset=asset, partitions_def=sync_batches, description=description)


def _stage_result(context, error: str = "") -> dg.AssetCheckResult:
    asset = context.asset_key.to_user_string()
    return dg.AssetCheckResult(
        check_name=stage_check_name(asset), asset_key=context.asset_key, passed=not error,
        severity=dg.AssetCheckSeverity.ERROR, description=error or None,
        metadata={STOPPED: error} if error else {})


def service_stopped(context, description: str, metadata: dict) -> dg.MaterializeResult:
    """The result of a stage whose outside service is missing or stopped
    answering: the materialization of what was stored, with a failed stage
    check (see stage_check_spec). It does not raise: a failed step would
    stop every stage after it in the run, and the index of what exists must
    always be built. The other items wait for the next run."""
    context.log.warning(description)
    return dg.MaterializeResult(metadata=metadata, check_results=[_stage_result(context, description)])


def goes_on_after_failure(context, command: str, stage: Callable[..., dg.MaterializeResult],
                          *args) -> dg.MaterializeResult:
    """stage(*args); when it raises, a stopped result that names the error
    (see service_stopped). Why: a failed step stops every later step of its
    run, so one enrichment kind that fails (a bug, an answer of a strange
    shape) kept the whole batch out of the index. Each result was written
    as it came; `command` does the rest."""
    try:
        return stage(*args)
    except Exception as exc:
        context.log.exception(f"{context.op_execution_context.op.name} failed")
        error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return service_stopped(context, f"The stage failed: {error}. The results before the error are stored; "
                               f"`{command}` tries the rest again.", {"error": error})


def backend_stopped(context, backend: str, error: Exception, stored: int, items: str,
                    metadata: dict) -> dg.MaterializeResult:
    """The result of a run whose backend stopped answering (see service_stopped)."""
    return service_stopped(context, f"The {backend} backend stopped: {error}. "
                           f"{stored} result(s) were stored; the other {items} wait.", metadata)


def with_checks(context, result: dg.MaterializeResult, *checks: dg.AssetCheckResult) -> dg.MaterializeResult:
    """The result of a stage with the results of its checks (check_specs):
    the stage check (passed, unless service_stopped() failed it) and `checks`.

    The checks of a stage run in the stage's own step, not in a step of
    their own: each step cost a sync Dagster events, a DuckDB connection and
    the wait for the writer lock (benchmarks/index_and_retrieval.md, "Sync cost")."""
    own = list(result.check_results or [])
    if not any(check.check_name == stage_check_name(context.asset_key.to_user_string()) for check in own):
        own.append(_stage_result(context))
    return result._replace(check_results=[*own, *checks])


def coverage_check(name: str, numbers: dict, *, done: int, total: int, off: bool, off_key: str) -> dg.AssetCheckResult:
    """The coverage check of a stage, for the items of the run's partitions:
    it passes when no item waits, or when the stage is off (`off`, shown as
    `off_key`). Only a warning: the items that wait get their turn in the
    next run."""
    share = done / total if total else 1.0
    return dg.AssetCheckResult(
        check_name=name,
        passed=off or numbers["waiting"] == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={**numbers, "coverage": dg.MetadataValue.float(round(share, 4)), off_key: off},
    )
