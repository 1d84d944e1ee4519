"""Asset keys and run tags: one copy of each name.

Sensors, jobs, the wiki stage, the item state reader and the `kb` command
all name the same assets and tags. A second copy of a name once drifted.
"""

import dagster as dg

# --- asset keys ----------------------------------------------------------------------
X_RAW_PAGES = dg.AssetKey("x_raw_pages")
PARSED_SOURCES = dg.AssetKey("parsed_sources")
GATED_SOURCES = dg.AssetKey("gated_sources")
SOURCE_PASSAGES = dg.AssetKey("source_passages")
WIKI_PAGES = dg.AssetKey("wiki_pages")
WIKI_LINT = dg.AssetKey("wiki_lint")
WIKI_SYNTHESIS = dg.AssetKey("wiki_synthesis")
WIKI_TOPIC_SYNTHESIS = dg.AssetKey("wiki_topic_synthesis")
# Every asset that changes the wiki pages.
WIKI_WRITERS = [WIKI_PAGES, WIKI_LINT, WIKI_SYNTHESIS, WIKI_TOPIC_SYNTHESIS]

# The jobs whose tries sensors/stuck_steps.py watches: one Telegram item, and the wiki's jobs.
SOURCE_INTAKE_JOB = "source_intake"
WIKI_JOB_NAMES = ("wiki_ingest_job", "wiki_lint_job", "wiki_synthesis_job", "wiki_topic_job")

# --- run tags that Dagster defines ------------------------------------------------------
PARTITION_TAG = "dagster/partition"
WILL_RETRY_TAG = "dagster/will_retry"
# The first run of a chain of run retries and re-executions.
ROOT_RUN_TAG = "dagster/root_run_id"
MAX_RETRIES_TAG = "dagster/max_retries"
RETRY_ON_ASSET_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
# Seconds after which Dagster's run monitoring stops the run (MAX_RUNTIME_SECONDS_TAG of Dagster).
MAX_RUNTIME_TAG = "dagster/max_runtime"

# --- run tags of kb -----------------------------------------------------------------
BATCH_TAG = "kb/sync_batch"
STAGE_TAG = "kb/stage"
OVERRIDE_TAG = "kb/override"
OVERRIDE_VALUE = "true"  # the one value of OVERRIDE_TAG (kb_assets/run_config_rules.py)
# On an x_sync run whose command (`kb sync`) runs the catch-up after a failed
# capture in its own process: the daemon's x_catch_up_sensor leaves it alone.
CATCH_UP_TAG = "kb/catch_up"
TOPIC_TAG = "kb/topic"
REQUESTED_BY_TAG = "kb/requested_by"


# --- run metadata -------------------------------------------------------------------
# The metadata key, on the failed stage check (kb_assets/enrich/enrichment.py,
# stage_check_spec), that says why the stage's outside service stopped. The
# run goes on: the stages after it (chunks, the index) must still index what
# exists. The UI shows the check red; `kb sync` reads the check's status and
# reports the stage as failed; the coverage check shows the rows that wait.
STOPPED = "stopped"
