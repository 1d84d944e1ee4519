"""Resources for the stores: DuckDB, raw files, the LanceDB index, the wiki
repository and the Telegram inbox. Each hands out its core client."""

from __future__ import annotations

import dagster as dg
from pydantic import PrivateAttr

from kb.store.duckdb_store import DuckDBStore
from kb.index.client import ChunkIndex
from kb.x.raw_store import RawStore
from kb.settings import Settings, get_settings
from kb.telegram.inbox import Inbox
from kb.wiki.repo import Wiki
from kb_resources.client_resource import ClientResource


class DuckDBResource(ClientResource):
    """The DuckDB file. Each connection holds the file's writer lock (kb/store/writer_lock.py)."""

    client_class = DuckDBStore

    def get_client(self) -> DuckDBStore:
        return super().get_client()


class RawStoreResource(ClientResource):
    """The folder of raw captured pages."""

    client_class = RawStore

    def get_client(self) -> RawStore:
        return super().get_client()


class ChunkIndexResource(ClientResource):
    """The LanceDB serving index."""

    client_class = ChunkIndex

    def get_client(self) -> ChunkIndex:
        return super().get_client()


class WikiResource(ClientResource):
    """The git-versioned Markdown wiki."""

    client_class = Wiki

    def get_client(self) -> Wiki:
        return super().get_client()


class InboxResource(dg.ConfigurableResource):
    """The Telegram inbox folder that the bot writes and the sensors read:
    KB_HOME/inbox and KB_INBOX_SETTLE_S of the settings of the process
    (as ClientResource; Inbox is a plain class)."""

    _client: Inbox | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)  # as ClientResource._settings

    def get_client(self) -> Inbox:
        if self._client is None:
            settings = self._settings or get_settings()
            self._client = Inbox(settings.inbox_dir, settle_s=settings.kb_inbox_settle_s)
        return self._client

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> InboxResource:
        resource = cls()
        resource._settings = settings
        return resource
