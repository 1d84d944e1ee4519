"""`kb backup [DEST]` and `kb restore ARCHIVE` (the core is kb/backup/archive.py).
A backup from the command line refuses to start while a run of this home
may write (kb_assets/backups.py checks the Dagster instance). A restore
gives the restored Dagster home kb's own dagster.yaml for the settings
(kb_assets/instance_config.py), never the archive's."""

from __future__ import annotations

import os
from pathlib import Path

from kb.backup.archive import BackupError, BackupResult, RestoreResult, move, sha256_file
from kb.backup.archive import create_backup as create_archive
from kb.backup.archive import restore_backup as restore_archive
from kb.settings import Settings, get_settings

__all__ = ["BackupError", "create_backup", "move", "restore_backup", "sha256_file"]


def refuse_if_runs_in_progress(settings: Settings) -> None:
    """No run of this home may write while the backup copies."""
    if not (settings.dagster_home / "dagster.yaml").exists():
        return
    import dagster as dg

    from kb_assets.backups import refuse_if_runs_in_progress as refuse

    # kb's SQLite storage finds its files through DAGSTER_HOME, and the
    # owner need not set it (KB_HOME alone is enough): kb's Dagster home
    # is KB_HOME/dagster, as every kb command sets it (ensure_dagster_home).
    os.environ["DAGSTER_HOME"] = str(settings.dagster_home)
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        refuse(instance, settings)


def create_backup(dest: Path | str | None = None, *, include_dagster: bool = True,
                  settings: Settings | None = None) -> BackupResult:
    """`kb backup`: one archive of KB_HOME, when no run writes."""
    return create_archive(dest, include_dagster=include_dagster, settings=settings or get_settings(),
                          check_no_run=refuse_if_runs_in_progress)


def restore_backup(archive: Path | str, *, force: bool = False, settings: Settings | None = None) -> RestoreResult:
    """`kb restore`: the archive into an empty KB_HOME, with kb's own dagster.yaml.

    An archive of a home whose kb up ran holds the heartbeats of that home's
    daemon. That daemon does not run for this home, but its heartbeats made
    the first kb up of the restored home refuse to start ("a Dagster daemon
    already runs", found by issue 55's month). The restore notes them as
    old, as kb up does after a stop."""
    from kb.apps.up import note_daemon_stopped
    from kb_assets.instance_config import dagster_yaml

    settings = settings or get_settings()
    result = restore_archive(archive, force=force, settings=settings, dagster_yaml=dagster_yaml)
    if settings.dagster_home.is_dir():
        note_daemon_stopped(settings.dagster_home)
    return result
