"""The Dagster home inside KB_HOME, and its dagster.yaml.

Every Dagster process of kb must read the same dagster.yaml: `dagster dev`,
`dagster-daemon`, `kb up` and each `kb` command. So it is written when it is
absent, by `kb up`, by each `kb` command that opens the instance, and when
the code location loads (kb_assets/definitions.py).

The pool `wiki` has size one (the default limit of 1): two wiki ingests at
once would fight over one git tree. DuckDB has no pool: a pool slot is held
for a whole step, also while it fetches or embeds, so a Telegram source
waited behind a sync. Each DuckDB and LanceDB write takes the store's
writer lock instead, for seconds (kb/store/writer_lock.py).

Run monitoring asks the run launcher whether a run's worker lives. The
launcher of kb_assets/run_launcher.py answers from the worker's process id,
so Dagster's run monitoring fails the runs of killed workers, applies the
run retries, and frees their pool slots.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml

from kb.store.atomic_files import write_atomic
from kb.settings import Settings, get_settings

log = logging.getLogger(__name__)

DAGSTER_YAML = """\
# Written by kb. Edit it if you like: kb writes it only when it is absent.
telemetry:
  enabled: false

# A launcher that can tell whether a local run worker lives (by its process id).
run_launcher:
  module: kb_assets.run_launcher
  class: LocalRunLauncher

# Each step's stdout and stderr in files (the UI shows them), as Dagster's
# default does, but with no `tail -F` helper process: Dagster's helpers
# outlive a stopped step (kb_assets/compute_logs.py).
compute_logs:
  module: kb_assets.compute_logs
  class: KbComputeLogManager

concurrency:
  pools:
    # wiki: one git tree, one ingest at a time. DuckDB writes take a file lock (kb/store/writer_lock.py).
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
# themselves (kb_assets/jobs.py). The item and wiki jobs run again only a run
# whose worker died or whose try kb stopped as stuck: their assets count
# their own retries (kb/retries.py).
run_retries:
  enabled: true
  max_retries: 1
"""


POSTGRES_URL_VAR = "KB_DAGSTER_POSTGRES_URL"
# The sections of dagster.yaml that instance_storage_sections() owns.
STORAGE_KEYS = ("storage", "run_storage", "event_log_storage", "schedule_storage", "run_coordinator")
# Dagster's SQLite storage with one engine per file: a run's events cost less
# than 1 ms each instead of 30 ms (kb_assets/sqlite_instance.py). The files
# are Dagster's own, in DAGSTER_HOME.
SQLITE_SECTIONS = {
    f"{kind}_storage": {"module": "kb_assets.sqlite_instance", "class": f"Sqlite{name}Storage"}
    for kind, name in (("run", "Run"), ("event_log", "EventLog"), ("schedule", "Schedule"))
}


QUEUED_RUN_COORDINATOR = {"module": "dagster", "class": "QueuedRunCoordinator"}
# The seconds between two looks of Dagster's queued run coordinator at the
# queue, when its config does not name them (dequeue_interval_seconds).
DAGSTER_RUN_QUEUE_INTERVAL_S = 5


def instance_storage_sections(settings: Settings | None = None) -> dict:
    """The storage sections of dagster.yaml.

    Without KB_DAGSTER_POSTGRES_URL: runs, the event log and schedules are
    SQLite files in DAGSTER_HOME; the event log through kb's class
    (SQLITE_SECTIONS). With the URL, all three go to PostgreSQL
    (dagster-postgres), so the webserver, the daemon and every `kb` command
    on any host see the same runs. The file names the variable, never its
    value: the URL holds the password. The queued run coordinator keeps the
    pools of the `concurrency` section (wiki of size one) for
    every run, whoever starts it."""
    settings = settings or get_settings()
    url = settings.kb_dagster_postgres_url
    coordinator = run_coordinator_section(settings)
    if url is None or not url.get_secret_value():
        return SQLITE_SECTIONS if coordinator is None else {**SQLITE_SECTIONS, "run_coordinator": coordinator}
    return {
        "storage": {"postgres": {"postgres_url": {"env": POSTGRES_URL_VAR}}},
        "run_coordinator": coordinator or QUEUED_RUN_COORDINATOR,
    }


def run_coordinator_section(settings: Settings) -> dict | None:
    """The queued run coordinator with the interval of KB_RUN_QUEUE_INTERVAL_S,
    or None when the interval is Dagster's default. Why None: a dagster.yaml
    of SQLite then needs no coordinator section, as the files of earlier kb
    versions have none. A queued run waits up to one interval before it
    starts: a `kb up` test waited 6 to 7 s for each run with the default."""
    interval = settings.kb_run_queue_interval_s
    if interval == DAGSTER_RUN_QUEUE_INTERVAL_S:
        return None
    return {**QUEUED_RUN_COORDINATOR, "config": {"dequeue_interval_seconds": interval}}


def dagster_yaml(settings: Settings | None = None) -> str:
    """The text of the dagster.yaml that kb writes for these settings."""
    sections = instance_storage_sections(settings)
    if "storage" not in sections:
        note = "\n# Runs, event log and schedules in SQLite files, one engine per file (kb_assets/sqlite_instance.py).\n"
    else:
        note = "\n# KB_DAGSTER_POSTGRES_URL is set: runs, event log and schedules in PostgreSQL.\n"
    return DAGSTER_YAML + note + yaml.safe_dump(sections, sort_keys=False)


def ensure_dagster_home(settings: Settings | None = None) -> Path:
    """Create the Dagster home with its dagster.yaml, and point DAGSTER_HOME at it.

    kb writes the file when it is absent. It writes it again when the storage
    choice changed (KB_DAGSTER_POSTGRES_URL set or cleared) and the rest of
    the file is still kb's own. A file edited by hand stays as it is, with a
    warning when its storage differs from the settings."""
    settings = settings or get_settings()
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    wanted = dagster_yaml(settings)
    if not config.exists():
        write_atomic(config, wanted.encode())
    else:
        _update_storage(config, wanted)
    url = settings.kb_dagster_postgres_url
    if url is not None and url.get_secret_value() and os.environ.get(POSTGRES_URL_VAR) != url.get_secret_value():
        # A URL from the .env file: Dagster reads only the environment, and
        # the run workers that it starts must see it too.
        os.environ[POSTGRES_URL_VAR] = url.get_secret_value()
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _update_storage(config: Path, wanted: str) -> None:
    text = config.read_text()
    if text == wanted:
        return  # the usual case: no YAML parse (two parses cost 0.05 to 0.1 s of each sync)
    try:
        current = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return  # Dagster itself names the bad file and line when it loads it.
    target = yaml.safe_load(wanted)
    if isinstance(current, dict) and _before_compute_logs(current):
        # kb's own file of a version before its compute log manager: the
        # `tail -F` helpers of Dagster's default must go (issue 55).
        write_atomic(config, wanted.encode())
        return
    if not isinstance(current, dict) or all(current.get(k) == target.get(k) for k in STORAGE_KEYS):
        return
    rest = {k: v for k, v in current.items() if k not in STORAGE_KEYS}
    if rest == yaml.safe_load(DAGSTER_YAML) or _before_compute_logs(rest):
        write_atomic(config, wanted.encode())
        return
    log.warning("%s was edited by hand, so kb leaves it as it is. Its storage sections (%s) are not the ones "
                "that kb writes for these settings (KB_DAGSTER_POSTGRES_URL set or not): put in it the sections "
                "that docs/deploy.md shows, or delete the file and kb writes it again.", config, ", ".join(STORAGE_KEYS))


def _before_compute_logs(sections: dict) -> bool:
    """True for kb's own dagster.yaml of a version with no compute_logs
    section: the file that kb wrote, the storage sections aside."""
    if "compute_logs" in sections:
        return False
    ours = {k: v for k, v in yaml.safe_load(DAGSTER_YAML).items() if k != "compute_logs"}
    return {k: v for k, v in sections.items() if k not in STORAGE_KEYS} == ours


def ensure_on_load(settings: Settings | None = None) -> None:
    """Called when the code location loads. A Dagster process (dagster dev,
    the daemon, a code server) sets DAGSTER_HOME; kb's own commands set it
    to KB_HOME/dagster. Without DAGSTER_HOME (a test collection, a script)
    nothing is written: the owner's home must not get a file by surprise."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return
    try:
        config = Path(home) / "dagster.yaml"
        if not config.exists():
            Path(home).mkdir(parents=True, exist_ok=True)
            write_atomic(config, dagster_yaml(settings).encode())
    except OSError as exc:
        # The code location must still load; Dagster names the bad home itself.
        import warnings

        warnings.warn(f"kb could not write {home}/dagster.yaml: {exc}", stacklevel=2)


if __name__ == "__main__":
    # `python -m kb_assets.instance_config`: the webserver and daemon
    # containers write dagster.yaml from the settings before they start.
    print(ensure_dagster_home())
