"""The Dagster home inside KB_HOME, and its dagster.yaml.

The pools `duckdb` and `wiki` are both of size one, so one default limit of
1 serves both: DuckDB allows one writing process per file, and two wiki
ingests at once would fight over one git tree.

Run monitoring alone does not find a run whose process was killed: the
default run launcher cannot tell whether a worker lives, and `kb sync` runs
have no launcher. Only max_runtime_seconds catches them, late, and only
when the daemon runs. kb_resources/run_monitor.py finds them by their
process ids, marks them failed and frees their pool slots (`kb sync` and
the sensor `dead_runs_sensor` call it).
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
  poll_interval_seconds: 60
  # Free the pool slots of a run that ended, so the next run can start. A run
  # whose process was killed never ends: kb_resources/run_monitor.py does that.
  free_slots_after_run_end_seconds: 60

run_retries:
  enabled: true
  max_retries: 1
"""


def ensure_dagster_home(settings: Settings | None = None) -> Path:
    """Create the Dagster home with its dagster.yaml, and point DAGSTER_HOME at it."""
    settings = settings or get_settings()
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        write_atomic(config, DAGSTER_YAML.encode())
    os.environ["DAGSTER_HOME"] = str(home)
    return home
