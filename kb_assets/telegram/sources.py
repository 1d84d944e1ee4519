"""Assets of the Telegram inflow: `parsed_sources` and `gated_sources`.

Each inbox item is one partition of `sources`; the inbox sensor adds it.

- `parsed_sources`: the item as Markdown with YAML frontmatter, at
  raw/parsed/<type>/<slug>.md in the wiki folder, and its row in the DuckDB
  table `sources`.
- `gated_sources`: duplicates found, then the quality gate's verdict (table
  `gate_results`). A rejected or duplicate source's file moves to
  raw/rejected/. Downstream (the wiki) ingests the rows whose status is
  `accepted`, from the file at `sources.parsed_path`.

The parse and the gate call (network, models) run with no DuckDB
connection open; each write is one short transaction after them. The
parsed files are kb/telegram/parsed_files.py; the SQL of the tables is
kb/telegram/source_table.py.
"""

import dagster as dg

from kb.retries import RetryBudget
from kb.settings import get_settings
from kb.telegram.gate import GateVerdict, read_purpose
from kb.telegram.inbox import Inbox, InboxError
from kb.telegram.parsed_files import locate_parsed_file, move_parsed_file, parse_item, write_parsed_file
from kb.telegram.source_parsers import PermanentParseError, TransientParseError, check_length, split_frontmatter
from kb.telegram.source_table import (count_transient_failure, find_duplicate, read_parsed_row, record_failure,
                                      reset_transient_failures, save_gate_result, save_parsed_row,
                                      transient_failures_so_far, utc_now)
from kb.wiki.repo import raw_files_lock
from kb_assets.keys import OVERRIDE_TAG, RETRY_ON_ASSET_FAILURE_TAG, SOURCE_PASSAGES, WIKI_PAGES
from kb_assets.partitions import sources
from kb_assets.retry_budget import source_retries_used
from kb_assets.run_config_rules import check_override_tag
from kb_resources.services import BrowserResource, QualityGateResource
from kb_resources.stores import DuckDBResource, InboxResource, WikiResource

# Transient errors that the parsers name (timeouts, HTTP 5xx), and errors
# that no parser names (the specification: "treated as transient"), retry
# after the waits of KB_SOURCE_RETRY_WAITS_S (default 60, 120 and 240
# seconds: at most 3 times) over the item's whole life (kb/retries.py). The
# parse failures live in sources.transient_failures, and the failed tries
# of the item's other assets (a stuck try, a wiki change) count with them
# (kb_assets/retry_budget.py), so a run that is started again (run retry,
# backfill) does not reset the count. There is no RetryPolicy: its
# exponential waits (60, 180, 420 s) were outside the budget.
# The waits are read when a parse starts, not at import: a Reload of the code
# location (or a new run worker) takes a changed .env.


def budget() -> RetryBudget:
    """The parse budget of the settings of this moment (KB_SOURCE_RETRY_WAITS_S)."""
    return RetryBudget(get_settings().source_retry_waits)



def is_override(context: dg.AssetExecutionContext, inbox: Inbox, item_known: bool | None = None) -> bool:
    """True for a run of the bot's /override. The UI can set the tag too: an
    override with another value, or for an id that is not in the inbox, fails
    the step before it writes anything. `item_known`: the caller has read
    the item from the inbox already (None: look it up)."""
    # op_execution_context.run_tags also works when a test invokes the asset directly.
    value = context.op_execution_context.run_tags.get(OVERRIDE_TAG)
    if value is None:
        return False
    item_id = context.partition_key
    if item_known is None:
        item_known = inbox.find(item_id) is not None
    return check_override_tag(value, item_known, item_id)


def fail(description: str, item_id: str) -> dg.Failure:
    """A failure that no retry can fix."""
    return dg.Failure(description=description, allow_retries=False, metadata={"item_id": item_id})


@dg.asset(
    partitions_def=sources,
    group_name="telegram",
    kinds={"duckdb"},
    description="Each inbox item parsed to Markdown with YAML frontmatter (raw/parsed/<type>/<slug>.md "
                "in the wiki folder) and its row in the DuckDB table `sources`.",
)
def parsed_sources(context: dg.AssetExecutionContext, duckdb: DuckDBResource, browser: BrowserResource,
                   inbox: InboxResource, wiki: WikiResource) -> dg.MaterializeResult:
    duckdb, browser, inbox, wiki_dir = duckdb.get_client(), browser.get_client(), inbox.get_client(), wiki.get_client().root()
    item_id = context.partition_key
    try:
        item = inbox.get(item_id)
    except InboxError as exc:
        raise fail(str(exc), item_id) from None

    override = is_override(context, inbox, item_known=True)
    if override:
        # The owner asked for this source: give it its retries again.
        reset_transient_failures(duckdb, item_id)
    run_id, tags = context.op_execution_context.run_id, context.op_execution_context.run_tags
    failures = transient_failures_so_far(duckdb, item_id)
    used = source_retries_used(context.instance, item_id, failures, run_id, tags, override=override)
    parse_budget = budget()
    if used > parse_budget.retries:
        raise fail(f"inbox item {item_id}: {used} failed tries and transient failures so far ({failures} of the "
                   f"parse); the limit is {parse_budget.retries} retries over the item's life", item_id)

    try:
        parsed = parse_item(item, inbox, get_settings(), browser)
        check_length(item.type, parsed, item.url or item.file_name or f"inbox item {item_id}")
    except PermanentParseError as exc:
        record_failure(duckdb, item, str(exc))
        raise fail(str(exc), item_id) from None
    except Exception as exc:  # TransientParseError, and an error that no parser names: transient too (4.4)
        count = count_transient_failure(duckdb, item, str(exc) if isinstance(exc, TransientParseError)
                                        else f"{type(exc).__name__}: {exc}")
        wait = parse_budget.wait_after(used)
        if wait is None:
            message = f"{exc} (transient failure {count}; no retries are left)"
            record_failure(duckdb, item, message)
            raise fail(message, item_id) from None
        context.log.warning(f"inbox item {item_id}: transient failure {count}: {exc}. Retry in {wait:g} s.")
        raise dg.RetryRequested(max_retries=parse_budget.retries, seconds_to_wait=wait) from exc

    fetched_at = utc_now()
    with raw_files_lock(wiki_dir):  # an ingest must not see raw/ change
        relative = write_parsed_file(wiki_dir, item, parsed, fetched_at)
    row = save_parsed_row(duckdb, item, parsed, relative, fetched_at, failures)
    context.log.info(f"inbox item {item_id}: {item.type} parsed by {parsed.parser}: {parsed.title!r}")
    return dg.MaterializeResult(metadata={
        "item_id": item.id,
        "type": item.type,
        "title": parsed.title,
        "url": dg.MetadataValue.url(row["url"]) if row["url"] else "",
        "parsed_path": dg.MetadataValue.path(str(wiki_dir / relative)),
        "char_count": parsed.char_count,
        "parser": parsed.parser,
        "content_hash": row["content_hash"],
    })


@dg.asset(
    partitions_def=sources,
    group_name="telegram",
    deps=[parsed_sources],
    kinds={"duckdb"},
    description="The quality gate's verdict on each parsed source (DuckDB `gate_results`, `sources.status`): "
                "accepted, rejected (file moved to raw/rejected/) or duplicate.",
)
def gated_sources(context: dg.AssetExecutionContext, duckdb: DuckDBResource, gate: QualityGateResource,
                  inbox: InboxResource, wiki: WikiResource) -> dg.MaterializeResult:
    duckdb, gate, inbox, wiki_dir = duckdb.get_client(), gate.get_client(), inbox.get_client(), wiki.get_client().root()
    item_id = context.partition_key
    override = is_override(context, inbox)
    row = read_parsed_row(duckdb, item_id)
    if row is None or row.parsed_path is None:
        raise fail(f"inbox item {item_id}: not parsed yet; materialize parsed_sources first", item_id)
    try:
        current = locate_parsed_file(wiki_dir, row.parsed_path)
    except FileNotFoundError as exc:
        raise fail(str(exc), item_id) from None

    duplicate_of = None if override else find_duplicate(duckdb, item_id, row.url_norm, row.content_hash)
    verdict: GateVerdict | None = None
    if duplicate_of:
        decision = "duplicate"
    else:
        _, body = split_frontmatter(current.read_text(encoding="utf-8"))
        item = inbox.find(item_id)
        verdict = gate.judge(body, read_purpose(wiki_dir), log=context.log, source_type=row.type,
                             url=row.url, file_name=item.file_name if item else None, title=row.title)
        decision = "accepted" if override or verdict.accepted else "rejected"

    with raw_files_lock(wiki_dir):  # an ingest must not see raw/ change
        new_path = move_parsed_file(wiki_dir, current, decision != "accepted", row.type)
    save_gate_result(duckdb, item_id, decision=decision, parsed_path=new_path, verdict=verdict,
                     duplicate_of=duplicate_of, overridden=override, threshold=gate.threshold)
    context.log.info(f"inbox item {item_id}: {decision}"
                     + (f" (score {verdict.score}, gate {verdict.gate})" if verdict else f" of {duplicate_of}"))
    metadata = {
        "item_id": item_id,
        "status": decision,
        "title": row.title or "",
        "type": row.type,
        "url": row.url or "",
        "parsed_path": str(new_path),
        "overridden": override,
    }
    if verdict:
        metadata.update({
            "score": verdict.score if verdict.score is not None else -1,
            "threshold": verdict.threshold,
            "topics": ", ".join(verdict.topics),
            "reason": verdict.reason,
            "gate": verdict.gate,
            "gate_tries": verdict.attempts,
        })
    if duplicate_of:
        metadata["duplicate_of"] = duplicate_of
    return dg.MaterializeResult(metadata=metadata)


# The wiki stage's asset (kb_assets/wiki/wiki_pages.py): it ingests the accepted sources.

source_intake_job = dg.define_asset_job(
    "source_intake",
    # One run per item takes it all the way: parse, gate, index, wiki. The
    # run's state is then the item's state (the bot's /status reads it).
    # The index (source_passages) and the wiki both follow the gate, and
    # neither waits for the other: a source is searchable before the agent
    # has written about it, and also when the agent fails.
    selection=dg.AssetSelection.assets(parsed_sources, gated_sources, SOURCE_PASSAGES, WIKI_PAGES),
    # Run retries (dagster.yaml) are for runs whose process died. An asset
    # that failed has used its own retries already; one more run would break
    # "a permanent error fails at once" and the 3-retry limit.
    tags={RETRY_ON_ASSET_FAILURE_TAG: "false"},
    # The steps run one after the other: one run worker process, not
    # one more interpreter start (all of kb's imports) per step.
    executor_def=dg.in_process_executor,
    description="One inbox item: parse it, pass it through the quality gate, index it for search, and ingest it into the wiki.",
)
