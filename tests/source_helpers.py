"""Helpers for tests of the Telegram inflow: inbox items and runs of the
real `parsed_sources` and `gated_sources` assets on a real Dagster instance
(in DAGSTER_HOME, which conftest puts in the test's KB_HOME)."""

from __future__ import annotations

import functools

import dagster as dg

from kb_assets.partitions import sources
from kb_assets.telegram.sources import gated_sources, parsed_sources, source_intake_job
from kb_assets.wiki.wiki_pages import wiki_pages
from kb_resources.browser import Browser
from kb_assets.instance_config import ensure_dagster_home
from kb_resources.duckdb_store import DuckDBStore
from kb_resources.gate import QualityGate
from kb.settings import get_settings
from kb_resources.wiki_repo import Wiki
from kb_resources.wiki_agent import WikiAgent
from kb.telegram_inbox import Inbox, InboxItem, telegram_item_id, utc_now_iso

OWNER_ID = 111


def instance() -> dg.DagsterInstance:
    """The instance at settings.dagster_home, with kb's dagster.yaml (pools,
    run monitoring, run retries): the one that the bot reads."""
    return dg.DagsterInstance.from_config(str(ensure_dagster_home()))


def ephemeral_instance() -> dg.DagsterInstance:
    """An in-memory instance with kb's run retry settings, for tests that
    share one instance (each with its own item ids)."""
    return dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True, "max_retries": 1}})


def inbox() -> Inbox:
    return Inbox(get_settings().inbox_dir)


def add_item(type_: str, message_id: int, *, url: str | None = None, text: str | None = None,
             file_name: str | None = None, content: bytes | None = None, user_id: int = OWNER_ID) -> InboxItem:
    """An inbox item as the bot writes it, with its attachment."""
    box = inbox()
    item_id = telegram_item_id(user_id, message_id)
    file_rel = None
    if content is not None:
        path = box.files_dir(item_id) / (file_name or "file")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        file_rel = str(path.relative_to(box.root))
    item = InboxItem(id=item_id, type=type_, received_at=utc_now_iso(), origin="telegram", url=url, text=text,
                     file=file_rel, file_name=file_name, chat_id=user_id, message_id=message_id, user_id=user_id)
    item, _ = box.add(item)
    return item


def resources() -> dict:
    return {"duckdb": DuckDBStore(), "browser": Browser(), "gate": QualityGate(retry_delay_s=0),
            "wiki": Wiki(), "wiki_agent": WikiAgent()}


def run_item(dagster: dg.DagsterInstance, item_id: str, *, tags: dict | None = None,
             raise_on_error: bool = False) -> dg.ExecuteInProcessResult:
    """Add the partition (as the inbox sensor does) and run the real job
    `source_intake` for it, with the job's own tags. The wiki agent has no
    endpoint in tests, so wiki_pages records `waiting` for accepted sources."""
    dagster.add_dynamic_partitions(sources.name, [item_id])
    return intake_job().execute_in_process(partition_key=item_id, instance=dagster, tags=tags or {},
                                           raise_on_error=raise_on_error)


@functools.cache
def intake_job() -> dg.JobDefinition:
    """The job with its resources. The resources read paths and keys from
    the settings at run time, so one job serves every test."""
    defs = dg.Definitions(assets=[parsed_sources, gated_sources, wiki_pages], jobs=[source_intake_job],
                          resources=resources())
    return defs.resolve_job_def(source_intake_job.name)
