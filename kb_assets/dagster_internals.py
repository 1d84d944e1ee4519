"""The one door to Dagster's private modules (`dagster._...`).

Every other module of kb uses Dagster's public API (`import dagster as dg`).
tests/test_dagster_internals.py checks that no other module of the product
imports `dagster._`, and that each name below still exists and acts as kb
needs. When a Dagster release changes one of them, that test fails and names
the use and the reason here. pyproject.toml allows one minor release of
Dagster (>=1.13,<1.14); try a new one with that test first.

Each use, and what it keeps that no public hook gives:

1. Runs of the code location, executed in this process (`create_location_run`,
   `create_run_from_failure`, `execute_run_here`; used by kb/apps/sync.py).
   - The run record names the code location "kb" (its remote origin). The
     UI's "re-execute from failure" reads that origin and refuses a run
     without it (dagster_graphql: launch_reexecution_from_parent_run). The
     public `dg.execute_job` leaves it empty, for a new run and for a
     re-execution (`dg.ReexecutionOptions.from_failure`) alike.
   - The events come one by one while the run executes: `kb sync` prints a
     line when a stage starts. `dg.execute_job` gives them only at the end.
   - A new run is made from the job's definition alone: no load of the
     whole location (0.3 s of CPU for a snapshot of every job, sensor and
     schedule). Only a re-execution from failure loads it, as Dagster's
     re-execution needs the loaded job.
2. The health of a run worker (`CheckRunHealthResult`, `WorkerStatus`; used
   by kb_assets/run_launcher.py and kb/apps/backup.py). A run launcher
   answers Dagster's run monitoring with these classes; `dagster` does not
   export them. Without the health check, a run whose worker was killed stays
   STARTED and holds the pool `duckdb` for ever (tests/test_crash_safety.py).
3. The tags of a run over a range of partitions
   (`ASSET_PARTITION_RANGE_START_TAG`, `..._END_TAG`; kb caption and the
   sensor waiting_photos). Dagster reads them to know the partitions of such
   a run; it has no public name for them.
4. The SQLite storages of the instance (kb_assets/sqlite_instance.py
   subclasses them). One event of a run cost 30 to 40 ms with Dagster's
   storage and costs less than 1 ms with kb's (one engine and one open WAL
   per file); the check of the schema version cost 85 ms of CPU four times
   per process and now once. The subclasses override Dagster's `_connect`,
   `_initdb`, `connect` and `from_local`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator

import dagster as dg
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.execution.api import create_execution_plan, execute_run_iterator
from dagster._core.execution.plan.resume_retry import ReexecutionStrategy
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

# Names that load on first use: the SQLite storages bring in SQLAlchemy and
# Alembic (0.6 s of CPU), which a process on PostgreSQL, or one that opens no
# instance, does not need. {name here: (Dagster's module, Dagster's name)}
LAZY = {
    "DagsterEventLog": ("dagster._core.storage.event_log.sqlite.sqlite_event_log", "SqliteEventLogStorage"),
    "INDEX_SHARD_NAME": ("dagster._core.storage.event_log.sqlite.sqlite_event_log", "INDEX_SHARD_NAME"),
    "SQLITE_BUSY_TIMEOUT_SECONDS": ("dagster._core.storage.event_log.sqlite.sqlite_event_log",
                                    "SQLITE_BUSY_TIMEOUT_SECONDS"),
    "DagsterRunStorage": ("dagster._core.storage.runs.sqlite.sqlite_run_storage", "SqliteRunStorage"),
    "DagsterScheduleStorage": ("dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
                               "SqliteScheduleStorage"),
    "SqlEventLogStorageMetadata": ("dagster._core.storage.event_log.schema", "SqlEventLogStorageMetadata"),
    "ALEMBIC_SCRIPTS_LOCATION": ("dagster._core.storage.sql", "ALEMBIC_SCRIPTS_LOCATION"),
    "create_db_conn_string": ("dagster._core.storage.sqlite", "create_db_conn_string"),
}


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


__all__ = [
    "ALEMBIC_SCRIPTS_LOCATION", "ASSET_PARTITION_RANGE_END_TAG", "ASSET_PARTITION_RANGE_START_TAG",
    "CheckRunHealthResult", "DagsterEventLog", "DagsterRunStorage", "DagsterScheduleStorage", "INDEX_SHARD_NAME",
    "SQLITE_BUSY_TIMEOUT_SECONDS", "SqlEventLogStorageMetadata", "WorkerStatus", "CodeLocation",
    "create_db_conn_string", "create_location_run", "create_run_from_failure", "execute_run_here",
]

MODULE = "kb_assets.definitions"
LOCATION = "kb"  # as in workspace.yaml and [tool.dagster] of pyproject.toml
REPOSITORY = "__repository__"  # Dagster's name for the one repository of a Definitions
# The function `defs` (@dg.definitions) of kb_assets.definitions: the attribute
# that the code pointer of a run names. tests/test_sync.py checks that the
# loaded location names the same.
DEFINITIONS_ATTRIBUTE = "defs"


class CodeLocation:
    """The code location "kb" (kb_assets.definitions), as seen from this
    process. A run that it makes carries the location's origins, as a run that
    the UI launches from workspace.yaml. The full location loads only for a
    re-execution (`loaded`)."""

    def __init__(self, instance: dg.DagsterInstance):
        self.instance = instance
        self._process_context = None
        self._request = None

    def _target_origin(self) -> LoadableTargetOrigin:
        return LoadableTargetOrigin(executable_path=sys.executable, module_name=MODULE,
                                    working_directory=os.getcwd())

    def _location_origin(self) -> InProcessCodeLocationOrigin:
        return InProcessCodeLocationOrigin(self._target_origin(), location_name=LOCATION)

    def origins(self, job_name: str) -> tuple[ReconstructableJob, RemoteJobOrigin]:
        target = self._target_origin()
        repository = ReconstructableRepository(
            ModuleCodePointer(MODULE, DEFINITIONS_ATTRIBUTE, target.working_directory),
            executable_path=target.executable_path, entry_point=["dagster"])
        remote = RemoteJobOrigin(RemoteRepositoryOrigin(self._location_origin(), REPOSITORY), job_name)
        return ReconstructableJob(repository, job_name), remote

    @property
    def request(self):
        """The workspace request context of the loaded location."""
        if self._request is None:
            from dagster._core.workspace.context import WorkspaceProcessContext
            from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

            self._process_context = WorkspaceProcessContext(
                self.instance, InProcessWorkspaceLoadTarget(self._location_origin()))
            self._request = self._process_context.create_request_context()
        return self._request

    @property
    def loaded(self):
        """The loaded code location (a snapshot of every job, sensor and schedule)."""
        return self.request.get_code_location(LOCATION)

    def loaded_job(self, name: str):
        """The job `name` of the loaded location, as the UI sees it."""
        [repository] = self.loaded.get_repositories().values()
        return self.loaded.get_job(JobSubsetSelector(
            location_name=LOCATION, repository_name=repository.name, job_name=name, op_selection=None))

    def close(self) -> None:
        if self._process_context is not None:
            self._process_context.__exit__(None, None, None)
            self._process_context = self._request = None


def create_location_run(instance: dg.DagsterInstance, location: CodeLocation, job_name: str, *,
                        run_config: dict, tags: dict[str, str]) -> dg.DagsterRun:
    """A run of a job of the code location, as `dagster job launch` makes
    it: the job's snapshot, its execution plan and the location's origins."""
    recon_job, remote_origin = location.origins(job_name)
    job = recon_job.get_definition()
    all_tags = {**job.tags, **tags}
    plan = create_execution_plan(recon_job, run_config=run_config, instance_ref=instance.get_ref(), tags=all_tags)
    return instance.create_run_for_job(
        job_def=job, execution_plan=plan, run_config=run_config, tags=all_tags,
        remote_job_origin=remote_origin, job_code_origin=recon_job.get_python_origin())


def create_run_from_failure(instance: dg.DagsterInstance, location: CodeLocation, parent: dg.DagsterRun,
                            extra_tags: dict[str, str]) -> dg.DagsterRun:
    """Dagster's re-execution from failure of `parent`, as the UI's button
    makes it: the steps that did not succeed and the steps after them, with
    the parent's config and tags."""
    return instance.create_reexecuted_run(
        request_context=location.request, parent_run=parent, code_location=location.loaded,
        remote_job=location.loaded_job(parent.job_name), strategy=ReexecutionStrategy.FROM_FAILURE,
        extra_tags=extra_tags, use_parent_run_tags=True)


def execute_run_here(instance: dg.DagsterInstance, run: dg.DagsterRun) -> Iterator[dg.DagsterEvent]:
    """Execute `run` in this process, as a run worker would; yield its events
    as they come."""
    # Dagster keeps the last loaded job of a code origin in a cache of the
    # process. One process can run a job under other settings later (kb demo
    # sets KB_HOME; the sync benchmark and tests change it): the cached job
    # would keep the resources, and so the paths, of the first settings.
    from dagster._utils.hosted_user_process import recon_job_from_origin

    ReconstructableJob.get_definition.cache_clear()
    ReconstructableJob.get_repository_definition.cache_clear()
    yield from execute_run_iterator(recon_job_from_origin(run.job_code_origin), run, instance)
