"""The store of the LanceDB serving index: the connection, the writer lock,
the tables, the read-only datasets and the model record (IndexStore, the
base of ChunkIndex in kb/index/client.py). The writes (kb/index/writes.py),
the maintenance (kb/index/maintenance.py) and the reads (kb/index/client.py)
are mixins of ChunkIndex over this base.

The index holds passages with vectors and a full-text index, plus the
bookmark cards that the serving side answers get_bookmark with.

Tables in one LanceDB folder (settings.lancedb_dir):
- `chunks`: one row per passage per owning bookmark. A page that many
  bookmarks link to is stored once per bookmark, so a filter on author or
  date finds it from each of them. The vectors come from the embedding cache,
  so the copies cost no extra embedding.
  The table's schema metadata records the embedding model and dimension.
  Two full-text indexes: of the words of `text`, and of the characters of
  the Chinese, Japanese, Korean and Thai runs of text and source_text
  (column NGRAM_COLUMN; see ngram_fts_config()). Scalar indexes on the
  columns that the filters test: tweet_id (also the folder filter),
  created_at, source, and AUTHOR_KEY_COLUMN (the author in lower case).
- `bookmarks`: one card per bookmark (post, quoted post, links, media).
- `index_meta`: key/value facts, for now the last sync.
- `folders`: the bookmarks of each bookmark folder (kb/index/folders.py).
- `embedding_cache`: owned by kb.index.embedder.

One writer (the `chunk_index` asset) and many readers (search, MCP, bot).
LanceDB tables are versioned: a reader sees one committed version, and with
read_consistency_interval=0 each read checks for a newer one, so readers see
new data without a restart. A search opens the latest version once, as a
Lance dataset, and reads only that version (dataset()). The passages of that
version, without vectors, stay in memory for the next searches
(passage_rows(); the rows themselves: kb/index/passage_rows.py); a new
version reads only its new data files. A table too small for a vector index
also keeps its vectors in memory: the search compares them in numpy,
without a Lance query. The table's columns: kb/index/chunk_schema.py.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
from pydantic import BaseModel, PrivateAttr, SecretStr, field_validator

from kb.index.chunk_schema import CHUNK_FIELDS, DIM_KEY, MODEL_KEY
from kb.index.embed_vectors import EmbedderError
from kb.index.embedder import Embedder
from kb.index.passage_rows import ROWS_FILE_MIN_ROWS
from kb.settings import Settings, get_settings
from kb.store.writer_lock import writer_lock

CHUNKS = "chunks"
BOOKMARKS = "bookmarks"
META = "index_meta"
REBUILD_HINT = "Rebuild the index with `kb index --rebuild`."


def empty_index_note(path: Path | str) -> str:
    """What a reader says when the index has no passages: the next step."""
    return (f"The index at {path} is empty. Run `kb sync` to capture your bookmarks "
            "(or `kb import PAGE.json`), or `kb demo` to try kb on sample data.")

# Keep old table versions this long before maintain() prunes them. A reader
# in another process may still read a version that is a few seconds old;
# deleting its files under it would fail that search.
KEEP_VERSIONS = timedelta(minutes=10)


def _lancedb():
    """lancedb, imported on first use. Why: every Dagster process (the
    daemon, the webserver, each run worker) imports this module when it
    loads the graph, and `import lancedb` takes 1.5 s of CPU even without
    its REST client (kb/index/lance_loader.py); a process that opens no index
    must not pay it."""
    from kb.index.lance_loader import lancedb_module

    return lancedb_module()



class IndexModelMismatch(RuntimeError):
    """The index holds vectors of another model than the embedder's."""



META_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.string())])


def sql_str(value: str) -> str:
    """A SQL string literal for a LanceDB filter."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_in(column: str, values) -> str:
    return f"{column} IN ({', '.join(sql_str(v) for v in values)})"


def to_utc(value: Any, *, name: str = "created_at") -> datetime | None:
    """A timezone-aware UTC datetime from a datetime, a date or an ISO string.
    A naive datetime is taken as UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    if isinstance(value, str):
        try:
            return to_utc(datetime.fromisoformat(value.strip().replace("Z", "+00:00")), name=name)
        except ValueError:
            pass
    raise ValueError(f"{name}={value!r} is not a date: use YYYY-MM-DD or an ISO 8601 time")


def _parts(values: list, size: int = 1000):
    for start in range(0, len(values), size):
        yield values[start:start + size]


class IndexStore(BaseModel):
    """The LanceDB index, in a local folder or in an S3-compatible bucket:
    its connection, tables and model record.

    path: a folder, or an s3://bucket/folder address. The s3_* fields go to
    LanceDB as storage options; they matter only for an s3:// path."""

    path: str
    vector_index_min_rows: int
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_allow_http: bool = False
    # The writer lock file (kb/store/writer_lock.py). Empty: a file beside a local
    # index folder. from_settings() gives a bucket the lock file in KB_HOME.
    lock_path: str = ""
    # A folder for the passage rows as memory-mapped Arrow files (see
    # PassageRows.read()); empty: the rows are read into memory. Only for a
    # local index. The search service (kb web) sets it.
    rows_dir: str = ""
    rows_file_min_rows: int = ROWS_FILE_MIN_ROWS

    _db: Any = PrivateAttr(default=None)
    _session: Any = PrivateAttr(default=None)  # Lance caches of the readers: see dataset()
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _meta_cache: Any = PrivateAttr(default=None)  # (table version, meta dict)
    _cards_cache: Any = PrivateAttr(default=None)  # (table version, {tweet_id: card})
    _rows: Any = PrivateAttr(default=None)  # PassageRows of the last version read: see passage_rows()
    _seen_tables: bool = PrivateAttr(default=False)
    _datasets: Any = PrivateAttr(default_factory=dict)  # {table: (commit stamp, dataset)}: see dataset()

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides):
        settings = settings or get_settings()
        path = overrides.get("path", settings.lance_uri)
        # A local index locks the file beside its folder (see writing()), also
        # when `path` names another folder than the settings' one: a lock in
        # KB_HOME made every index of a process (each test fixture's, a
        # benchmark's) wait for one file. A bucket has no folder beside it:
        # its writers on this machine share the lock file in KB_HOME.
        lock_path = str(settings.home / "lancedb.lock") if str(path).lower().startswith("s3://") else ""
        return cls(**{"path": settings.lance_uri,
                      "vector_index_min_rows": settings.kb_vector_index_min_rows,
                      "s3_endpoint": settings.kb_s3_endpoint, "s3_region": settings.kb_s3_region,
                      "s3_access_key_id": settings.kb_s3_access_key_id,
                      "s3_secret_access_key": settings.kb_s3_secret_access_key,
                      "s3_allow_http": settings.kb_s3_allow_http,
                      "lock_path": lock_path, **overrides})

    @field_validator("path")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = urlsplit(value).scheme.lower() if "://" in value else ""
        if scheme not in ("", "s3"):
            raise ValueError(f"KB_LANCE_URI={value!r}: kb supports a local folder or an s3:// address, not {scheme}://")
        return value

    # --- connection -------------------------------------------------------
    @property
    def remote(self) -> bool:
        """True when the index lives in a bucket, not in a local folder."""
        return self.path.lower().startswith("s3://")

    def db_path(self) -> Path:
        """The local folder of the index. A bucket has no local folder."""
        if self.remote:
            raise ValueError(f"the index at {self.path} is in a bucket, not in a local folder")
        return Path(self.path)

    def storage_options(self) -> dict[str, str]:
        """LanceDB's object-store options for an s3:// path: endpoint,
        region and keys. Empty for a local folder. The values hold secrets:
        never log them."""
        if not self.remote:
            return {}
        options = {"aws_region": self.s3_region or "us-east-1"}
        if self.s3_endpoint:
            options["aws_endpoint"] = self.s3_endpoint
        for key, value in (("aws_access_key_id", self.s3_access_key_id),
                           ("aws_secret_access_key", self.s3_secret_access_key)):
            if value is not None and value.get_secret_value():
                options[key] = value.get_secret_value()
        if self.s3_allow_http:
            options["allow_http"] = "true"
        return options

    def exists(self) -> bool:
        """True when the index holds at least one table. A reader asks this
        first: it must not create a folder in an empty KB_HOME."""
        if not self.remote:
            return Path(self.path).is_dir()
        if not self._seen_tables:
            # A bucket has no folder to create, so connecting is safe. Once
            # a table exists it stays, so one positive answer is enough.
            self._seen_tables = bool(self._connect().list_tables().tables)
        return self._seen_tables

    def _connect(self):
        with self._lock:
            if self._db is None:
                if not self.remote:
                    self.db_path().mkdir(parents=True, exist_ok=True)
                # interval 0: every read checks for a newer committed version.
                self._db = _lancedb().connect(self.path, read_consistency_interval=timedelta(0),
                                           storage_options=self.storage_options() or None)
            return self._db

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the index's writer lock for one write (seconds): two processes
        that commit to one table at once make commit conflicts. Embedding
        happens before it, never inside it."""
        if self.lock_path:
            path = Path(self.lock_path)
        elif not self.remote:
            path = Path(self.path.rstrip("/") + ".lock")
        else:
            yield
            return
        with writer_lock(path, f"LanceDB {self.path}").hold():
            yield

    def table(self, name: str):
        """The open table, or None when it does not exist yet. A read on a
        missing index creates no folder: lancedb.connect() would make one,
        and an empty search once left ~/kb/lancedb behind."""
        if self._db is None and not self.remote and not Path(self.path).is_dir():
            return None
        try:
            return self._connect().open_table(name)
        except ValueError:
            return None

    def table_uri(self, name: str) -> str:
        """The address of a table: LanceDB keeps table `name` in the folder
        `name`.lance under the index path."""
        return f"{self.path.rstrip('/')}/{name}.lance"

    def dataset(self, name: str):
        """The table at its latest committed version, as a read-only Lance
        dataset (pylance), or None when the table does not exist. The dataset
        stays on that version, so one search reads one version and its row
        ids stay valid (a compaction in between gives the rows new ids).

        Why pylance and not a LanceDB table: each LanceDB query made 3 to 6
        round trips through LanceDB's event loop (schema reads and checks)
        and cost 4 to 8 ms of CPU; the same query on the dataset costs 1 to
        4 ms (benchmarks/index_and_retrieval.md). The results are the same:
        LanceDB runs the same Lance scanner.

        A reader sees each new commit (a sync) at once. In a local folder,
        the dataset of the last call is used again while the table's commit
        folder did not change (see _commit_stamp): an open of the latest
        version cost 0.3 to 0.6 ms, and a search opens 4 tables. In a bucket,
        each call opens the latest version. The shared session holds the
        index and metadata caches. It is safe when the table is dropped and
        made again (kb index --rebuild): a new table with the same version
        number still reads its own files."""
        uri = self.table_uri(name)
        stamp = None if self.remote else _commit_stamp(uri)
        if not self.remote and stamp is None:
            return None  # no table; and a read must not create a folder
        if stamp is not None and _settled(stamp):
            reused = self._datasets.get(name)
            if reused is not None and reused[0] == stamp:
                return reused[1]
        dataset = self._open_dataset(uri)
        if dataset is not None and stamp is not None:
            self._datasets[name] = (stamp, dataset)
        return dataset

    def _open_dataset(self, uri: str):
        import lance

        options = self.storage_options() or None
        try:
            if self._session is None:
                with self._lock:
                    if self._session is None:
                        dataset = lance.dataset(uri, storage_options=options)
                        self._session = dataset.session()
                        return dataset
            return lance.dataset(uri, session=self._session, storage_options=options)
        except (ValueError, FileNotFoundError, OSError):
            return None  # dropped, or not created yet

    def _vector_index_min_rows(self) -> int:
        return self.vector_index_min_rows

    def _lance(self, table):
        """The Lance dataset of a lancedb table, at its newest version."""
        import lance

        return lance.dataset(table.uri, storage_options=self.storage_options() or None)

    # --- model record -------------------------------------------------------
    def meta(self, table=None, *, schema: pa.Schema | None = None) -> dict[str, str]:
        """Key/value facts of the index (last_sync), plus model and dim.
        `table` (or its `schema`): the passages table, when the caller has it
        open already."""
        meta: dict[str, str] = {}
        meta_table = self.dataset(META)
        if meta_table is not None:
            # Reading the table costs more than asking its version: read it
            # again only when a writer committed a new version.
            version = meta_table.version
            if self._meta_cache is None or self._meta_cache[0] != version:
                rows = meta_table.to_table().to_pylist()
                self._meta_cache = (version, {r["key"]: r["value"] for r in rows})
            meta.update(self._meta_cache[1])
        info = self.model_info(table, schema=schema)
        if info:
            meta["model"], meta["dim"] = info[0], str(info[1])
        return meta

    def _set_meta(self, values: dict[str, str]) -> None:
        with self.writing():
            self._write_meta(values)

    def _write_meta(self, values: dict[str, str]) -> None:
        table = self.table(META)
        data = pa.Table.from_pylist([{"key": k, "value": str(v)} for k, v in values.items()], schema=META_SCHEMA)
        if table is None:
            self._connect().create_table(META, schema=META_SCHEMA, exist_ok=True)
            table = self.table(META)
        table.merge_insert("key").when_matched_update_all().when_not_matched_insert_all().execute(data)

    def overwrite_table(self, name: str, data: pa.Table) -> None:
        """Replace a small table whole, as one new version (kb/index/folders.py)."""
        with self.writing():
            self._connect().create_table(name, data=data, mode="overwrite")

    def model_info(self, table=None, *, schema: pa.Schema | None = None) -> tuple[str, int] | None:
        """(model name, dimension) of the vectors in the index, or None when
        the index has no vectors yet. A caller that holds the table's schema
        gives it: each read of table.schema asks LanceDB again."""
        if schema is None:
            # Without a table: the dataset, so that a reader (kb search)
            # does not import lancedb (3 s here) to read a schema.
            table = table if table is not None else self.dataset(CHUNKS)
            if table is None:
                return None
            schema = table.schema
        metadata = schema.metadata or {}
        model = metadata.get(MODEL_KEY.encode())
        if not model:
            return None
        return model.decode(), int(metadata[DIM_KEY.encode()])

    def check_model(self, model_name: str, dim: int, *, why: str = "", table=None,
                    schema: pa.Schema | None = None) -> None:
        """Raise IndexModelMismatch when the index holds another model's vectors."""
        info = self.model_info(table, schema=schema)
        if info is None or info == (model_name, dim):
            return
        extra = f" ({why})" if why else ""
        raise IndexModelMismatch(
            f"The index holds vectors of {info[0]} ({info[1]} dimensions), "
            f"but the embedder is {model_name} ({dim} dimensions){extra}. "
            f"Use the same embedding model, or: {REBUILD_HINT} (The index is at {self.path}.)"
        )

    def embedder_for(self, embedder: Embedder, table=None, *, schema: pa.Schema | None = None) -> Embedder:
        """The embedder that writes to or searches this index: with the
        setting `auto`, it keeps to the recorded backend. Raises
        IndexModelMismatch for another model, and EmbedderError, with the
        way out, when the recorded backend does not answer."""
        info = self.model_info(table, schema=schema)
        embedder = embedder.keeping_to(info[0] if info else None)
        try:
            name, dim = embedder.model_name, embedder.dim
        except EmbedderError as exc:
            if info is None:
                raise
            raise EmbedderError(f"{exc} The index holds vectors of {info[0]}. Start that backend again. "
                                f"To change the model: {REBUILD_HINT}") from exc
        self.check_model(name, dim, table=table, schema=schema)
        return embedder

    def check_schema(self, table=None, *, schema: pa.Schema | None = None) -> None:
        """Raise IndexModelMismatch when the passages table lacks a column
        that this version of kb writes and reads (an index from older code)."""
        missing = set(CHUNK_FIELDS) - set((schema if schema is not None else table.schema).names)
        if missing:
            raise IndexModelMismatch(
                f"The index at {self.path} has an old layout (no {', '.join(sorted(missing))}). {REBUILD_HINT}")

    def rebuild(self) -> None:
        """Drop every passage and the model record. The next replace_chunks
        starts a new index with the embedder that it gets. Bookmark cards do
        not depend on the model and stay. The embedding cache stays too."""
        with self.writing(), contextlib.suppress(ValueError):
            self._connect().drop_table(CHUNKS)

# A commit's time stamp on the folder can lag the commit by a clock tick of
# the kernel (file times use a coarse clock: 1 to 10 ms). So two commits in
# one tick can give the folder the same time. A stamp counts only when it is
# older than this; before that, each read opens the latest version.
COMMIT_STAMP_SETTLE_NS = 2_000_000_000


def _commit_stamp(table_uri: str) -> tuple[int, int] | None:
    """(inode, modification time in ns) of a local table's `_versions`
    folder, or None when the table has no commits. Lance writes one manifest
    file into that folder per commit (and removes old ones in a cleanup), and
    each of these changes the folder's time; a table dropped and made again
    has a new folder."""
    try:
        status = os.stat(os.path.join(table_uri, "_versions"))
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


def _settled(stamp: tuple[int, int]) -> bool:
    """True when no commit can still leave this stamp unchanged. A time in
    the future (the clock set back) never settles: each read opens."""
    return time.time_ns() - stamp[1] > COMMIT_STAMP_SETTLE_NS

