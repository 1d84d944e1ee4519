"""`kb sync`: add a sync batch, then materialize every stage for it, in order.

Each stage is its own run in the Dagster instance in KB_HOME, so the UI shows
it, and a failed stage does not stop the stages after it: they work on what
exists. At the end the report names every stage that failed.

A sync that was killed (SIGKILL, power loss) leaves its work half done. So
each sync first recovers (tests/test_crash_safety.py proves each step):
1. Runs whose process is gone are marked failed, and their pool slots are
   freed (kb_resources/run_monitor.py). Without this the next run that needs
   the pool `duckdb` waits for ever.
2. Earlier batches whose sync did not reach the last stage get their missing
   stages now, oldest batch first, before the new batch. The order matters:
   normalize lets the later batch win for a post that two batches hold.
   Every stage replaces its partition's rows, so to redo a stage that was cut
   off never duplicates anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from kb_assets.partitions import new_batch_key, sync_batches
from kb_resources.dagster_home import ensure_dagster_home
from kb.raw_store import RawStore
from kb_resources.run_monitor import (
    PID_TAG,
    PROCESS_GONE_TAG,
    fail_runs_of_dead_processes,
    process_alive,
    this_process_tags,
)

# The X path, in order. Each entry: (stage name, asset keys in that stage).
# A stage whose assets are not in the Definitions (an enrichment that is not
# built yet) is left out.
X_STAGES: list[tuple[str, list[str]]] = [
    ("capture", ["x_raw_pages"]),
    ("normalize", ["bookmarks", "authors", "media", "links"]),
    ("documents", ["documents"]),
    ("captions", ["captions"]),
    ("transcripts", ["transcripts"]),
    ("chunks", ["chunks"]),
    ("translations", ["translations"]),
    ("index", ["chunk_index"]),
]

BATCH_TAG = "kb/sync_batch"
STAGE_TAG = "kb/stage"
# Earlier batches that a sync checks for unfinished work. Older ones are for
# a backfill in the Dagster UI; the check must stay fast as batches grow.
RESUME_LOOKBACK = 20
# A stage whose process died this many times is not tried again: it may be
# the stage that kills the process (out of memory). The report says so.
MAX_DEATHS = 3
# kb sync redoes its own stages (below). Dagster's run retries must not try
# too: they would look for the ad hoc job of dg.materialize in the code
# location, and it is not there.
NO_DAGSTER_RETRY = {"dagster/max_retries": "0"}


@dataclass
class StageResult:
    stage: str
    ok: bool
    seconds: float
    error: str = ""
    batch: str = ""  # the sync batch it ran for ("" for unpartitioned stages)


@dataclass
class SyncReport:
    batch: str
    stages: list[StageResult] = field(default_factory=list)
    # Runs of earlier syncs whose process was gone; kb marked them failed.
    gone_runs: list[str] = field(default_factory=list)
    # Earlier batches that this sync finished.
    resumed: list[str] = field(default_factory=list)
    # Earlier batches that were left as they are, and why.
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        """The stages that failed; a stage of an earlier batch names its batch."""
        return [f"{s.stage} (batch {s.batch})" if s.batch and s.batch != self.batch else s.stage
                for s in self.stages if not s.ok]


@dataclass(frozen=True)
class UnfinishedBatch:
    batch: str
    stages: list[str]  # the stages to run again, in order
    note: str = ""  # why nothing is run for it, when stages is empty


def _first_error(result: dg.ExecuteInProcessResult) -> str:
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            return event.step_failure_data.error.message.strip().splitlines()[0][:300]
    return "the stage failed (see the Dagster UI for the run log)"


def _finished(record: dg.RunRecord | None) -> bool:
    """A stage is done when its last run ended on its own: a success, a
    failure of the stage itself, or a cancel by the owner. A run whose
    process was gone did not end on its own."""
    if record is None:
        return False
    run = record.dagster_run
    if run.status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELED):
        return True
    return run.status == dg.DagsterRunStatus.FAILURE and run.tags.get(PROCESS_GONE_TAG) != "true"


def _owned_by_live_sync(record: dg.RunRecord) -> bool:
    """True when the process that made this run still lives: another `kb
    sync` works on the batch now (between two stages it has no open run).
    This process does not count: its earlier run_sync call has returned."""
    pid = record.dagster_run.tags.get(PID_TAG, "")
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    return process_alive(int(pid), record.create_timestamp.timestamp())


def unfinished_batches(instance: dg.DagsterInstance, stage_names: list[str],
                       raw_store: RawStore | None = None) -> list[UnfinishedBatch]:
    """Earlier batches of `kb sync` that did not reach the last stage, oldest
    first, each with the stages to run again. Call it after
    fail_runs_of_dead_processes, so that a dead run is a failed run."""
    raw_store = raw_store or RawStore.from_settings()
    batches = sorted(instance.get_dynamic_partitions(sync_batches.name))[-RESUME_LOOKBACK:]
    if not batches:
        return []
    records = instance.get_run_records(filters=dg.RunsFilter(tags={BATCH_TAG: batches}))
    by_batch: dict[str, list[dg.RunRecord]] = {}
    for record in records:
        by_batch.setdefault(record.dagster_run.tags[BATCH_TAG], []).append(record)

    found = []
    for batch in batches:
        runs = sorted(by_batch.get(batch, []), key=lambda r: r.storage_id)  # the order they were made
        if not runs:
            continue  # not a kb sync batch (a sensor run, the UI), or killed before its first run
        newest = runs[-1]
        if not newest.dagster_run.is_finished or _owned_by_live_sync(newest):
            continue
        latest = {r.dagster_run.tags.get(STAGE_TAG): r for r in runs}  # later runs overwrite earlier ones
        if _finished(latest.get(stage_names[-1])):
            continue
        # The capture is not run again for an old batch: a cut-off capture
        # keeps its pages and did not move the watermark, so the new batch
        # captures the same ground again. The later stages use the pages kept.
        todo = [s for s in stage_names if s != "capture" and not _finished(latest.get(s))]
        if raw_store.manifest(batch) is None and not raw_store.pages(batch):
            continue  # the capture was cut off before it kept anything: there is nothing to finish
        deaths = {s: sum(1 for r in runs if r.dagster_run.tags.get(STAGE_TAG) == s
                         and r.dagster_run.tags.get(PROCESS_GONE_TAG) == "true") for s in todo}
        given_up = [s for s in todo if deaths[s] >= MAX_DEATHS]
        if given_up:
            found.append(UnfinishedBatch(batch, [], f"the process died {MAX_DEATHS} times in the stage "
                                         f"{given_up[0]}; materialize the batch in the Dagster UI"))
            continue
        found.append(UnfinishedBatch(batch, todo))
    return found


def materialize_stage(instance: dg.DagsterInstance, resources: dict, name: str, keys: list[str],
                      batch: str | None, *, ops: dict | None = None, log_level: str = "WARNING") -> StageResult:
    """Materialize one stage as its own Dagster run. Never raises: a stage
    that fails, or cannot even start, must not stop the stages after it."""
    from kb_assets.definitions import all_assets, all_checks

    started = time.monotonic()
    run_config: dict = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if ops:
        run_config["ops"] = ops
    tags = {STAGE_TAG: name, **this_process_tags(), **NO_DAGSTER_RETRY}
    if batch:
        tags[BATCH_TAG] = batch
    try:
        result = dg.materialize(
            [*all_assets, *all_checks], selection=keys, partition_key=batch, instance=instance,
            resources=resources, run_config=run_config, raise_on_error=False, tags=tags,
        )
        ok, error = result.success, ("" if result.success else _first_error(result))
    except Exception as exc:
        ok, error = False, f"{type(exc).__name__}: {exc}"
    return StageResult(name, ok, time.monotonic() - started, error, batch=batch or "")


def rebuild_index(*, resources: dict | None = None, on_stage: Callable[[str, int, int], None] | None = None,
                  log_level: str = "WARNING") -> SyncReport:
    """`kb index --rebuild`: drop the vectors and the model record, then index
    every sync batch and the wiki again. Use it after a change of embedding
    model. Texts that the vector cache holds for the model are not embedded again."""
    from kb_assets.definitions import build_resources
    from kb.lance_index import ChunkIndex

    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    gone = fail_runs_of_dead_processes(instance)
    resources = resources or build_resources()
    ChunkIndex.from_settings().rebuild()
    batches = sorted(instance.get_dynamic_partitions(sync_batches.name))
    results: list[StageResult] = []
    for number, batch in enumerate(batches, start=1):
        if on_stage:
            on_stage("index", number, len(batches) + 1)
        results.append(materialize_stage(instance, resources, "index", ["chunk_index"], batch, log_level=log_level))
    if on_stage:
        on_stage("wiki index", len(batches) + 1, len(batches) + 1)
    results.append(materialize_stage(instance, resources, "wiki index", ["wiki_index"], None, log_level=log_level))
    # The Telegram sources were in the dropped table too: index each again
    # (a rejected one only leaves nothing behind).
    for item_id in sorted(instance.get_dynamic_partitions("sources")):
        results.append(materialize_stage(instance, resources, "source index", ["source_passages"], item_id,
                                         log_level=log_level))
    return SyncReport(batch="", stages=results, gone_runs=[g.run_id for g in gone])


def run_sync(
    *,
    full: bool = False,
    files: list[str] | None = None,
    resources: dict | None = None,
    on_stage: Callable[[str, int, int], None] | None = None,
    log_level: str = "WARNING",
) -> SyncReport:
    """Finish the batches that earlier syncs left unfinished, then run one new
    sync batch through every stage. `files` imports raw Bookmarks pages
    instead of opening the browser (the demo and `kb import`)."""
    from kb_assets.definitions import all_assets, build_resources

    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    gone = fail_runs_of_dead_processes(instance)
    known = {key.to_user_string() for a in all_assets for key in a.keys}
    stages = [(name, [k for k in keys if k in known]) for name, keys in X_STAGES]
    stages = [(name, keys) for name, keys in stages if keys]
    stage_keys = dict(stages)
    resources = resources or build_resources()
    unfinished = unfinished_batches(instance, [name for name, _ in stages])
    total = sum(len(u.stages) for u in unfinished) + len(stages)
    capture_config = {"full": full, "files": list(files or [])}

    def run_stage(batch: str, name: str, number: int) -> StageResult:
        if on_stage:
            on_stage(name, number, total)
        ops = {"x_raw_pages": {"config": capture_config}} if name == "capture" else None
        return materialize_stage(instance, resources, name, stage_keys[name], batch, ops=ops, log_level=log_level)

    results: list[StageResult] = []
    resumed: list[str] = []
    for earlier in unfinished:
        if not earlier.stages:
            continue
        for name in earlier.stages:
            results.append(run_stage(earlier.batch, name, len(results) + 1))
        resumed.append(earlier.batch)

    # The new batch's partition comes after the recovery: a sync killed
    # during the recovery leaves no empty batch behind.
    batch = new_batch_key()
    instance.add_dynamic_partitions(sync_batches.name, [batch])
    for name, _keys in stages:
        results.append(run_stage(batch, name, len(results) + 1))
    notes = [f"batch {u.batch} is left as it is: {u.note}" for u in unfinished if not u.stages]
    return SyncReport(batch=batch, stages=results, gone_runs=[g.run_id for g in gone], resumed=resumed,
                      notes=notes)
