"""Resources for the stores: DuckDB, raw files, the LanceDB index, the wiki
repository and the Telegram inbox. Each hands out its core client."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from kb.store.duckdb_store import DuckDBStore
from kb.index.client import ChunkIndex
from kb.index.passage_rows import ROWS_FILE_MIN_ROWS
from kb.x.raw_store import RawStore
from kb.settings import Settings, get_settings
from kb.telegram.inbox import Inbox
from kb.wiki.repo import Wiki
from kb_resources.client_resource import ClientResource


class DuckDBResource(ClientResource):
    """The DuckDB file. Each connection holds the file's writer lock (kb/store/writer_lock.py)."""

    client_class = DuckDBStore
    path: str

    def get_client(self) -> DuckDBStore:
        return super().get_client()


class RawStoreResource(ClientResource):
    """The folder of raw captured pages."""

    client_class = RawStore
    root: str

    def get_client(self) -> RawStore:
        return super().get_client()


class ChunkIndexResource(ClientResource):
    """The LanceDB serving index."""

    client_class = ChunkIndex
    SECRETS = {"s3_access_key_id": "KB_S3_ACCESS_KEY_ID", "s3_secret_access_key": "KB_S3_SECRET_ACCESS_KEY"}
    path: str
    vector_index_min_rows: int
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    s3_allow_http: bool = False
    lock_path: str = ""
    # The rows files of the search service (kb web); the graph's writers
    # leave them off.
    rows_dir: str = ""
    rows_file_min_rows: int = ROWS_FILE_MIN_ROWS

    def get_client(self) -> ChunkIndex:
        return super().get_client()


class WikiResource(ClientResource):
    """The git-versioned Markdown wiki."""

    client_class = Wiki
    SECRETS = {"remote": "KB_WIKI_REMOTE"}  # the URL can hold a token
    path: str
    remote: str = ""

    def get_client(self) -> Wiki:
        return super().get_client()


class InboxResource(dg.ConfigurableResource):
    """The Telegram inbox folder that the bot writes and the sensors read."""

    path: str
    settle_s: float = 2.0  # a dropped file must stay unchanged this long

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> InboxResource:
        settings = settings or get_settings()
        return cls(**{"path": str(settings.inbox_dir), "settle_s": settings.kb_inbox_settle_s, **overrides})

    def get_client(self) -> Inbox:
        return Inbox(Path(self.path), settle_s=self.settle_s)
