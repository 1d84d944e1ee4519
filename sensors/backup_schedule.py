"""The daily backup: `backup_job` (kb_assets/backups.py) at KB_BACKUP_CRON, in TZ."""

import dagster as dg

from kb.backup.archive import default_archive_name
from kb.settings import get_settings
from kb_assets.backups import backup_job


@dg.schedule(
    job=backup_job,
    cron_schedule=get_settings().kb_backup_cron or "0 3 * * *",
    execution_timezone=get_settings().tz,
    # Empty KB_BACKUP_CRON: the schedule is there, stopped; the UI can start it.
    default_status=dg.DefaultScheduleStatus.RUNNING if get_settings().kb_backup_cron else dg.DefaultScheduleStatus.STOPPED,
    description=f"At {get_settings().kb_backup_cron or '(off)'}: one archive of KB_HOME into KB_BACKUP_DIR; "
                f"the newest {get_settings().kb_backup_keep} stay.",
)
def backup_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    name = default_archive_name(context.scheduled_execution_time)
    return dg.RunRequest(run_key=name, run_config={"ops": {"kb_backup": {"config": {"archive_name": name}}}})
