"""kb's run launcher checks a worker's process id only where that id means
something: a worker on this host, in this boot. A run of another host is
left to Dagster's own monitoring (the compose deployment: the daemon and
the run workers live in two containers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import dagster as dg
import pytest
from dagster._core.launcher import WorkerStatus

from kb_assets.instance_config import ensure_dagster_home
from kb_assets.run_launcher import PID_TAG, fail_runs_of_dead_workers
from kb_resources.run_worker import BOOT_TAG, HOST_TAG, worker_tags
from kb_resources.stores import DuckDBResource


@pytest.fixture
def instance(kb_home):
    with dg.DagsterInstance.from_config(str(ensure_dagster_home())) as instance:
        yield instance


def dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def started_run(instance: dg.DagsterInstance, run_id: str, tags: dict[str, str]) -> dg.DagsterRun:
    run = dg.DagsterRun(job_name="x_sync", run_id=run_id, status=dg.DagsterRunStatus.STARTED, tags=tags)
    instance.add_run(run)
    return run


@dg.op(required_resource_keys={"duckdb"})
def one_step(context) -> None:
    context.resources.duckdb.get_client()


@dg.graph
def one_step_graph() -> None:
    one_step()


def test_a_run_worker_tags_its_run_with_its_host_and_boot(instance):
    job = one_step_graph.to_job(resource_defs={"duckdb": DuckDBResource.from_settings()})
    result = job.execute_in_process(instance=instance)
    tags = instance.get_run_by_id(result.run_id).tags
    assert {HOST_TAG: tags.get(HOST_TAG), BOOT_TAG: tags.get(BOOT_TAG)} == worker_tags()
    assert tags[BOOT_TAG]  # Linux has a boot id


def test_the_process_id_is_checked_only_for_a_worker_on_this_host(instance):
    launcher = instance.run_launcher
    here, pid = worker_tags(), str(dead_pid())
    this_host = started_run(instance, "run-on-this-host", {PID_TAG: pid, **here})
    # The same dead pid, but the worker lives in another container: its pid means nothing here.
    other_host = started_run(instance, "run-on-another-host", {PID_TAG: pid, HOST_TAG: "kb-code-container",
                                                               BOOT_TAG: here[BOOT_TAG]})
    # A worker that has not named its host yet: it may be anywhere.
    untagged = started_run(instance, "run-not-tagged-yet", {PID_TAG: pid})
    # This host, an earlier boot: the pid is alive (this process), but it is another program now.
    earlier_boot = started_run(instance, "run-of-an-earlier-boot", {PID_TAG: str(os.getpid()),
                                                                    HOST_TAG: here[HOST_TAG], BOOT_TAG: "0" * 32})

    assert launcher.check_run_worker_health(this_host).status == WorkerStatus.FAILED
    # Dagster's run monitoring fails a started run for any answer but RUNNING
    # and SUCCESS: a worker that kb cannot check is RUNNING (issue 55's month
    # saw the daemon fail a lint run whose step was still importing).
    health = launcher.check_run_worker_health(other_host)
    # RUNNING, not UNKNOWN: Dagster's run monitoring fails a run of any other status.
    assert health.status == WorkerStatus.RUNNING and "kb-code-container" in health.msg
    assert launcher.check_run_worker_health(untagged).status == WorkerStatus.RUNNING
    assert launcher.check_run_worker_health(earlier_boot).status == WorkerStatus.FAILED

    failed = {run.run_id for run in fail_runs_of_dead_workers(instance)}
    assert failed == {"run-on-this-host", "run-of-an-earlier-boot"}
    assert instance.get_run_by_id("run-on-another-host").status == dg.DagsterRunStatus.STARTED
    assert instance.get_run_by_id("run-not-tagged-yet").status == dg.DagsterRunStatus.STARTED


def test_the_daemons_run_monitoring_leaves_a_run_of_another_host_running(instance):
    """Dagster's own monitor (the daemon's code) with kb's launcher: the run
    of the code container is not failed by the daemon of another container."""
    import logging

    from dagster._daemon.monitoring.run_monitoring import monitor_started_run

    here = worker_tags()
    other_host = started_run(instance, "run-in-the-code-container", {PID_TAG: str(dead_pid()),
                                                                     HOST_TAG: "kb-code-container",
                                                                     BOOT_TAG: here[BOOT_TAG]})
    untagged = started_run(instance, "run-not-tagged-yet", {})
    for run in (other_host, untagged):
        monitor_started_run(instance, None, instance.get_run_record_by_id(run.run_id), logging.getLogger("test"))
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED, run.run_id


def test_a_run_that_names_no_host_in_time_has_failed_unless_its_process_lives(instance, monkeypatch):
    from kb_assets import run_launcher

    launcher = instance.run_launcher
    monkeypatch.setattr(run_launcher, "UNTAGGED_GRACE_S", 0)
    dead = started_run(instance, "run-never-tagged", {PID_TAG: str(dead_pid())})
    health = launcher.check_run_worker_health(dead)
    assert health.status == WorkerStatus.FAILED and "has not named its host in 0 s" in health.msg
    alive = started_run(instance, "run-importing", {PID_TAG: str(os.getpid())})
    assert launcher.check_run_worker_health(alive).status == WorkerStatus.RUNNING
    assert {run.run_id for run in fail_runs_of_dead_workers(instance)} == {"run-never-tagged"}


def test_a_live_worker_on_this_host_is_running(instance):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.1)
        run = started_run(instance, "run-alive", {PID_TAG: str(sleeper.pid), **worker_tags()})
        assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_wiki_jobs_have_a_limit_per_try_not_per_run():
    """SWEEPER_STUCK_MINUTES (30) is the time of one try (the
    specification, 4.4). Dagster's max runtime tag counted a whole run with
    its retries and their waits (up to about 47 minutes), so a run was
    stopped in a retry. The wiki jobs carry no such tag: the stuck check
    watches their tries (sensors/stuck_steps.py). A run whose asset failed
    for good is not run again: the asset has used the budget."""
    from kb_assets.keys import MAX_RUNTIME_TAG, RETRY_ON_ASSET_FAILURE_TAG, WIKI_JOB_NAMES
    from kb_assets.telegram.sources import source_intake_job
    from kb_assets.wiki.wiki_pages import wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job
    from sensors.stuck_steps import WATCHED_JOBS

    jobs = (wiki_ingest_job, wiki_lint_job, wiki_synthesis_job, wiki_topic_job, source_intake_job)
    for job in jobs:
        assert MAX_RUNTIME_TAG not in job.tags, job.name
        assert job.tags[RETRY_ON_ASSET_FAILURE_TAG] == "false", job.name
    assert set(WATCHED_JOBS) == {job.name for job in jobs} and set(WIKI_JOB_NAMES) <= set(WATCHED_JOBS)


def test_a_step_of_a_telegram_item_that_runs_too_long_is_stopped_and_the_item_runs_again():
    """The specification's sweeper takes a row back after 30 minutes in one
    stage. kb counts the same: the time since the running step started
    (sensors/stuck_steps.py). A step that waits for its retry is not
    stuck; the same step, running again past the limit, is."""
    import threading

    from kb_assets.keys import WILL_RETRY_TAG
    from sensors.stuck_steps import running_step, stop_stuck_runs

    release = threading.Event()

    @dg.op
    def slow_step(context) -> None:
        if context.retry_number == 0:
            raise dg.RetryRequested(max_retries=1, seconds_to_wait=1.5)  # a transient error first
        release.wait(30)  # then it hangs, as a wedged parse or git call would

    @dg.job(name="source_intake")
    def intake_like() -> None:
        slow_step()

    with dg.DagsterInstance.from_config(str(ensure_dagster_home())) as instance:  # kb's config: its run retries
        worker = threading.Thread(target=lambda: intake_like.execute_in_process(
            instance=instance, raise_on_error=False, tags={"dagster/partition": "item1"}))
        worker.start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                runs = instance.get_runs()
                if runs and any(r.event_log_entry.dagster_event.is_step_up_for_retry for r in
                                instance.get_records_for_run(runs[0].run_id).records
                                if r.event_log_entry.dagster_event):
                    break
                time.sleep(0.05)
            run_id = instance.get_runs()[0].run_id
            # The step waits for its retry: no step runs, nothing is stopped.
            assert running_step(instance, run_id) is None
            assert stop_stuck_runs(instance, limit_s=0.5) == []
            while running_step(instance, run_id) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert running_step(instance, run_id)[0] == "slow_step"
            assert stop_stuck_runs(instance, limit_s=0.5) == []  # it has just started again
            time.sleep(0.7)
            assert stop_stuck_runs(instance, limit_s=0.5) == [run_id]
            stopped = instance.get_run_by_id(run_id)
            assert stopped.status == dg.DagsterRunStatus.FAILURE
            assert stopped.tags.get(WILL_RETRY_TAG) == "true"  # Dagster runs the item again
            messages = [r.event_log_entry.message for r in instance.get_records_for_run(run_id).records]
            assert any("The step slow_step ran 0 minutes in this try, longer than KB_STUCK_MINUTES" in m
                       for m in messages)
            # The stopped try uses one retry of the item: the run retry goes on with the count.
            from kb_assets.retry_budget import failed_tries

            assert failed_tries(instance, [dg.AssetKey("slow_step")], "item1") == 1
        finally:
            release.set()
            worker.join(30)
