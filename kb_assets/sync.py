"""`kb sync`: add a sync batch, then materialize every stage for it, in order.

Each stage is its own run in the Dagster instance in KB_HOME, so the UI shows
it, and a failed stage does not stop the stages after it: they work on what
exists. At the end the report names every stage that failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from kb_assets.partitions import new_batch_key, sync_batches
from kb_resources.dagster_home import ensure_dagster_home

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


@dataclass
class StageResult:
    stage: str
    ok: bool
    seconds: float
    error: str = ""


@dataclass
class SyncReport:
    batch: str
    stages: list[StageResult] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [s.stage for s in self.stages if not s.ok]


def _first_error(result: dg.ExecuteInProcessResult) -> str:
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            return event.step_failure_data.error.message.strip().splitlines()[0][:300]
    return "the stage failed (see the Dagster UI for the run log)"


def run_sync(
    *,
    full: bool = False,
    files: list[str] | None = None,
    resources: dict | None = None,
    on_stage: Callable[[str, int, int], None] | None = None,
    log_level: str = "WARNING",
) -> SyncReport:
    """Run one sync batch through every stage. `files` imports raw Bookmarks
    pages instead of opening the browser (the demo and `kb import`)."""
    from kb_assets.definitions import all_assets, all_checks, build_resources

    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    batch = new_batch_key()
    instance.add_dynamic_partitions(sync_batches.name, [batch])
    known = {key.to_user_string() for a in all_assets for key in a.keys}
    stages = [(name, [k for k in keys if k in known]) for name, keys in X_STAGES]
    stages = [(name, keys) for name, keys in stages if keys]
    capture_config = {"full": full, "files": list(files or [])}

    report = SyncReport(batch=batch)
    for number, (name, keys) in enumerate(stages, start=1):
        if on_stage:
            on_stage(name, number, len(stages))
        started = time.monotonic()
        run_config = {"loggers": {"console": {"config": {"log_level": log_level}}}}
        if name == "capture":
            run_config["ops"] = {"x_raw_pages": {"config": capture_config}}
        try:
            result = dg.materialize(
                [*all_assets, *all_checks],
                selection=keys,
                partition_key=batch,
                instance=instance,
                resources=resources or build_resources(),
                run_config=run_config,
                raise_on_error=False,
                tags={"kb/sync_batch": batch, "kb/stage": name},
            )
            ok, error = result.success, ("" if result.success else _first_error(result))
        except Exception as exc:  # a stage that cannot even start must not stop the others
            ok, error = False, f"{type(exc).__name__}: {exc}"
        report.stages.append(StageResult(name, ok, time.monotonic() - started, error))
    return report
