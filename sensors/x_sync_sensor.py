"""Schedules of the X path.

A sync needs a new dynamic partition before its run, and only sensors can add
partitions, so each periodic sync is a sensor:
- x_sync_sensor: every 6 hours, new bookmarks. It is off by default: it
  needs the X login (`kb login`) first.
- x_full_sync_sensor: once a week, on KB_FULL_SYNC_DAY at KB_FULL_SYNC_TIME
  (in TZ), a full sync: it captures all bookmarks, and normalize marks the
  ones that the owner removed on X, so they leave search within a week.
  Its cursor is the weekly time that it handled last, so a restart of the
  daemon does not start a second full sync for the same week. Without the
  X login it waits, and starts when the login is there.
"""

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import dagster as dg

from kb.settings import WEEKDAYS, Settings
from kb_assets.jobs import x_sync_job
from kb_assets.partitions import new_batch_key, sync_batches

SYNC_INTERVAL_SECONDS = 6 * 60 * 60
# How often the weekly sensor looks at the clock: the full sync starts within this of its time.
FULL_SYNC_LOOK_SECONDS = 15 * 60
FULL_SYNC_TAG = "kb/full_sync"


@dg.sensor(
    job=x_sync_job,
    minimum_interval_seconds=SYNC_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Every 6 hours: add a sync batch and capture new bookmarks through the whole graph.",
)
def x_sync_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    batch = new_batch_key()
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=batch, partition_key=batch)],
        dynamic_partitions_requests=[sync_batches.build_add_request([batch])],
    )


def last_weekly_time(now: datetime, day: str, time_of_day: str, zone: str) -> datetime:
    """The newest moment at or before `now` that is `day` at `time_of_day` in `zone`."""
    local = now.astimezone(ZoneInfo(zone))
    hours, minutes = (int(part) for part in time_of_day.split(":"))
    candidate = local.replace(hour=hours, minute=minutes, second=0, microsecond=0)
    candidate -= timedelta(days=(local.weekday() - WEEKDAYS.index(day)) % 7)
    if candidate > local:
        candidate -= timedelta(days=7)
    return candidate


def full_sync_request(due: datetime, now: datetime | None = None) -> dg.SensorResult:
    batch = new_batch_key(now)
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"full-sync-{due.isoformat()}", partition_key=batch,
                                    run_config={"ops": {"x_raw_pages": {"config": {"full": True}}}},
                                    tags={FULL_SYNC_TAG: due.isoformat()})],
        dynamic_partitions_requests=[sync_batches.build_add_request([batch])],
        cursor=due.isoformat(),
    )


def build_x_full_sync_sensor(settings: Settings) -> dg.SensorDefinition:
    """The weekly full sync at the day and time of `settings` (defs() builds
    it at each load of the code location)."""

    def full_sync_tick(context: dg.SensorEvaluationContext):
        if not settings.kb_full_sync_day:
            return dg.SkipReason("KB_FULL_SYNC_DAY is empty: no weekly full sync.")
        now = datetime.now(timezone.utc)
        due = last_weekly_time(now, settings.kb_full_sync_day, settings.kb_full_sync_time, settings.tz)
        if context.cursor is None:
            # The first look: the full sync starts at the next weekly time, not now.
            context.update_cursor(due.isoformat())
            return dg.SkipReason(f"started: the first full sync is after {due.isoformat()}, one week on")
        if datetime.fromisoformat(context.cursor) >= due:
            return dg.SkipReason(f"the full sync of {due.isoformat()} has started already")
        if not settings.x_state_path.exists():
            # The cursor stays: the full sync starts as soon as the login is there.
            return dg.SkipReason(f"no X login ({settings.x_state_path}): run `kb login`; the full sync waits")
        return full_sync_request(due, now)

    return dg.sensor(
        name="x_full_sync_sensor",
        job=x_sync_job,
        minimum_interval_seconds=FULL_SYNC_LOOK_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING if settings.kb_full_sync_day else dg.DefaultSensorStatus.STOPPED,
        description=f"Each {settings.kb_full_sync_day or '(off)'} at {settings.kb_full_sync_time}: a full "
                    "sync, which marks the bookmarks that you removed on X, so they leave search.",
    )(full_sync_tick)
