"""`kb sync`, `kb import`, `kb demo`: one run of the job `x_sync` for a new
sync batch, in the Dagster instance under KB_HOME.

It is the same job that the sensor `x_sync_sensor`, a schedule and the
Dagster UI launch, from the same code location ("kb"). When `kb up` runs
for KB_HOME, the run goes to its webserver and the daemon executes it: the
UI can re-execute it from failure. Else the run executes in this process
(dg.execute_job), so the embedding progress bar shows in the terminal
(kb/apps/run_paths.py). Both ways, this process reads the run's events as
they come and prints a progress line when a stage starts.

Dagster holds the order of the stages (the asset graph) and what is left to
do after a crash (re-execution from failure). Before the new batch, a sync:
1. asks the run launcher about every started run (kb_assets/run_launcher.py):
   the runs of dead workers are marked failed and their pool slots freed, as
   the daemon's run monitoring does. Without this, the next run that needs
   the pool `wiki` waits for ever, and a dead sync stays STARTED.
2. re-executes from failure the last run of each earlier batch that did not
   finish, oldest batch first. The order matters: normalize lets the later
   batch win for a post that two batches hold. Every stage replaces its
   partition's rows, so a stage that runs again duplicates nothing.
After the new batch's run, a sync catches up: one run of `x_catch_up` for
each earlier batch with work that waits (catch_up). A run of a partition
reads and writes only its own batch's items.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from kb.apps.run_paths import (
    LaunchError,
    answers,
    execute_here,
    kb_up_webserver,
    new_launch,
    submit,
    submit_reexecution,
)
from kb.apps.run_report import failed_items, index_failures, unreadable_pages, waiting_for_services
from kb.error_lines import first_line
from kb.settings import get_settings
from kb_assets.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from kb_assets.instance_config import ensure_dagster_home
from kb_assets.keys import CATCH_UP_TAG, SOURCE_PASSAGES, STOPPED, X_RAW_PAGES
from kb_assets.partitions import new_batch_key, sync_batches
from kb_assets.run_launcher import PID_TAG, fail_runs_of_dead_workers, this_process_tags
from kb_assets.run_config_rules import files_for_import
from kb_assets.source_states import step_error_line
from kb_resources.run_worker import BOOT_TAG, HOST_TAG

SYNC_JOB = "x_sync"
CAPTURE_JOB = "capture_job"  # `kb capture`
CATCH_UP_JOB = "x_catch_up"  # the stages after a failed capture
CAPTURE_STAGE = X_RAW_PAGES.to_user_string()
PARTITION_TAG = "dagster/partition"
# Earlier batches that a sync checks for unfinished work. Older ones are for
# the Dagster UI; the check must stay fast as batches grow.
RESUME_LOOKBACK = 20
# A batch whose runs failed this many times in a row at the same steps is not
# tried again: the failure may be the stage's own (a bug, the out-of-memory
# killer). The report says so.
MAX_FAILED_RUNS = 3
# Per-step detail for the report; the rest of the event log stays in the UI.
# CRITICAL: a failed step logs its error with a stack trace at ERROR, and
# the end report names the same error on the stage's line. The owner is
# told once (issue 48); the trace stays in the UI.
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# Names one launch of this process: the reader of the events finds the run
# that dg.execute_job makes by it.
LAUNCH_TAG = "kb/launch"
# The seconds between two reads of a run's new events.
FOLLOW_POLL_S = 0.25
# The tags of a failed run that its re-execution keeps: the partitions, and
# kb's choices for the run (kb/exclude, kb/catch_up). Not the tags that name
# the parent's worker process or launch: they would make the new run look dead.
KEPT_DAGSTER_TAGS = (PARTITION_TAG, ASSET_PARTITION_RANGE_START_TAG, ASSET_PARTITION_RANGE_END_TAG)
WORKER_TAGS = (PID_TAG, HOST_TAG, BOOT_TAG, LAUNCH_TAG)


@dataclass
class StageResult:
    stage: str  # the step: x_raw_pages, bookmarks, ..., chunk_index
    ok: bool
    seconds: float
    error: str = ""
    batch: str = ""  # the sync batch it ran for ("" for unpartitioned jobs)
    # What the stage recorded, per asset: {asset key: {metadata key: value}}.
    metadata: dict[str, dict] = field(default_factory=dict)
    ran: bool = True  # False: the step never started (an earlier step failed, or the run stopped)


@dataclass
class SyncReport:
    batch: str
    stages: list[StageResult] = field(default_factory=list)
    # Runs of earlier syncs whose worker was gone; kb marked them failed.
    gone_runs: list[str] = field(default_factory=list)
    # Earlier batches that this sync finished.
    resumed: list[str] = field(default_factory=list)
    # Earlier batches whose waiting work this sync did, one run each (catch_up).
    caught_up: list[str] = field(default_factory=list)
    # Earlier batches that were left as they are, and why.
    notes: list[str] = field(default_factory=list)
    # The Dagster runs of this sync, in order.
    run_ids: list[str] = field(default_factory=list)
    # What the command could not read or do, although its stages finished
    # (a page that is not a Bookmarks page, a link that failed). Each one
    # makes the command exit non-zero.
    problems: list[str] = field(default_factory=list)
    # The name of the work in the last line: "Batch <key>" when empty.
    title: str = ""

    @property
    def ok(self) -> bool:
        return not self.failed and not self.problems

    def add(self, ran: tuple[str, list[StageResult]]) -> None:
        """The run id ("" when no run was made) and the stages of one run."""
        run_id, stages = ran
        if run_id:
            self.run_ids.append(run_id)
        self.stages += stages

    @property
    def failed(self) -> list[str]:
        """The stages that failed; a stage of an earlier batch names its batch."""
        return [f"{s.stage} (batch {s.batch})" if s.batch and s.batch != self.batch else s.stage
                for s in self.stages if not s.ok]


# --- one run, and its events --------------------------------------------------------------


class StageWatcher:
    """Reads the events of a run as they come: a progress line when a stage
    starts, and one StageResult per stage when it ends."""

    def __init__(self, run: dg.DagsterRun, instance: dg.DagsterInstance,
                 on_stage: Callable[[str, int, int], None] | None):
        from kb_assets.definitions import all_checks

        self.run_id = run.run_id
        self.run_error = ""  # why the run failed before any stage ended
        checks = {c.node_def.name for c in all_checks}
        plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        todo = set(run.step_keys_to_execute or [step.key for step in plan.steps])
        self.stages = sorted(key for key in todo if key not in checks)  # in the order they start, below
        self.order: list[str] = []
        self.batch = run.tags.get(PARTITION_TAG, "")
        self.on_stage = on_stage
        self.started: dict[str, float] = {}
        self.stopped: dict[str, str] = {}  # stage -> what its outside service said
        self.results: dict[str, StageResult] = {}
        self.metadata: dict[str, dict[str, dict]] = {}  # stage -> asset -> values

    def __call__(self, event: dg.DagsterEvent, at: float) -> None:
        """One event of the run; `at`: its time (Unix seconds)."""
        kind = event.event_type
        if kind == dg.DagsterEventType.RUN_FAILURE and not self.results:
            self.run_error = first_line(event.message or "", "the stage failed")
        key = event.step_key
        if key not in self.stages:
            return
        if kind == dg.DagsterEventType.STEP_START:
            self.started[key] = at
            self.order.append(key)
            if self.on_stage:
                self.on_stage(key, len(self.order), len(self.stages))
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            values = {name: value.value for name, value in materialization.metadata.items()}
            self.metadata.setdefault(key, {}).setdefault(materialization.asset_key.to_user_string(), {}).update(values)
        elif kind == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            # Dagster's own status of the stage: a failed check of severity
            # ERROR (kb_assets/enrich/enrichment.py, stage_check_spec) is a
            # failed stage, shown red in the UI. No other channel says so.
            check = event.asset_check_evaluation_data
            # The check's numbers, under its name: the coverage checks count
            # what waits in every batch (kb/apps/run_report.py reads them).
            self.metadata.setdefault(key, {})[check.check_name] = {
                name: value.value for name, value in (check.metadata or {}).items()}
            if not check.passed and check.severity == dg.AssetCheckSeverity.ERROR:
                why = check.description or f"the check {check.check_name} failed"
                self.stopped[key] = why
                asset = self.metadata.setdefault(key, {}).setdefault(check.asset_key.to_user_string(), {})
                asset[STOPPED] = why
        elif kind == dg.DagsterEventType.STEP_SUCCESS:
            self._end(key, at, key not in self.stopped, self.stopped.get(key, ""))
        elif kind == dg.DagsterEventType.STEP_FAILURE:
            error = event.step_failure_data.error if event.step_failure_data else None
            self._end(key, at, False, step_error_line(error) if error else "the stage failed")

    def _end(self, key: str, at: float, ok: bool, error: str) -> None:
        seconds = at - self.started.get(key, at)
        self.results[key] = StageResult(key, ok, seconds, error, batch=self.batch, metadata=self.metadata.get(key, {}))

    def report(self, run_error: str = "") -> list[StageResult]:
        """One result per stage, in order. A stage that did not run (an
        earlier stage failed, or the run stopped) is a failure too."""
        why = run_error or self.run_error or "it did not run: an earlier stage failed"
        ordered = self.order + [key for key in self.stages if key not in self.order]
        return [self.results.get(key) or StageResult(key, False, 0.0, why, batch=self.batch, ran=False)
                for key in ordered]


class Runs:
    """The runs of one kb command, and what their stages did. At kb up's
    webserver when kb up runs for KB_HOME (its daemon executes them), else
    in this process (kb/apps/run_paths.py). A failed stage never raises:
    the run's record and the results say what failed."""

    def __init__(self, instance: dg.DagsterInstance, on_stage: Callable[[str, int, int], None] | None = None):
        self.instance = instance
        self.on_stage = on_stage
        webserver = kb_up_webserver(get_settings().home)
        self.webserver = webserver if webserver is not None and answers(webserver) else None

    def run(self, job_name: str, *, run_config: dict, tags: dict[str, str]) -> tuple[str, list[StageResult]]:
        """One new run of `job_name`; returns its run id ("" when no run was made) and its stages."""
        if self.webserver is not None:
            return self._submitted(job_name, lambda: submit(self.webserver, job_name, run_config=run_config,
                                                            tags=tags))
        return self._here(job_name, run_config, tags, None)

    def run_together(self, job_name: str, launches: list[tuple[dict, dict[str, str]]]
                     ) -> list[tuple[str, list[StageResult]]]:
        """One run of `job_name` for each (run config, tags). At kb up's
        webserver every run is submitted first, so the daemon has them all
        at once, and then each is followed to its end. In this process they
        execute one after another."""
        if self.webserver is None:
            return [self._here(job_name, run_config, tags, None) for run_config, tags in launches]
        submitted: list[tuple[str, str]] = []  # (run id, why no run was made)
        for run_config, tags in launches:
            try:
                submitted.append((submit(self.webserver, job_name, run_config=run_config, tags=tags), ""))
            except LaunchError as exc:
                submitted.append(("", str(exc)))
        return [self._followed(run_id) if run_id else ("", [StageResult(job_name, False, 0.0, error, ran=False)])
                for run_id, error in submitted]

    def reexecute(self, parent: dg.DagsterRun) -> tuple[str, list[StageResult]]:
        """Dagster's re-execution from failure of `parent`: the steps that did
        not succeed and the steps after them, with the parent's config."""
        tags = kept_tags(parent)
        if self.webserver is not None:
            return self._submitted(parent.job_name, lambda: submit_reexecution(self.webserver, parent, tags))
        return self._here(parent.job_name, None, tags, parent)

    def _submitted(self, job_name: str, launch: Callable[[], str]) -> tuple[str, list[StageResult]]:
        try:
            run_id = launch()
        except LaunchError as exc:
            return "", [StageResult(job_name, False, 0.0, str(exc), ran=False)]
        return self._followed(run_id)

    def _followed(self, run_id: str) -> tuple[str, list[StageResult]]:
        """Follow a submitted run to its end."""
        run = self.instance.get_run_by_id(run_id)
        watcher = self._follow(run, lambda: self.instance.get_run_by_id(run_id).is_finished)
        return run_id, watcher.report()

    def _here(self, job_name: str, run_config: dict | None, tags: dict[str, str],
              parent: dg.DagsterRun | None) -> tuple[str, list[StageResult]]:
        launch = new_launch()
        tags = {**tags, **this_process_tags(), LAUNCH_TAG: launch}
        done = threading.Event()
        followed: list[StageWatcher] = []
        # The events are read in a thread while dg.execute_job executes the
        # run here: it gives them only at its end, and the owner sees a line
        # when each stage starts.
        reader = threading.Thread(target=self._follow_launch, args=(launch, done, followed),
                                  name="kb-run-events", daemon=True)
        reader.start()
        error = ""
        try:
            execute_here(self.instance, job_name, launch, run_config=run_config, tags=tags, parent=parent)
        except Exception as exc:  # the run could not start or went wrong outside a step: name the reason
            error = f"{type(exc).__name__}: {exc}"
        finally:
            done.set()
            reader.join()
        if not followed:
            return "", [StageResult(job_name, False, 0.0, f"kb could not make the run: {error}", ran=False)]
        watcher = followed[0]
        if error:
            current = self.instance.get_run_by_id(watcher.run_id)
            if current is not None and not current.is_finished:
                self.instance.report_run_failed(current, f"kb could not execute the run: {error}")
        return watcher.run_id, watcher.report(error)

    def _follow_launch(self, launch: str, done: threading.Event, followed: list[StageWatcher]) -> None:
        while True:
            ended = done.is_set()
            found = self.instance.get_run_records(filters=dg.RunsFilter(tags={LAUNCH_TAG: launch}), limit=1)
            if found:
                followed.append(self._follow(found[0].dagster_run, done.is_set, done.wait))
                return
            if ended:
                return  # no run was made
            done.wait(FOLLOW_POLL_S)

    def _follow(self, run: dg.DagsterRun, finished: Callable[[], bool],
                pause: Callable[[float], object] = time.sleep) -> StageWatcher:
        """Read the run's events as they come, until it finished. `pause`
        waits between two reads: the Event of a run in this process wakes it
        when the run ends, so the command does not sleep after its run."""
        watcher = StageWatcher(run, self.instance, self.on_stage)
        cursor = None
        while True:
            ended = finished()
            page = self.instance.get_records_for_run(run.run_id, cursor=cursor)
            for record in page.records:
                entry = record.event_log_entry
                if entry.dagster_event is not None:
                    watcher(entry.dagster_event, entry.timestamp)
            cursor = page.cursor
            if ended and not page.has_more:
                return watcher
            if not page.has_more:
                pause(FOLLOW_POLL_S)


def kept_tags(parent: dg.DagsterRun) -> dict[str, str]:
    """The parent's tags that a re-execution keeps (an allowlist)."""
    return {key: value for key, value in parent.tags.items()
            if key in KEPT_DAGSTER_TAGS or (key.startswith("kb/") and key not in WORKER_TAGS)}


# --- earlier batches ----------------------------------------------------------------------


@dataclass(frozen=True)
class UnfinishedBatch:
    batch: str
    last_run: dg.DagsterRun | None  # the run to re-execute from failure; None: left as it is
    note: str = ""


def unfinished_batches(instance: dg.DagsterInstance) -> list[UnfinishedBatch]:
    """Earlier batches whose last x_sync run failed, oldest first. A batch
    whose run is in progress, queued, finished or canceled is left to it.
    Call it after fail_runs_of_dead_workers, so that a dead run is failed."""
    batches = sorted(instance.get_dynamic_partitions(sync_batches.name))[-RESUME_LOOKBACK:]
    if not batches:
        return []
    records = instance.get_run_records(filters=dg.RunsFilter(job_name=SYNC_JOB, tags={PARTITION_TAG: batches}))
    by_batch: dict[str, list[dg.RunRecord]] = {}
    for record in records:
        by_batch.setdefault(record.dagster_run.tags[PARTITION_TAG], []).append(record)
    found = []
    for batch in batches:
        runs = sorted(by_batch.get(batch, []), key=lambda r: r.storage_id)
        if not runs or runs[-1].dagster_run.status != dg.DagsterRunStatus.FAILURE:
            continue
        # Runs that made no progress: the same steps to do as the last run.
        # A kill in a later stage each time is progress, and goes on.
        todo = frozenset(runs[-1].dagster_run.step_keys_to_execute or [])
        failures = 0
        for record in reversed(runs):
            run = record.dagster_run
            if run.status != dg.DagsterRunStatus.FAILURE or frozenset(run.step_keys_to_execute or []) != todo:
                break
            failures += 1
        if failures >= MAX_FAILED_RUNS:
            found.append(UnfinishedBatch(batch, None, f"its runs failed {failures} times at the same step; see run "
                                         f"{runs[-1].dagster_run.run_id} in the Dagster UI, and re-execute it "
                                         "from failure there when the cause is fixed"))
            continue
        found.append(UnfinishedBatch(batch, runs[-1].dagster_run))
    return found


# --- the commands ---------------------------------------------------------------------------


def sync_run_config(*, full: bool = False, files: list[str] | None = None) -> dict:
    return {**QUIET_LOGS, "ops": {"x_raw_pages": {"config": {"full": full, "files": list(files or [])}}}}


def sync_tags(exclude: list[str] | None = None) -> dict[str, str]:
    from kb_assets.run_choices import EXCLUDE_TAG

    return {EXCLUDE_TAG: ",".join(exclude)} if exclude else {}


def instance_for_runs() -> tuple[dg.DagsterInstance, list[dg.DagsterRun]]:
    """The Dagster instance under KB_HOME, and the earlier runs of dead
    workers that the launcher's health rule failed just now."""
    # The libraries and models that this process loaded (earlier runs too)
    # stay for its life: out of the garbage collector's scans, as in
    # kb_assets/definitions.py. The price: a garbage cycle that is alive at
    # the freeze is never collected; a kb command runs one sync per process.
    gc.freeze()
    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    return instance, fail_runs_of_dead_workers(instance)


def run_capture(*, full: bool = False, on_stage: Callable[[str, int, int], None] | None = None) -> SyncReport:
    """`kb capture`: one run of `capture_job` for a new sync batch: the new
    bookmarks and their tables, no enrichment and no index. The next sync
    takes that work, as it takes all the work that waits."""
    instance, gone = instance_for_runs()
    report = SyncReport(batch=new_batch_key(), gone_runs=[run.run_id for run in gone], title="Capture")
    instance.add_dynamic_partitions(sync_batches.name, [report.batch])
    report.add(Runs(instance, on_stage).run(CAPTURE_JOB, run_config=sync_run_config(full=full),
                                            tags={PARTITION_TAG: report.batch}))
    report.stages = without_stages_done_later(report.stages)
    report.problems += unreadable_pages(report, CAPTURE_STAGE)
    if report.ok:
        report.notes.append("`kb sync` carries the new bookmarks through the other stages to the index.")
    return report


def run_sync(
    *,
    full: bool = False,
    files: list[str] | None = None,
    exclude: list[str] | None = None,
    on_stage: Callable[[str, int, int], None] | None = None,
) -> SyncReport:
    """Finish the batches that earlier syncs left unfinished, then run the
    job x_sync for one new sync batch. `files` imports raw Bookmarks pages
    instead of opening the browser (the demo and `kb import`). `exclude`:
    source kinds to leave out in this run (the run tag kb/exclude)."""
    if files:
        # The owner named these files: a file that the run config's rule
        # refuses only for its dot-folder is imported from a copy in KB_HOME.
        # First of all: a copy that fails leaves no batch and no run behind.
        files = files_for_import(files)
    instance, gone = instance_for_runs()
    report = SyncReport(batch="", gone_runs=[run.run_id for run in gone])
    runs = Runs(instance, on_stage)
    for earlier in unfinished_batches(instance):
        if earlier.last_run is None:
            report.notes.append(f"batch {earlier.batch} is left as it is: {earlier.note}")
            continue
        report.add(runs.reexecute(earlier.last_run))
        report.resumed.append(earlier.batch)

    # The new batch's partition comes after the recovery: a sync killed
    # during the recovery leaves no empty batch behind.
    report.batch = new_batch_key()
    instance.add_dynamic_partitions(sync_batches.name, [report.batch])
    # The tag tells the daemon's x_catch_up_sensor that this command runs the catch-up itself.
    new_run = runs.run(SYNC_JOB, run_config=sync_run_config(full=full, files=files),
                       tags={PARTITION_TAG: report.batch, CATCH_UP_TAG: "kb sync", **sync_tags(exclude)})
    report.add(new_run)
    catch_up(runs, report, exclude, new_run[0])
    report.stages = without_stages_done_later(report.stages)
    # Pages that are not Bookmarks pages, and a capture that read none, fail
    # the command: else an import of the wrong file ends with "finished".
    report.problems += unreadable_pages(report, "x_raw_pages")
    # A dead link is a fault of the web, not of the sync: named, not failed.
    report.notes += [f"Could not fetch {line}" for line in failed_items(report, "documents")]
    report.notes += waiting_for_services(report)
    report.notes += model_notes(report)
    report.problems += index_failures(report)
    return report


def model_notes(report: SyncReport) -> list[str]:
    """The model of the index, when a stage of the sync indexed, and the
    advice when the configured model is ready and the index holds another."""
    from kb.index.model_choice import model_note

    models = [values["model"] for stage in report.stages
              if (values := stage.metadata.get("chunk_index")) and values.get("model")]
    if not models:
        return []
    note = model_note(models[-1])
    return [f"Index model: {models[-1]}."] + ([note] if note else [])


def catch_up(runs: Runs, report: SyncReport, exclude: list[str] | None, new_run: str) -> None:
    """The work that waits in the earlier batches (an item that a stopped
    service or a failed capture left; kb/index/waiting_work.py finds it):
    one run of `x_catch_up` for each of those batches, oldest first, all
    launched together (class Runs, run_together). A run of a partition
    takes only that partition's items, so each materialization says what
    its batch holds. A stage that failed, stopped or was off in the new
    batch's run, or off in its latest materialization, is left out of the
    plan (sensors/capture_failed.py, stages_that_cannot_run): its service
    would refuse the older items too, and the next sync tries them."""
    report.caught_up = catch_up_batches(runs.instance, report, exclude, new_run)
    tags = {CATCH_UP_TAG: "kb sync", **sync_tags(exclude)}
    for ran in runs.run_together(CATCH_UP_JOB, [(QUIET_LOGS, {PARTITION_TAG: batch, **tags})
                                                for batch in report.caught_up]):
        report.add(ran)


def catch_up_batches(instance: dg.DagsterInstance, report: SyncReport, exclude: list[str] | None,
                     new_run: str) -> list[str]:
    """The earlier batches with work that waits in a stage that can do it
    now, oldest first. `new_run`: the new batch's run ("" when none was made)."""
    from kb.index.batch_index import indexed_passages
    from kb.index.client import ChunkIndex
    from kb.index.waiting_work import STAGES, waiting_work
    from kb.settings import excluded_sources
    from kb.store.duckdb_store import DuckDBStore
    from sensors.capture_failed import stages_that_cannot_run

    settings = get_settings()
    skip = excluded_sources(for_this_run=",".join(exclude or []))
    stages = set(STAGES) - stages_that_cannot_run(instance, new_run)
    batches = [b for b in sorted(instance.get_dynamic_partitions(sync_batches.name)) if b != report.batch]
    if not stages or not batches:
        return []
    stored = indexed_passages(ChunkIndex.from_settings(), skip)  # before DuckDB opens: see its text
    with DuckDBStore.from_settings().connect() as conn:
        waiting = waiting_work(conn, stored, skip, stages=stages, x_login=settings.x_state_path.exists(),
                               batches=batches)
    return list(waiting)


def without_stages_done_later(stages: list[StageResult]) -> list[StageResult]:
    """The results without the lines of the stages that did not run because
    their batch's capture failed: the capture's line says why, once, and
    a batch whose capture failed holds no new bookmark, so its later
    stages have nothing to do."""
    cut_off = {s.batch for s in stages if s.stage == CAPTURE_STAGE and not s.ok}
    return [s for s in stages if s.ran or s.batch not in cut_off]


def run_batches(job: str, runs: list[tuple[str, dict]], *, title: str, tags: dict[str, str] | None = None,
                on_stage: Callable[[str, int, int], None] | None = None) -> SyncReport:
    """One run of `job` for each (sync batch, op config), in the given order,
    in the instance under KB_HOME (class Runs says where the runs execute).
    The per-run choices are the op config (limit, retry) and the tags (kb/exclude)."""
    instance, gone = instance_for_runs()
    report = SyncReport(batch="", gone_runs=[run.run_id for run in gone], title=title)
    if not runs:
        return report
    launcher = Runs(instance, on_stage)
    for batch, ops in runs:
        report.add(launcher.run(job, run_config={**QUIET_LOGS, **({"ops": ops} if ops else {})},
                                tags={PARTITION_TAG: batch, **(tags or {})}))
    return report


def known_batches() -> list[str]:
    """The sync batches of the instance under KB_HOME, oldest first."""
    ensure_dagster_home()
    return sorted(dg.DagsterInstance.get().get_dynamic_partitions(sync_batches.name))


def rebuild_index(*, rebuild: bool = True, exclude: list[str] | None = None,
                  on_stage: Callable[[str, int, int], None] | None = None) -> SyncReport:
    """`kb index [--rebuild] [--no-<source>]`: index every sync batch again
    (one run of `index_rebuild` per batch), then the wiki (`wiki_index_job`).
    `rebuild` first embeds every passage again with the configured model,
    in a new table beside the old one, and swaps the two when the new one
    is complete (kb/index/model_choice.py): search works all the time. Use
    it after a change of embedding model; it also indexes every approved
    Telegram source again (one run of `source_index_job` each). Texts that
    the vector cache holds for the model are not embedded again. `exclude`:
    source kinds to take out of the index in this run (the run tag kb/exclude)."""
    from kb.index.embedder import Embedder
    from kb.index.client import ChunkIndex
    from kb.index.model_choice import rebuild_beside

    rebuilt = rebuild_beside(ChunkIndex.from_settings(), Embedder.from_settings()) if rebuild else {}
    tags = sync_tags(exclude)
    report = run_batches("index_rebuild", [(batch, {}) for batch in known_batches()], title="Index",
                         tags=tags, on_stage=on_stage)
    instance = dg.DagsterInstance.get()
    runs = Runs(instance, on_stage)
    # The passages of Telegram sources are in the same table: without
    # these runs a rebuild would take them out of search.
    for item_id in indexed_sources(instance) if rebuild else []:
        report.add(runs.run("source_index_job", run_config=QUIET_LOGS, tags={PARTITION_TAG: item_id}))
    report.add(runs.run("wiki_index_job", run_config=QUIET_LOGS, tags={}))
    report.problems += index_failures(report)
    if rebuilt.get("swapped"):
        report.notes.append(f"The index now holds vectors of {rebuilt['model']}: "
                            f"{rebuilt['passages']} passages were embedded again beside the old index.")
    return report


def indexed_sources(instance: dg.DagsterInstance) -> list[str]:
    """The Telegram sources that the latest run of `source_passages` put in
    the index (status `accepted`), oldest first."""
    latest: dict[str, object] = {}
    cursor = None
    while True:
        result = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=SOURCE_PASSAGES),
                                                 limit=1000, cursor=cursor, ascending=True)
        for record in result.records:
            status = record.asset_materialization.metadata.get("status")
            latest.pop(record.partition_key, None)  # a later run moves the source to the end
            latest[record.partition_key] = getattr(status, "value", status)
        if not result.has_more:
            return [item for item, status in latest.items() if item and status == "accepted"]
        cursor = result.cursor
