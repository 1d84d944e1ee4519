"""The daily backup: `backup_job` (kb_assets/backups.py) at KB_BACKUP_CRON, in TZ."""

import dagster as dg

from kb.backup.archive import default_archive_name
from kb.settings import Settings
from kb_assets.backups import backup_job


def backup_request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    name = default_archive_name(context.scheduled_execution_time)
    return dg.RunRequest(run_key=name, run_config={"ops": {"kb_backup": {"config": {"archive_name": name}}}})


def build_backup_schedule(settings: Settings) -> dg.ScheduleDefinition:
    """The schedule at the time of `settings` (defs() builds it at each load)."""
    return dg.schedule(
        name="backup_schedule",
        job=backup_job,
        cron_schedule=settings.kb_backup_cron or "0 3 * * *",
        execution_timezone=settings.tz,
        # Empty KB_BACKUP_CRON: the schedule is there, stopped; the UI can start it.
        default_status=dg.DefaultScheduleStatus.RUNNING if settings.kb_backup_cron else dg.DefaultScheduleStatus.STOPPED,
        description=f"At {settings.kb_backup_cron or '(off)'}: one archive of KB_HOME into KB_BACKUP_DIR; "
                    f"the newest {settings.kb_backup_keep} stay.",
    )(backup_request)
