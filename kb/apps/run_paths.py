"""Where a run of a kb command executes, through Dagster's public API only.

- `kb up` runs for this KB_HOME (its record names a live webserver and a
  live daemon): the run goes to kb up's webserver with Dagster's GraphQL
  client (`DagsterGraphQLClient.submit_job_execution`; a re-execution from
  failure through the mutation `launchRunReexecution` of the same public
  schema). The daemon's run queue launches it, and its record names the
  code location "kb": the UI can re-execute it.
- Else the run executes in this process: `dg.execute_job` of the job, made
  reconstructable from kb_assets.definitions.job_named, and
  `dg.ReexecutionOptions.from_failure` for a batch that failed before. Such
  a run names no code location, so the UI shows it but cannot re-execute
  it. The next `kb sync` re-executes it from failure.

The client passes kb's owner guard (kb/apps/owner_guard.py): it sends a
POST of application/json with the Host of the bound address, and no Origin.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from kb.apps.up_record import LOCK_NAME, RECORD_NAME, is_recorded_process
from kb_assets.run_config_rules import check_run_config

DEFINITIONS_MODULE = "kb_assets.definitions"
JOB_FUNCTION = "job_named"  # kb_assets.definitions.job_named(name, launch)
LOCATION = "kb"  # as in workspace.yaml and kb up's workspace
REPOSITORY = "__repository__"  # Dagster's name for the one repository of a Definitions
WEBSERVER_PART, DAEMON_PART = "dagster-webserver", "dagster-daemon"  # the names of kb up's parts
# A bind to every address: the client connects to loopback.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}
CONNECT_TIMEOUT_S = 2.0

REEXECUTE_MUTATION = """
mutation KbReexecute($params: ReexecutionParams!) {
  launchRunReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on Error { message }
  }
}
"""


class LaunchError(Exception):
    """kb up's webserver refused the run; the text says why."""


@dataclass(frozen=True)
class Webserver:
    host: str  # as in a URL: an IPv6 address in brackets
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/graphql"


def kb_up_webserver(home: Path) -> Webserver | None:
    """The webserver of the `kb up` that runs for this KB_HOME, or None.
    kb up must hold its lock, and its record must name a webserver and a
    daemon that still run: without the daemon a submitted run would wait in
    the queue for ever."""
    folder = home / "run"
    if not (folder / LOCK_NAME).exists():
        return None
    try:
        record = json.loads((folder / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not _lives(record):
        return None
    parts = {part.get("name"): part for part in record.get("parts", []) if isinstance(part, dict)}
    webserver, daemon = parts.get(WEBSERVER_PART), parts.get(DAEMON_PART)
    if webserver is None or daemon is None or not _lives(webserver) or not _lives(daemon):
        return None
    return _address(str(webserver.get("where", "")))


def _lives(entry: dict) -> bool:
    pid, started = entry.get("pid"), entry.get("started")
    return isinstance(pid, int) and isinstance(started, (int, float)) and is_recorded_process(pid, started)


def _address(where: str) -> Webserver | None:
    """The address of "http://host:port" (the `where` of kb up's part).
    Only an IP address or localhost: kb up binds its webserver to an
    address, and a record that names another host (a DNS name) is not one
    that kb up wrote. The run then executes in this process."""
    scheme, _, rest = where.partition("://")
    host, colon, port = rest.rstrip("/").rpartition(":")
    if scheme != "http" or not colon or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = WILDCARDS.get(host, host)
    if host != "localhost":
        try:
            ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
        except ValueError:
            return None
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # kb up writes --host as given; a URL and a Host header put IPv6 in brackets
    return Webserver(host, int(port))


def answers(webserver: Webserver) -> bool:
    """True when the webserver accepts a connection (kb up may still start it)."""
    try:
        with socket.create_connection((webserver.host.strip("[]"), webserver.port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def submit(webserver: Webserver, job_name: str, *, run_config: dict, tags: dict[str, str]) -> str:
    """Submit a run of `job_name` of the code location "kb"; returns its run id."""
    import requests
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    try:
        client = DagsterGraphQLClient(webserver.host, port_number=webserver.port)
        return client.submit_job_execution(job_name, repository_location_name=LOCATION,
                                           repository_name=REPOSITORY, run_config=run_config, tags=tags)
    except (DagsterGraphQLClientError, requests.RequestException) as exc:
        raise LaunchError(f"kb up's webserver ({webserver.url}) refused the run of {job_name}: {exc}") from exc


def submit_reexecution(webserver: Webserver, parent: dg.DagsterRun, tags: dict[str, str]) -> str:
    """Submit Dagster's re-execution from failure of `parent`, with `tags`
    in place of the parent's tags (no parent tag comes along by itself: the
    parent's kb/pid names a process that is gone)."""
    import httpx

    params = {"parentRunId": parent.run_id, "strategy": "FROM_FAILURE", "useParentRunTags": False,
              "extraTags": [{"key": key, "value": value} for key, value in tags.items()]}
    try:
        # A POST of application/json, as DagsterGraphQLClient sends it: kb's owner guard lets it pass.
        response = httpx.post(webserver.url, json={"query": REEXECUTE_MUTATION, "variables": {"params": params}},
                              timeout=60)
        response.raise_for_status()
        answer = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise LaunchError(f"kb up's webserver ({webserver.url}) did not take the re-execution of run "
                          f"{parent.run_id}: {exc}") from exc
    if answer.get("errors") or not isinstance(answer.get("data"), dict):
        raise LaunchError(f"kb up's webserver refused the re-execution of run {parent.run_id}: "
                          f"{answer.get('errors')}")
    answer = answer["data"]
    result = answer["launchRunReexecution"]
    if result.get("__typename") != "LaunchRunSuccess":
        raise LaunchError(f"kb up's webserver refused the re-execution of run {parent.run_id}: "
                          f"{result.get('__typename')}: {result.get('message', '')}")
    return result["run"]["runId"]


def new_launch() -> str:
    """A name for one launch in this process (the tag LAUNCH_TAG)."""
    return uuid.uuid4().hex


def reconstructable_job(job_name: str, launch: str) -> dg.ReconstructableJob:
    """The job `job_name`, as a run worker builds it again: from
    kb_assets.definitions.job_named. The working directory is this one, as
    the code location's."""
    return dg.build_reconstructable_job(DEFINITIONS_MODULE, JOB_FUNCTION, reconstructable_args=(job_name, launch),
                                        reconstructor_working_directory=os.getcwd())


def execute_here(instance: dg.DagsterInstance, job_name: str, launch: str, *, run_config: dict | None,
                 tags: dict[str, str], parent: dg.DagsterRun | None = None) -> str:
    """Execute one run of `job_name` in this process; returns its run id.
    `parent`: re-execute that run from failure (the steps that did not
    succeed, and the steps after them), with `run_config` None for the
    parent's config. A failed step does not raise: the run's record says it."""
    # The launcher of kb checks each run of a run worker; a run here needs the same check (a
    # re-execution takes its parent's config, which the UI may have set).
    check_run_config(run_config, f"the run of {job_name}")
    if parent is not None:
        check_run_config(parent.run_config, f"the re-execution of run {parent.run_id} of {parent.job_name}")
    options = dg.ReexecutionOptions.from_failure(parent.run_id, instance) if parent is not None else None
    result = dg.execute_job(reconstructable_job(job_name, launch), instance, run_config=run_config, tags=tags,
                            reexecution_options=options, raise_on_error=False)
    return result.run_id
