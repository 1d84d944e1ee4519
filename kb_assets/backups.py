"""The backup of KB_HOME as a Dagster job, and the check that no run writes
during a backup (for `kb backup` as well).

DuckDB holds paid GPU captions, transcripts, translations and the gate's
verdicts: nothing makes them again for free. So a schedule
(sensors/backup_schedule.py) runs `backup_job` every day at KB_BACKUP_CRON.
It writes one archive into KB_BACKUP_DIR, with the dated name of `kb
backup`, and keeps the newest KB_BACKUP_KEEP of them.

A backup waits for no run: it refuses while another run of this home may
write, and Dagster tries the step again later (BACKUP_RETRY). A backup that
fails for good is told to the owner, as every failed run is.
"""


import dagster as dg
from kb_assets.dagster_internals import WorkerStatus
from kb_assets.run_config_rules import check_archive_name

from kb.backup.archive import BackupError, create_backup, default_archive_name, prune_archives
from kb.settings import Settings, get_settings

UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
# A sync can run for an hour: try again every 10 minutes, for 2 hours.
BACKUP_RETRY = dg.RetryPolicy(max_retries=12, delay=600)


def refuse_if_runs_in_progress(instance: dg.DagsterInstance, settings: Settings, own_run_id: str | None = None) -> None:
    """Raise BackupError while a run of this home (other than `own_run_id`,
    the backup's own run) may write."""
    launcher = instance.run_launcher
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=UNFINISHED)):
        run = record.dagster_run
        if run.run_id == own_run_id:
            continue
        # The run launcher's health check, as the daemon's run monitoring asks it.
        if launcher.supports_check_run_worker_health and \
                launcher.check_run_worker_health(run).status == WorkerStatus.FAILED:
            continue  # its worker is dead: it writes nothing
        # Alive, or the launcher cannot tell.
        raise BackupError(
            f"A run is in progress in {settings.dagster_home}: {run.job_name} {run.run_id} "
            f"({run.status.value}). Start the backup when it has ended, so that no stage writes "
            "during the copy.")


class BackupConfig(dg.Config):
    # The schedule names each archive by its tick, so that a tick that runs
    # again writes the same name (and refuses to overwrite it). Empty: the time of the run.
    archive_name: str = ""


@dg.op(retry_policy=BACKUP_RETRY, description="Write one archive of KB_HOME into KB_BACKUP_DIR, then remove "
                                               "the oldest ones so that KB_BACKUP_KEEP stay.")
def kb_backup(context: dg.OpExecutionContext, config: BackupConfig) -> dg.Output[str]:
    settings = get_settings()
    folder = settings.backup_dir
    check_archive_name(config.archive_name)  # the launchpad of the UI can set it too
    target = folder / (config.archive_name or default_archive_name())
    try:
        result = create_backup(target, settings=settings, check_no_run=lambda s: refuse_if_runs_in_progress(
            context.instance, s, own_run_id=context.op_execution_context.run_id))
    except BackupError as exc:
        raise dg.Failure(description=str(exc)) from None
    removed = prune_archives(folder, settings.kb_backup_keep)
    size = result.archive.stat().st_size
    context.log.info(f"backup {result.archive} ({size} bytes, {result.seconds} s); removed {len(removed)} old archives")
    return dg.Output(str(result.archive), metadata={
        "archive": str(result.archive), "bytes": size, "seconds": result.seconds,
        "parts": ", ".join(result.manifest["parts"]), "removed": ", ".join(p.name for p in removed)})


@dg.job(description="One archive of KB_HOME (as `kb backup`), with retention: the daily backup.")
def backup_job() -> None:
    kb_backup()
