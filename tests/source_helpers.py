"""Helpers for tests of the Telegram inflow: inbox items and runs of the
real `parsed_sources` and `gated_sources` assets on a real Dagster instance
(in DAGSTER_HOME, which conftest puts in the test's KB_HOME)."""

from __future__ import annotations

import functools

import dagster as dg

from kb_assets.partitions import sources
from kb_assets.telegram.source_index import source_passages
from kb_assets.telegram.sources import gated_sources, parsed_sources, source_intake_job
from kb_assets.wiki.wiki_pages import wiki_pages
from kb.x.browser import Browser
from kb_assets.instance_config import ensure_dagster_home
from kb.store.duckdb_store import DuckDBStore
from kb.telegram.gate import QualityGate
from kb.settings import get_settings
from kb.wiki.repo import Wiki
from kb.wiki.agent import WikiAgent
from kb.telegram.inbox import Inbox, InboxItem, telegram_item_id, utc_now_iso
from kb_resources.services import BrowserResource, EmbedderResource, QualityGateResource, TelegramNotifierResource, WikiAgentResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource, InboxResource, WikiResource

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
    return {"duckdb": DuckDBResource.from_settings(), "browser": BrowserResource.from_settings(), "gate": QualityGateResource.from_settings(),
            "wiki": WikiResource.from_settings(), "wiki_agent": WikiAgentResource.from_settings(), "telegram": TelegramNotifierResource.from_settings(),
            "inbox": InboxResource.from_settings(),
            # The test embedder: deterministic and fast; the index is a real LanceDB folder.
            "embedder": EmbedderResource.from_settings(backend="hash"), "lance": ChunkIndexResource.from_settings()}


def run_item(dagster: dg.DagsterInstance, item_id: str, *, tags: dict | None = None,
             raise_on_error: bool = False) -> dg.ExecuteInProcessResult:
    """Add the partition (as the inbox sensor does) and run the real job
    `source_intake` for it, with the job's own tags. The wiki agent has no
    endpoint in tests, so wiki_pages records `waiting` for accepted sources."""
    dagster.add_dynamic_partitions(sources.name, [item_id])
    return intake_job().execute_in_process(partition_key=item_id, instance=dagster, tags=tags or {},
                                           raise_on_error=raise_on_error)


def intake_job() -> dg.JobDefinition:
    """The job with its resources, built from the settings of this test."""
    return _intake_job(str(get_settings().home))


@functools.cache
def _intake_job(home: str) -> dg.JobDefinition:
    # A resource keeps the paths of the settings that built it, so one job
    # per KB_HOME: each test has its own.
    defs = dg.Definitions(assets=[parsed_sources, gated_sources, source_passages, wiki_pages], jobs=[source_intake_job],
                          resources=resources())
    return defs.resolve_job_def(source_intake_job.name)
