"""A one-job code location for tests/test_control_plane.py: the Dagster
webserver behind kb's guard loads it in a second, and a launched run of
`touch_job` shows in the instance (an attack that gets through leaves a run)."""

import dagster as dg


@dg.op
def touch() -> None:
    pass


@dg.job
def touch_job() -> None:
    touch()


defs = dg.Definitions(jobs=[touch_job])
