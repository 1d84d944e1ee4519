"""The Dagster home inside KB_HOME, and its dagster.yaml.

Every Dagster process of kb must read the same dagster.yaml: `dagster dev`,
`dagster-daemon`, `kb up` and each `kb` command. So it is written when it is
absent, by `kb up`, by each `kb` command that opens the instance, and when
the code location loads (kb_assets/definitions.py).

The pools `duckdb` and `wiki` are both of size one, so one default limit of
1 serves both: DuckDB allows one writing process per file, and two wiki
ingests at once would fight over one git tree.

Run monitoring asks the run launcher whether a run's worker lives. The
launcher of kb_assets/run_launcher.py answers from the worker's process id,
so Dagster's run monitoring fails the runs of killed workers, applies the
run retries, and frees their pool slots.
"""

from __future__ import annotations

import os
from pathlib import Path

from kb.atomic_files import write_atomic
from kb.settings import Settings, get_settings

DAGSTER_YAML = """\
# Written by kb. Edit it if you like: kb writes it only when it is absent.
telemetry:
  enabled: false

# A launcher that can tell whether a local run worker lives (by its process id).
run_launcher:
  module: kb_assets.run_launcher
  class: LocalRunLauncher

concurrency:
  pools:
    # duckdb: one writer per DuckDB file. wiki: one git tree, one ingest at a time.
    default_limit: 1
    granularity: op

run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 180
  max_runtime_seconds: 7200
  # A dead worker holds its pool slot until this check: keep it short.
  poll_interval_seconds: 30
  # Free the pool slots of a run that ended, so the next run can start.
  free_slots_after_run_end_seconds: 30

# A run whose worker died, or that failed, runs once more. Jobs with GPU
# stages (x_sync, captions) set dagster/max_retries to 0: they never retry by
# themselves (kb_assets/jobs.py).
run_retries:
  enabled: true
  max_retries: 1
"""


def write_dagster_yaml(home: Path) -> Path:
    """Create `home` and its dagster.yaml when it is absent. Returns the file."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        write_atomic(config, DAGSTER_YAML.encode())
    return config


def ensure_dagster_home(settings: Settings | None = None) -> Path:
    """Create the Dagster home with its dagster.yaml, and point DAGSTER_HOME at it."""
    settings = settings or get_settings()
    home = settings.dagster_home
    write_dagster_yaml(home)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def ensure_on_load() -> None:
    """Called when the code location loads. A Dagster process (dagster dev,
    the daemon, a code server) sets DAGSTER_HOME; kb's own commands set it
    to KB_HOME/dagster. Without DAGSTER_HOME (a test collection, a script)
    nothing is written: the owner's home must not get a file by surprise."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return
    try:
        write_dagster_yaml(Path(home))
    except OSError as exc:
        # The code location must still load; Dagster names the bad home itself.
        import warnings

        warnings.warn(f"kb could not write {home}/dagster.yaml: {exc}", stacklevel=2)
