"""The wiki stage: the agent integrates approved sources into the git wiki,
a daily lint keeps it coherent, a weekly synthesis sums up the week.

Each asset reads its resources and calls one function of kb/wiki/tasks.py;
the change protocol (one verified commit, or the wiki as it was) is in
kb/wiki/change.py, the prompts in kb/wiki/prompts.py. This module holds
what is Dagster's: retries and their waits, and the state of each source
partition. After a failed change (the wiki is rolled back), or an error
outside the change, the asset asks Dagster for a retry (3 retries, after
60, 120 and 240 s; a `failed` report of the agent only one), or fails for
good. The count of used retries is persisted (kb_assets/retry_budget.py):
a new run, also a run retry after kb stopped a stuck try, goes on with it.

State of each source partition is kept in Dagster, not in a second store:
a materialization holds the commit; an observation says `waiting`,
`rejected`, `retrying` or `failed`. kb_assets/source_states.py reads them
for `kb status` and the bot's `/status`.
"""


from datetime import date, datetime
from zoneinfo import ZoneInfo

import dagster as dg

from kb.retries import RetryBudget
from kb.settings import get_settings
from kb.telegram.item_states import State
from kb.telegram.notifier import NotificationError, TelegramNotifier
from kb.telegram.source_table import read_gate_decision, transient_failures_so_far
from kb.wiki.agent import AgentRun
from kb.wiki.change import ChangeOutcome
from kb.wiki.checks import findings_count
from kb.wiki.prompts import TOPIC_KEY_MAX, topic_key
from kb.wiki.tasks import ingest_source, lint_wiki, topic_synthesis, weekly_synthesis
from kb.wiki.weeks import monday_of
from kb_assets.keys import GATED_SOURCES, OVERRIDE_TAG, RETRY_ON_ASSET_FAILURE_TAG, WIKI_PAGES
from kb_assets.partitions import sources
from kb_assets.retry_budget import request_retries_used, source_retries_used, try_metadata
from kb_resources.services import TelegramNotifierResource, WikiAgentResource
from kb_resources.stores import DuckDBResource, WikiResource

WIKI_POOL = "wiki"
# A wiki change that kb rolled back is tried again KB_WIKI_MAX_RETRIES times
# (RETRIES_MAX, 3), after 60, 120 and 240 s (KB_WIKI_RETRY_DELAY_S doubled
# for each retry): the waits let a rate limit or a busy endpoint recover.
# The rule is kb/retries.py: _finish raises RetryRequested with the wait.
# An error outside the checked change (a git error before the agent starts)
# uses the same count and waits: no RetryPolicy of its own.
# A change that the agent itself reports as failed is tried again once only
# (the specification, 11.2): the agent said that it cannot do it.
FAILED_REPORT_RETRIES = 1


def budget() -> RetryBudget:
    """The wiki's retry budget of the settings of this moment, read when a
    try ends, not at import: KB_WIKI_MAX_RETRIES waits from
    KB_WIKI_RETRY_DELAY_S, doubled."""
    settings = get_settings()
    return RetryBudget.doubling(settings.kb_wiki_retry_delay_s, settings.kb_wiki_max_retries)


def retry_wait_s(retries_used: int) -> float:
    """The wait before the next retry after `retries_used`: 60, 120, 240 s by default."""
    return budget().wait_after(retries_used)


# Lint and synthesis partitions start here; no backfill before it is useful.
PARTITIONS_START = "2026-01-01"
# A partition key is a date of the owner's zone (TZ): the schedules run in
# TZ and name the day (sensors/wiki_schedules.py), and the bot's /lint names
# today in TZ (today_in_zone()). The partitions are in UTC, not in TZ: they
# are built at import, and TZ is a setting that a Reload of the code
# location reads again (kb_assets/definitions.py). end_offset=2: the day
# after today in UTC is a partition too, so today in every zone (UTC-12 to
# UTC+14) is one, and the schedule at 02:00 and the bot's /lint can lint
# the wiki as it is now.
wiki_lint_days = dg.DailyPartitionsDefinition(start_date=PARTITIONS_START, end_offset=2, timezone="UTC")
# One partition per topic that the owner asked for (/synthesize <topic>).
wiki_topics = dg.DynamicPartitionsDefinition(name="wiki_topics")
# Weeks start on Monday, as ISO weeks do, so a partition is one `YYYY-Www`.
# end_offset=2, in UTC as above: the week that is running in TZ is a
# partition too, because the synthesis runs on Sunday morning, before the
# week ends.
wiki_synthesis_weeks = dg.WeeklyPartitionsDefinition(
    start_date="2025-12-29", day_offset=1, end_offset=2, timezone="UTC",  # a Monday: 2026-W01
)


def today_in_zone(tz: str) -> date:
    """The date of today in the zone `tz`: the lint partition of today."""
    return datetime.now(ZoneInfo(tz)).date()


def monday_in_zone(tz: str) -> date:
    """The Monday of this week in the zone `tz`: the synthesis partition of this week."""
    return monday_of(today_in_zone(tz))


def change_metadata(outcome: ChangeOutcome) -> dict:
    """The Dagster metadata of one change."""
    meta = {
        "commit_sha": outcome.sha,
        "pages_created": dg.MetadataValue.json(outcome.created),
        "pages_updated": dg.MetadataValue.json(outcome.updated),
        "warnings": dg.MetadataValue.json(outcome.warnings),
        "summary": outcome.summary,
    }
    if outcome.status:
        meta["agent_status"] = outcome.status
    if outcome.deleted:
        meta["pages_deleted"] = dg.MetadataValue.json(outcome.deleted)
    if outcome.agent is not None:
        meta["agent_turns"] = outcome.agent.num_turns
        meta["agent_seconds"] = outcome.agent.seconds
        if outcome.agent.cost_usd is not None:
            # The cost of each agent run (the specification, 5.4), as the Claude Code CLI counts it.
            meta["agent_cost_usd"] = float(outcome.agent.cost_usd)
        meta["denied_tool_calls"] = dg.MetadataValue.json(outcome.agent.denied)
        meta["agent_sandbox"] = outcome.agent.sandbox
        if outcome.agent.sandbox_notice:
            meta["agent_sandbox_notice"] = outcome.agent.sandbox_notice
    return meta


# --- state in Dagster -------------------------------------------------------------


def _observe(context: dg.AssetExecutionContext, state: str, **metadata) -> None:
    context.log_event(dg.AssetObservation(
        asset_key=context.asset_key, partition=context.partition_key,
        metadata={"state": str(state), **metadata},
    ))


def last_refusal(instance: dg.DagsterInstance, partition: str, asset_key: dg.AssetKey = WIKI_PAGES) -> str | None:
    """The rules that refused the last try of this partition of a wiki
    asset (its newest `refused` observation), or None."""
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=10).records
    for record in sorted(records, key=lambda r: r.storage_id, reverse=True):
        observation = record.event_log_entry.asset_observation
        meta = {k: v.value for k, v in observation.metadata.items()} if observation else {}
        if meta.get("state") == State.REFUSED:
            return str(meta.get("reason") or "")
        if meta.get("state") != State.RETRYING:
            return None
        if meta.get("refusal"):
            return str(meta["refusal"])
    return None


def refusal_for_retry(context: dg.AssetExecutionContext, used: int) -> str | None:
    """For a retry of any wiki change (ingest, lint, synthesis, topic): the
    rules that refused the try before, so that the agent keeps them. `used`:
    the retries of the partition so far (retries_used), in earlier runs too."""
    if not used:
        return None
    return last_refusal(context.instance, context.partition_key, context.asset_key)


def tell_of_the_room(context: dg.AssetExecutionContext, run: AgentRun | None, telegram: TelegramNotifier) -> None:
    """An agent run without its bubblewrap room (KB_AGENT_SANDBOX=auto and
    no working bubblewrap): a warning in the run's log each time, and one
    notice to the owner, at the first such run of this KB_HOME (Telegram,
    or the notices of `kb status`)."""
    if run is None or not run.sandbox_notice:
        return
    context.log.warning(run.sandbox_notice)
    try:
        telegram.notify("wiki-agent", "no-bubblewrap", run.sandbox_notice)
    except NotificationError as exc:  # the next run tries again: the claim was released
        context.log.warning(str(exc))


def retries_used(context: dg.AssetExecutionContext, parse_failures: int | None = None) -> int:
    """The retries that this partition has used so far, in earlier runs too.
    A source (`parse_failures` given: its transient parse failures) counts
    over its life; a lint day, week or topic over one request."""
    run_id, tags = context.op_execution_context.run_id, context.op_execution_context.run_tags
    if parse_failures is not None:
        return source_retries_used(context.instance, context.partition_key, parse_failures, run_id, tags,
                                   override=OVERRIDE_TAG in tags)
    return request_retries_used(context.instance, context.asset_key, context.partition_key, run_id, tags)


def check_budget(context: dg.AssetExecutionContext, used: int, subject: str) -> None:
    """Fail for good, before any work, when no try is left: a run retry
    after a stuck try, or a new run of a source whose retries are spent."""
    if used <= budget().retries:
        return
    error = (f"{subject}: {used} failed tries so far, also in earlier runs; no retry is left "
             f"(KB_WIKI_MAX_RETRIES {budget().retries}). Nothing was changed.")
    _observe(context, State.FAILED, error=error, attempt=used + 1, budget_spent=True,
             **try_metadata(context.op_execution_context.run_id, context.op_execution_context.run_tags))
    raise dg.Failure(description=error, allow_retries=False)


def unexpected(exc: Exception) -> ChangeOutcome:
    """An error outside the checked change, as a failed change: it uses the same retry count."""
    return ChangeOutcome(ok=False, problems=[f"error outside the change: {type(exc).__name__}: {exc}"])


def _one_try(context: dg.AssetExecutionContext, subject: str, telegram: TelegramNotifierResource, used: int,
             change):
    """One try of a wiki change: change(refused) with the rules that refused
    the try before. An error outside the checked change uses the same
    retry count (kb/retries.py): _finish asks for the retry or fails."""
    try:
        return change(refusal_for_retry(context, used))
    except Exception as exc:  # _finish raises: a retry after the wait, or the end
        _finish(context, unexpected(exc), subject, telegram, used, cause=exc)


def _finish(context: dg.AssetExecutionContext, outcome: ChangeOutcome, subject: str,
            telegram: TelegramNotifierResource, used: int, cause: BaseException | None = None) -> None:
    """After a failed change (the wiki is rolled back), ask Dagster for a
    retry after the budget's wait, or fail for good: after the last retry
    of the budget (`used`: the retries used before this try, in every run),
    or when the agent reported `failed` a second time. One observation
    (`retrying` or `failed`) records each failed try: it is the persisted
    count."""
    tell_of_the_room(context, outcome.agent, telegram.get_client())
    if outcome.ok:
        return
    attempt = used + 1
    error = "; ".join(outcome.problems)
    refused = [p.removeprefix("refused: ") for p in outcome.problems if p.startswith("refused: ")]
    refusal = "; ".join(refused)[:1000]
    if refused:
        # The owner hears of a refused change (source_outcomes_sensor), with the rule.
        _observe(context, State.REFUSED, reason=refusal, attempt=attempt)
    failed_reports = _failed_reports_before(context) + (outcome.status == "failed")
    wiki_budget = budget()
    wait = wiki_budget.wait_after(used)
    retry = wait is not None and failed_reports <= FAILED_REPORT_RETRIES
    _observe(context, State.RETRYING if retry else State.FAILED, error=error[:1000], attempt=attempt,
             agent_status=outcome.status or "none", warnings=dg.MetadataValue.json(outcome.warnings),
             **({"refusal": refusal} if refused else {}),
             **try_metadata(context.op_execution_context.run_id, context.op_execution_context.run_tags))
    description = f"{subject}: the wiki change was rolled back (try {attempt} of {wiki_budget.tries}): {error}"
    metadata = {"problems": dg.MetadataValue.json(outcome.problems),
                "warnings": dg.MetadataValue.json(outcome.warnings)}
    if retry:
        context.log.warning(f"{description}. Next try in {wait:g} s.")
        raise dg.RetryRequested(max_retries=wiki_budget.retries, seconds_to_wait=wait) from (
            cause or dg.Failure(description=description, metadata=metadata))
    if wait is not None:
        description += (f" The agent reported failed {failed_reports} times; such a change is tried again "
                        f"{FAILED_REPORT_RETRIES} time only.")
    raise dg.Failure(description=description, metadata=metadata, allow_retries=False) from cause


def _failed_reports_before(context: dg.AssetExecutionContext) -> int:
    """The earlier tries of this step, in this run, whose agent reported `failed`."""
    records = context.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=context.asset_key, asset_partitions=[context.partition_key]), limit=50,
    ).records
    count = 0
    for record in records:
        observation = record.event_log_entry.asset_observation
        status = observation.metadata.get("agent_status") if observation else None
        count += record.run_id == context.op_execution_context.run_id and getattr(status, "value", status) == "failed"
    return count


# --- assets -------------------------------------------------------------------------


@dg.asset(
    partitions_def=sources,
    deps=[GATED_SOURCES],
    pool=WIKI_POOL,
    output_required=False,
    group_name="wiki",
    description="The wiki pages that the agent made or updated for one approved source: one git commit.",
)
def wiki_pages(context: dg.AssetExecutionContext, wiki: WikiResource, wiki_agent: WikiAgentResource, duckdb: DuckDBResource,
               telegram: TelegramNotifierResource):
    wiki, wiki_agent, duckdb = wiki.get_client(), wiki_agent.get_client(), duckdb.get_client()
    source_id = context.partition_key
    decision = read_gate_decision(duckdb, source_id)
    if decision is None:
        raise dg.Failure(f"source {source_id}: the gate has no decision for it yet", allow_retries=False)
    if not decision.approved:
        _observe(context, decision.decision or State.REJECTED, reason=f"the gate decided {decision.decision}")
        return
    root = wiki.ensure()
    if not (root / decision.parsed_path).is_file():
        raise dg.Failure(f"source {source_id}: the parsed file {decision.parsed_path} is missing in {root}",
                         allow_retries=False)
    if not wiki_agent.configured():
        # No endpoint: the source waits. Nothing is written; the partition
        # stays unmaterialized, and wiki_waiting_sensor starts it again
        # when an endpoint is set.
        _observe(context, State.WAITING, reason="ANTHROPIC_BASE_URL is not set")
        context.log.info(f"source {source_id} waits: the wiki agent has no endpoint")
        return
    subject = f"source {source_id}"
    used = retries_used(context, parse_failures=transient_failures_so_far(duckdb, source_id))
    check_budget(context, used, subject)
    now = datetime.now(ZoneInfo(get_settings().tz)).isoformat(timespec="seconds")
    # A refused change leaves the source approved; the next try hears the rule that refused it.
    outcome = _one_try(context, subject, telegram, used, lambda refused: ingest_source(
        wiki, wiki_agent, decision, now=now, max_turns=wiki_agent.max_turns, refused=refused))
    _finish(context, outcome, subject, telegram, used)
    yield dg.MaterializeResult(metadata={**change_metadata(outcome), "source_id": source_id, "attempt": used + 1})


@dg.asset(
    partitions_def=wiki_lint_days,
    deps=[dg.AssetDep(WIKI_PAGES, partition_mapping=dg.AllPartitionMapping())],
    pool=WIKI_POOL,
    group_name="wiki",
    description="The daily lint: deterministic findings, fixed by the agent, and a report page. One commit.",
)
def wiki_lint(context: dg.AssetExecutionContext, wiki: WikiResource, wiki_agent: WikiAgentResource,
              telegram: TelegramNotifierResource) -> dg.MaterializeResult:
    wiki, wiki_agent = wiki.get_client(), wiki_agent.get_client()
    subject = f"lint {context.partition_key}"
    used = retries_used(context)
    check_budget(context, used, subject)
    lint = _one_try(context, subject, telegram, used, lambda refused: lint_wiki(
        wiki, wiki_agent, context.partition_key, max_turns=wiki_agent.lint_max_turns, refused=refused))
    _finish(context, lint.outcome, subject, telegram, used)
    return dg.MaterializeResult(metadata={
        **change_metadata(lint.outcome), "mode": lint.mode,
        "findings_before": findings_count(lint.findings), "findings_after": findings_count(lint.after),
        "findings_by_kind": dg.MetadataValue.json({kind: len(items) for kind, items in lint.findings.items()}),
        # The claims that their cited sources still do not hold, for the digest.
        "unsupported_claims": dg.MetadataValue.json([f"{u['page']}:{u['line']}" for u in lint.after["unsupported"]]),
    })


@dg.asset(
    partitions_def=wiki_synthesis_weeks,
    deps=[dg.AssetDep(WIKI_PAGES, partition_mapping=dg.AllPartitionMapping())],
    pool=WIKI_POOL,
    output_required=False,
    group_name="wiki",
    description="The weekly synthesis of every source since the last one. A thin week says so. One commit.",
)
def wiki_synthesis(context: dg.AssetExecutionContext, wiki: WikiResource, wiki_agent: WikiAgentResource,
                   telegram: TelegramNotifierResource):
    wiki, wiki_agent = wiki.get_client(), wiki_agent.get_client()
    settings = get_settings()
    subject = f"synthesis {context.partition_key}"
    used = retries_used(context)
    check_budget(context, used, subject)
    week = _one_try(context, subject, telegram, used, lambda refused: weekly_synthesis(
        wiki, wiki_agent, date.fromisoformat(context.partition_key), tz=settings.tz,
        max_turns=wiki_agent.synthesis_max_turns, thin_week=settings.kb_synthesis_thin_week, refused=refused))
    if week.outcome is None:
        _observe(context, State.WAITING, reason="ANTHROPIC_BASE_URL is not set", sources=len(week.slugs))
        return
    _finish(context, week.outcome, f"synthesis {week.label}", telegram, used)
    yield dg.MaterializeResult(metadata={**change_metadata(week.outcome), "week": week.label,
                                         "sources": len(week.slugs), "thin_week": week.thin, "mode": week.mode})


@dg.asset(
    partitions_def=wiki_topics,
    deps=[dg.AssetDep(WIKI_PAGES, partition_mapping=dg.AllPartitionMapping())],
    pool=WIKI_POOL,
    output_required=False,
    group_name="wiki",
    description="A synthesis page about one topic that the owner asked for. One commit.",
)
def wiki_topic_synthesis(context: dg.AssetExecutionContext, wiki: WikiResource, wiki_agent: WikiAgentResource,
                         telegram: TelegramNotifierResource):
    wiki, wiki_agent = wiki.get_client(), wiki_agent.get_client()
    topic = context.partition_key
    # The key goes into the agent's prompt, and the UI can add any key to
    # wiki_topics: only a key that the bot's /synthesize makes passes.
    if topic_key(topic) != topic:
        raise dg.Failure(f"the wiki_topics partition key {topic[:80]!r} is refused: a topic key holds only "
                         f"lower-case letters, digits and single hyphens, at most {TOPIC_KEY_MAX} characters "
                         "(as /synthesize <topic> in the bot makes it). Nothing was written.", allow_retries=False)
    if not wiki_agent.configured():
        _observe(context, State.WAITING, reason="ANTHROPIC_BASE_URL is not set")
        return
    subject = f"topic {topic}"
    used = retries_used(context)
    check_budget(context, used, subject)
    today = datetime.now(ZoneInfo(get_settings().tz)).date().isoformat()
    outcome = _one_try(context, subject, telegram, used, lambda refused: topic_synthesis(
        wiki, wiki_agent, topic, today=today, max_turns=wiki_agent.synthesis_max_turns, refused=refused))
    _finish(context, outcome, subject, telegram, used)
    yield dg.MaterializeResult(metadata={**change_metadata(outcome), "topic": topic})


# --- jobs ---------------------------------------------------------------------------

# A wiki try that runs longer than KB_STUCK_MINUTES (SWEEPER_STUCK_MINUTES,
# 30) is stopped by sensors/stuck_steps.py, which counts the time of the
# running try, not of the run: a run with its retries and their waits can
# take longer. The stopped try uses a retry of the persisted count, and the
# run retry of dagster.yaml goes on with that count.
# A run whose asset failed for good is not run again: its asset has used
# the budget already (kb/retries.py). Run retries are for a dead worker and
# a stuck try, whose runs fail with no step failure.
WIKI_RUN_TAGS = {RETRY_ON_ASSET_FAILURE_TAG: "false"}

# Each of these jobs has one step: the in-process executor runs it in the run
# worker, not in one more interpreter (all of kb's imports again). On a busy
# machine that start took 20 to 30 s of each lint of issue 55's month.
wiki_ingest_job = dg.define_asset_job(
    "wiki_ingest_job", selection=[WIKI_PAGES], tags=WIKI_RUN_TAGS, executor_def=dg.in_process_executor,
    description="Ingest one approved source into the wiki (used for sources that waited for an endpoint).",
)
wiki_lint_job = dg.define_asset_job("wiki_lint_job", selection=["wiki_lint"], tags=WIKI_RUN_TAGS,
                                    executor_def=dg.in_process_executor)
wiki_synthesis_job = dg.define_asset_job("wiki_synthesis_job", selection=["wiki_synthesis"], tags=WIKI_RUN_TAGS,
                                         executor_def=dg.in_process_executor)
wiki_topic_job = dg.define_asset_job(
    "wiki_topic_job", selection=["wiki_topic_synthesis"], tags=WIKI_RUN_TAGS, executor_def=dg.in_process_executor,
    description="Write or update the synthesis of one topic (the partition key is the topic).",
)
