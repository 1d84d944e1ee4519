"""The LanceDB serving index: passages with vectors and a full-text index,
plus the bookmark cards that the serving side answers get_bookmark with.

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
- `embedding_cache`: owned by kb.index.vector_cache.

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
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


import numpy as np
import pyarrow as pa
from pydantic import BaseModel, PrivateAttr, SecretStr, field_validator

from kb.index.chunk_schema import (AUTHOR_KEY_COLUMN, CHUNK_FIELDS, DIM_KEY, MODEL_KEY, NGRAM_COLUMN, author_key,
                                   chunks_schema)
from kb.index.chunking import unspaced_runs, word_count
from kb.index.embed_vectors import EmbedderError
from kb.index.embedder import Embedder
from kb.index.passage_rows import ROWS_FILE_MIN_ROWS, PassageRows, dataset_identity
from kb.settings import Settings, get_settings
from kb.writer_lock import writer_lock

log = logging.getLogger(__name__)

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
# maintain() folds new rows into the indexes without compaction until the
# passages table has this many data files; then it compacts them. Each sync
# that adds rows adds one file and one segment to each index. A search reads
# each file and segment, so many of them make it slower.
COMPACT_FRAGMENTS = 16
# At a compaction, merge up to this many segments of an index: all of them.
MERGE_EVERY_SEGMENT = 1 << 16
# Bookmark cards kept in memory per table version (see bookmarks()).
CARDS_CACHE_SIZE = 4096

# The full-text index keeps no token positions: with them its build took 4
# times longer and each query 2 times longer (benchmarks/index_and_retrieval.md).
# search.py finds a quoted phrase by an AND query of its words and an exact
# check on the text. English stemming and stop words, as in LanceDB's
# default: the `text` column is English (translated when needed).
def _lancedb():
    """lancedb, imported on first use. Why: every Dagster process (the
    daemon, the webserver, each run worker) imports this module when it
    loads the graph, and `import lancedb` takes 1.5 s of CPU even without
    its REST client (kb/index/lance_loader.py); a process that opens no index
    must not pay it."""
    from kb.index.lance_loader import lancedb_module

    return lancedb_module()


def fts_config():
    from lancedb.index import FTS

    return FTS(with_position=False, base_tokenizer="simple", language="English",
               stem=True, remove_stop_words=True, lower_case=True, ascii_folding=True)


def ngram_fts_config():
    from lancedb.index import FTS

    return FTS(with_position=False, base_tokenizer="ngram", ngram_min_length=1, ngram_max_length=2,
               lower_case=False, stem=False, remove_stop_words=False, ascii_folding=False)

def vector_partitions(rows: int) -> int:
    """Partitions of the IVF vector index for a table of `rows` rows: about
    the square root, so partitions and rows per partition grow alike.
    search.py scans the nearest ones (vector_probes())."""
    return max(1, round(math.sqrt(rows)))


# A dense search compares at least this many vectors: every vector of a
# smaller table. The MiniLM vectors of one topic lie in many partitions. On
# SciFact (8,219 passages, 91 partitions) a search of 20 partitions gave
# dense nDCG@10 0.627 (Recall@100 0.879), of 40 partitions 0.650 (0.919),
# of every partition 0.655 (0.929). More costs time: at 100,000 passages,
# 20 / 32 / 64 partitions (0 / 10,000 / 20,000 here) gave hybrid p95 13.5 /
# 14.5 / 21.0 ms, 11.0 / 12.7 / 16.5 ms of CPU (load 2.4; goal 20 ms).
# benchmarks/index_and_retrieval.md, "Partitions that a compaction keeps".
MIN_COMPARED_VECTORS = 10_000


def vector_probes(rows: int) -> int:
    """Partitions that a dense query scans: the nearest to the query vector.
    At least 20, at least a sixteenth of them, and enough to hold
    MIN_COMPARED_VECTORS vectors. At 100,000 rows: 32 of 316 partitions;
    at 1,000,000: 62 of 1,000; below 10,000 rows: every partition."""
    partitions = vector_partitions(rows)
    compared = math.ceil(partitions * MIN_COMPARED_VECTORS / max(rows, 1))
    return max(20, partitions // 16, compared)


def vector_index_stats(dataset) -> dict | None:
    """Lance's statistics of the vector index of a dataset (None: no index):
    "indices" has one entry per segment (num_partitions ...), and
    num_unindexed_rows the rows that it does not cover. Without the
    centroids: with them they cost 78 ms of CPU at 100,000 passages and 290
    ms at 1,000,000; without them 6 ms (Lance 13 reads this variable at
    each call)."""
    os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")
    name = vector_index_name(dataset)
    return dataset.stats.index_stats(name) if name else None


def vector_index_name(dataset) -> str | None:
    """The name of the vector index of a Lance dataset (None: no index)."""
    return next((ix.name for ix in dataset.describe_indices() if ix.field_names == ["vector"]), None)


def vector_index_config(rows: int):
    """The vector index for a table of `rows` rows. "dot": the embedder
    gives unit vectors, so dot equals cosine and skips the norms; search.py
    queries with the same type. The k-means sample (at most about 20k
    vectors) and its 20 rounds bound the build time as the table grows.

    IVF_SQ: each dimension in 8 bits, so the index (which a search process
    holds in Lance's index cache) is a quarter of the vectors: at 100,000
    passages of 256 dimensions 27 MB against 104 MB with IVF_FLAT, and a
    scan of 20 partitions cost 4.2 against 4.8 ms of CPU
    (benchmarks/index_and_retrieval.md). The distances are approximate; a
    dense search that must be exact re-ranks its hits with the stored
    vectors (search.py, _dense()).

    Lance 13's optimize() joins the partitions of this index into few
    large ones: ChunkIndex._compact() keeps them."""
    from lancedb.index import IvfSq

    partitions = vector_partitions(rows)
    return IvfSq(distance_type="dot", num_partitions=partitions, max_iterations=20,
                 sample_rate=min(256, max(16, 20_000 // partitions)))


CARD_COLUMNS = ("tweet_id", "url", "author", "author_name", "created_at", "text", "lang", "payload", "last_sync")


class IndexModelMismatch(RuntimeError):
    """The index holds vectors of another model than the embedder's."""


BOOKMARKS_SCHEMA = pa.schema([
    ("tweet_id", pa.string()),
    ("url", pa.string()),
    ("author", pa.string()),
    ("author_name", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("text", pa.string()),
    ("lang", pa.string()),
    ("payload", pa.string()),  # JSON: quoted post, links, media, article, and any other field
    ("last_sync", pa.timestamp("us", tz="UTC")),
])

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


class ChunkIndex(BaseModel):
    """The LanceDB index, in a local folder or in an S3-compatible bucket.

    path: a folder, or an s3://bucket/folder address. The s3_* fields go to
    LanceDB as storage options; they matter only for an s3:// path."""

    path: str
    vector_index_min_rows: int
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_allow_http: bool = False
    # The writer lock file (kb/writer_lock.py). Empty: a file beside a local
    # index folder; no lock for a bucket.
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
    def from_settings(cls, settings: Settings | None = None, **overrides) -> ChunkIndex:
        settings = settings or get_settings()
        return cls(**{"path": settings.lance_uri,
                      "vector_index_min_rows": settings.kb_vector_index_min_rows,
                      "s3_endpoint": settings.kb_s3_endpoint, "s3_region": settings.kb_s3_region,
                      "s3_access_key_id": settings.kb_s3_access_key_id,
                      "s3_secret_access_key": settings.kb_s3_secret_access_key,
                      "s3_allow_http": settings.kb_s3_allow_http,
                      "lock_path": str(settings.home / "lancedb.lock"), **overrides})

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

    # --- writes -----------------------------------------------------------
    def replace_chunks(self, tweet_ids: list[str], rows: list[dict], embedder) -> dict:
        """Make the passages of these bookmarks exactly `rows`.

        One commit (merge_insert by chunk_id that also deletes the stale
        passages of these bookmarks), so a reader sees the old set or the new
        set, never a moment with the bookmark missing. Running it twice gives
        the same table: no duplicates.

        A bookmark whose passages are all stored already, field for field, is
        not written again. Each sync captures the top page again, so most of
        its bookmarks are known. LanceDB writes an updated row as a new row
        and marks the old one deleted; the next optimize() then rewrites
        every fragment next to the marked ones, which is the whole table
        below a million rows (benchmarks/bench_sync.py measured it)."""
        tweet_ids = sorted({str(t) for t in tweet_ids})
        data_rows = self._validated_chunk_rows(tweet_ids, rows)
        table = self.table(CHUNKS)
        if table is not None:
            self.check_schema(table)
            if NGRAM_COLUMN not in table.schema.names:
                self._add_ngram_column(table)  # the new rows carry it; a table from before issue 29 gets it
            if AUTHOR_KEY_COLUMN not in table.schema.names:
                self._add_author_key_column(table)  # the same for a table from before issue 49
        stored = self._stored_passages(table, tweet_ids) if table is not None else {}
        by_bookmark: dict[str, dict[str, dict]] = {}
        for row in data_rows:
            by_bookmark.setdefault(row["tweet_id"], {})[row["chunk_id"]] = row
        unchanged = {t for t in tweet_ids if _same_passages(by_bookmark.get(t, {}), stored.get(t, {}))}
        tweet_ids = [t for t in tweet_ids if t not in unchanged]
        data_rows = [r for r in data_rows if r["tweet_id"] not in unchanged]
        new_ids = {r["chunk_id"] for r in data_rows}
        counts = {"written": 0, "embedded": 0, "unchanged_bookmarks": len(unchanged),
                  "deleted": sum(c not in new_ids for t in tweet_ids for c in stored.get(t, {}))}
        if not data_rows:
            if table is not None and counts["deleted"]:
                with self.writing():
                    for part in _parts(tweet_ids):
                        table.delete(sql_in("tweet_id", part))
            return counts
        embedder = self.embedder_for(embedder, table)
        model_name, dim = embedder.model_name, embedder.dim
        before = dict(getattr(embedder, "stats", {}) or {})
        vectors = embedder.embed_documents([r["text"] for r in data_rows])
        after = dict(getattr(embedder, "stats", {}) or {})
        for row, vector in zip(data_rows, vectors):
            row["vector"] = vector
        data = _chunk_table(data_rows, dim, model_name)
        with self.writing():  # the vectors are made: only the commit waits for other writers
            if table is None:
                table = self._connect().create_table(CHUNKS, data=data, exist_ok=True)
                if table.count_rows() != len(data_rows):
                    # Another writer created it first: fall through to the merge.
                    self._merge(table, tweet_ids, data)
                self._create_fts(table)
            else:
                self._merge(table, tweet_ids, data)
        counts.update(written=len(data_rows), embedded=after.get("embedded", 0) - before.get("embedded", 0))
        return counts

    def _stored_passages(self, table, tweet_ids: list[str]) -> dict[str, dict[str, dict]]:
        """The stored passages of these bookmarks, without vectors:
        {tweet_id: {chunk_id: row}}."""
        stored: dict[str, dict[str, dict]] = {}
        for part in _parts(tweet_ids):
            found = (table.search().where(sql_in("tweet_id", part)).select(list(CHUNK_FIELDS))
                     .limit(None).to_arrow().to_pylist())
            for row in found:
                stored.setdefault(row["tweet_id"], {})[row["chunk_id"]] = row
        return stored

    def _merge(self, table, tweet_ids: list[str], data: pa.Table) -> None:
        if len(tweet_ids) <= 5000:
            (table.merge_insert("chunk_id")
             .when_matched_update_all()
             .when_not_matched_insert_all()
             .when_not_matched_by_source_delete(sql_in("tweet_id", tweet_ids))
             .execute(data))
            return
        # A huge IN list makes a slow filter: upsert, then delete stale ids.
        table.merge_insert("chunk_id").when_matched_update_all().when_not_matched_insert_all().execute(data)
        keep = set(data.column("chunk_id").to_pylist())
        for part in _parts(tweet_ids):
            existing = table.search().where(sql_in("tweet_id", part)).select(["chunk_id"]).limit(None).to_arrow()
            stale = [c for c in existing.column("chunk_id").to_pylist() if c not in keep]
            for stale_part in _parts(stale):
                table.delete(sql_in("chunk_id", stale_part))

    def _validated_chunk_rows(self, tweet_ids: list[str], rows: list[dict]) -> list[dict]:
        owners = set(tweet_ids)
        seen: set[str] = set()
        out = []
        for index, row in enumerate(rows):
            for field in ("chunk_id", "tweet_id", "text"):
                if not row.get(field) and row.get(field) != 0:
                    raise ValueError(f"chunk row {index} has no {field}")
            chunk_id, tweet_id = str(row["chunk_id"]), str(row["tweet_id"])
            if tweet_id not in owners:
                raise ValueError(f"chunk {chunk_id} belongs to bookmark {tweet_id}, which is not in tweet_ids")
            if chunk_id in seen:
                raise ValueError(f"chunk_id {chunk_id} occurs twice in one replace_chunks call")
            seen.add(chunk_id)
            text = str(row["text"])
            out.append({
                "chunk_id": chunk_id,
                "tweet_id": tweet_id,
                "url": row.get("url") or "",
                "author": (row.get("author") or "").lstrip("@"),
                "created_at": to_utc(row.get("created_at"), name=f"created_at of chunk {chunk_id}"),
                "source": row.get("source") or "post",
                "ref": row.get("ref") or "",
                "position": int(row.get("position") or 0),
                "text": text,
                "source_text": row.get("source_text") or "",
                "word_count": int(row["word_count"]) if row.get("word_count") is not None else word_count(text),
                "lang": row.get("lang") or "",
            })
        totals = _bookmark_totals(out)
        for row in out:
            row["bookmark_chunks"], row["bookmark_words"] = totals[row["tweet_id"]]
        return out

    def remove_bookmarks(self, tweet_ids: list[str]) -> int:
        """Delete the passages and the cards of these bookmarks."""
        with self.writing():
            return self._remove_bookmarks(sorted({str(t) for t in tweet_ids}))

    def _remove_bookmarks(self, tweet_ids: list[str]) -> int:
        removed = 0
        for name in (CHUNKS, BOOKMARKS):
            table = self.table(name)
            if table is None:
                continue
            for part in _parts(tweet_ids):
                filter_ = sql_in("tweet_id", part)
                count = table.count_rows(filter_)
                if count:
                    table.delete(filter_)
                    if name == CHUNKS:
                        removed += count
        return removed

    def remove_sources(self, sources: list[str]) -> int:
        """Delete every passage of these source kinds (for example an owner's
        `exclude = ["image"]`). Their vectors leave with the rows; maintain()
        then prunes the old versions that still hold them."""
        with self.writing():
            return self._remove_sources(sources)

    def _remove_sources(self, sources: list[str]) -> int:
        table = self.table(CHUNKS)
        if table is None or not sources:
            return 0
        filter_ = sql_in("source", sorted(set(sources)))
        affected = table.search().where(filter_).select(["tweet_id"]).limit(None).to_arrow()
        if not affected.num_rows:
            return 0
        table.delete(filter_)
        self._refresh_totals(table, sorted(set(affected.column("tweet_id").to_pylist())))
        return affected.num_rows

    def _refresh_totals(self, table, tweet_ids: list[str]) -> None:
        """Recount bookmark_chunks and bookmark_words after passages left."""
        for part in _parts(tweet_ids):
            rows = (table.search().where(sql_in("tweet_id", part))
                    .select(["chunk_id", "tweet_id", "word_count"]).limit(None).to_arrow().to_pylist())
            if not rows:
                continue
            totals = _bookmark_totals(rows)
            update = pa.table({
                "chunk_id": [r["chunk_id"] for r in rows],
                "bookmark_chunks": pa.array([totals[r["tweet_id"]][0] for r in rows], pa.int32()),
                "bookmark_words": pa.array([totals[r["tweet_id"]][1] for r in rows], pa.int32()),
            })
            table.merge_insert("chunk_id").when_matched_update_all().execute(update)

    def upsert_bookmark_cards(self, rows: list[dict]) -> int:
        """Insert or replace one card per bookmark. Known columns: tweet_id,
        url, author, author_name, created_at, text, lang, payload (JSON),
        last_sync. Any other key (quoted, links, media, ...) goes into payload."""
        if not rows:
            return 0
        cards = [_card(row, index) for index, row in enumerate(rows)]
        data = pa.Table.from_pylist(cards, schema=BOOKMARKS_SCHEMA)
        with self.writing():
            self._write_cards(cards, data)
        return len(cards)

    def _write_cards(self, cards: list[dict], data: pa.Table) -> None:
        table = self.table(BOOKMARKS)
        if table is None:
            self._connect().create_table(BOOKMARKS, schema=BOOKMARKS_SCHEMA, exist_ok=True)
            table = self.table(BOOKMARKS)
        table.merge_insert("tweet_id").when_matched_update_all().when_not_matched_insert_all().execute(data)
        syncs = [c["last_sync"] for c in cards if c["last_sync"] is not None]
        if syncs:
            latest = max(syncs)
            known = self.meta().get("last_sync")
            if not known or to_utc(known) < latest:
                self._write_meta({"last_sync": latest.isoformat()})

    # --- maintenance ------------------------------------------------------
    def _create_fts(self, table) -> None:
        table.create_index("text", config=fts_config(), replace=True)
        self._create_ngram_fts(table)

    def _create_ngram_fts(self, table) -> None:
        if NGRAM_COLUMN not in table.schema.names:
            self._add_ngram_column(table)
        table.create_index(NGRAM_COLUMN, config=ngram_fts_config(), replace=True)

    def _add_ngram_column(self, table) -> None:
        """Give a passages table from before issue 29 its NGRAM_COLUMN, made
        from the text of each row (one new data file per fragment; the rows
        keep their ids and vectors)."""
        import lance

        @lance.batch_udf()
        def runs(batch: pa.RecordBatch) -> pa.RecordBatch:
            values = [unspaced_runs(text, source) for text, source in
                      zip(batch.column("text").to_pylist(), batch.column("source_text").to_pylist())]
            return pa.RecordBatch.from_arrays([pa.array(values, pa.string())], names=[NGRAM_COLUMN])

        dataset = lance.dataset(table.uri, storage_options=self.storage_options() or None)
        dataset.add_columns(runs, read_columns=["text", "source_text"])

    def _add_author_key_column(self, table) -> None:
        """Give a passages table from before issue 49 its AUTHOR_KEY_COLUMN,
        made from the author of each row, as _add_ngram_column() does."""
        import lance

        @lance.batch_udf()
        def keys(batch: pa.RecordBatch) -> pa.RecordBatch:
            values = [author_key(author) for author in batch.column("author").to_pylist()]
            return pa.RecordBatch.from_arrays([pa.array(values, pa.string())], names=[AUTHOR_KEY_COLUMN])

        dataset = lance.dataset(table.uri, storage_options=self.storage_options() or None)
        dataset.add_columns(keys, read_columns=["author"])

    def maintain(self, *, skip_if_current: bool = False) -> dict:
        """Fold new rows into the indexes, build the vector index once the
        table is large, compact files and prune old versions.

        skip_if_current: leave the passages table as it is when every index
        covers every row. The caller sets it when it deleted no passages: then
        nothing waits for an index or for pruning."""
        with self.writing():
            return self._maintain(skip_if_current=skip_if_current)

    def _maintain(self, *, skip_if_current: bool) -> dict:
        from lancedb.index import Bitmap, BTree

        report: dict[str, Any] = {}
        table = self.table(CHUNKS)
        if table is not None:
            rows = table.count_rows()
            indexed = {tuple(ix.columns): ix.index_type for ix in table.list_indices()}
            if ("text",) not in indexed:
                self._create_fts(table)
                report["fts"] = "created"
            elif (NGRAM_COLUMN,) not in indexed:
                self._create_ngram_fts(table)
                report["ngram_fts"] = "created"
            if AUTHOR_KEY_COLUMN not in table.schema.names and rows:
                self._add_author_key_column(table)
                table = self.table(CHUNKS)
            # The filters of a search test these columns (kb.index.search._where()).
            # BTree for the many values of a handle or an id, Bitmap for the
            # few kinds of source.
            for column, config in (("tweet_id", BTree()), ("source", Bitmap()), ("created_at", BTree()),
                                   (AUTHOR_KEY_COLUMN, BTree())):
                if (column,) not in indexed and rows:
                    table.create_index(column, config=config)
            # Exact (flat) vector search is exact and fast enough below this
            # size. Above it: an IVF index with 8-bit vectors (vector_index_config()).
            # Its build is a k-means over a sample (about 8 s per 100k rows
            # on 2 cores), where the HNSW-SQ index that it replaced cost 75 s;
            # a query scans the nearest partitions (vector_probes()).
            if ("vector",) not in indexed and rows >= self._vector_index_min_rows():
                table.create_index("vector", config=vector_index_config(rows))
                report["vector_index"] = "created"
            # _compact(): compaction, new rows into every index, prune versions.
            # Its compaction rewrites every fragment below a million rows that
            # lies next to another one, so on a table of that size each call
            # rewrites the whole table (about 100 s at 1,000,000 passages),
            # and it makes the vector index again. When nothing is new, skip
            # it. Else fold the new rows into the indexes and leave the files
            # as they are (deleted rows too), until they are many small files.
            if skip_if_current and not report and not self._unindexed_rows(table):
                report["optimize"] = "skipped: every row is indexed"
            elif self._fold_new_rows(table):
                report["indexes"] = "new rows folded in, files not compacted"
            else:
                self._compact(table)
            report["chunks"] = rows
        cards = self.table(BOOKMARKS)
        if cards is not None:
            if ("tweet_id",) not in {tuple(ix.columns) for ix in cards.list_indices()} and cards.count_rows():
                cards.create_index("tweet_id", config=BTree())
            cards.optimize(cleanup_older_than=KEEP_VERSIONS)
        meta = self.table(META)
        if meta is not None:
            meta.optimize(cleanup_older_than=KEEP_VERSIONS)
        return report

    def _compact(self, table) -> None:
        """What lancedb's optimize() does (bring every index up to date,
        compact the files, prune old versions), except for the vector index.

        Why not optimize(): Lance 13 merges the segments of an IVF index and
        then joins partitions that are small by its own measure (about 32,000
        rows for IVF_SQ). A new build of 1,000,000 passages kept 31 of its 995
        partitions, 100,000 kept 4 of 316: a search of vector_probes()
        partitions then read every vector (hybrid p95 277 ms at 1,000,000,
        benchmarks/index_and_retrieval.md). So the vector index is made again,
        with vector_index_config() for the rows of now, when it has more than
        one segment or misses rows: at most once per COMPACT_FRAGMENTS syncs.

        The indexes come first: Lance compacts only files that the same
        index segments cover, and each fold gives its file segments of its
        own. (optimize() compacted nothing after 15 folds: 16 files stayed.)
        The compaction after it keeps the partitions."""
        dataset = self._lance(table)
        vector = vector_index_name(dataset)
        others = [ix.name for ix in dataset.describe_indices() if ix.name != vector]
        if others:
            # Every segment into one (the default merges only the newest).
            dataset.optimize.optimize_indices(index_names=others, num_indices_to_merge=MERGE_EVERY_SEGMENT)
        table.checkout_latest()
        if self._vector_index_is_stale(table):
            table.create_index("vector", config=vector_index_config(table.count_rows()), replace=True)
        self._lance(table).optimize.compact_files()
        self._lance(table).cleanup_old_versions(older_than=KEEP_VERSIONS)
        table.checkout_latest()

    def _vector_index_is_stale(self, table) -> bool:
        """True when the vector index has more than one segment or misses rows."""
        stats = vector_index_stats(self._lance(table))
        return stats is not None and (len(stats["indices"]) > 1 or stats["num_unindexed_rows"] > 0)

    def _lance(self, table):
        """The Lance dataset of a lancedb table, at its newest version."""
        import lance

        return lance.dataset(table.uri, storage_options=self.storage_options() or None)

    def _fold_new_rows(self, table) -> bool:
        """Add the unindexed rows to every index and prune old versions,
        with no compaction: only the index files of the new rows are written.
        False when the table has COMPACT_FRAGMENTS files or more: then
        _compact() must compact them."""
        if table.stats()["fragment_stats"]["num_fragments"] >= COMPACT_FRAGMENTS:
            return False
        # num_indices_to_merge=0: the new rows get an index segment of their
        # own. Merging it into the full-text index rewrote that index: 4 s
        # of the 4.2 s that 1% new rows cost at 100k passages. The segments
        # add up until _compact() merges them, with the files. (It keeps
        # the partitions of the vector index, see _compact().)
        self._lance(table).optimize.optimize_indices(num_indices_to_merge=0)
        self._lance(table).cleanup_old_versions(older_than=KEEP_VERSIONS)
        return True

    @staticmethod
    def _unindexed_rows(table) -> int:
        """Rows that at least one index of the table does not cover yet."""
        most = 0
        for ix in table.list_indices():
            stats = table.index_stats(ix.name)
            most = max(most, getattr(stats, "num_unindexed_rows", 0) or 0)
        return most

    # --- reads ------------------------------------------------------------
    def counts(self) -> dict:
        """For `kb status`: passages, bookmarks with passages, cards, model."""
        out: dict[str, Any] = {"chunks": 0, "indexed_bookmarks": 0, "bookmarks": 0, "model": None, "dim": None,
                               "last_sync": None, "vector_index": False, "fts_unindexed_rows": None,
                               "path": self.path}
        meta = self.meta()
        out["model"], out["last_sync"] = meta.get("model"), meta.get("last_sync")
        out["dim"] = int(meta["dim"]) if meta.get("dim") else None
        table = self.table(CHUNKS)
        if table is not None:
            out["chunks"] = table.count_rows()
            ids = table.search().select(["tweet_id"]).limit(None).to_arrow().column("tweet_id")
            out["indexed_bookmarks"] = len(set(ids.to_pylist()))
            for ix in table.list_indices():
                if ix.columns == ["vector"]:
                    out["vector_index"] = True
                if ix.columns == ["text"]:
                    stats = table.index_stats(ix.name)
                    out["fts_unindexed_rows"] = getattr(stats, "num_unindexed_rows", None)
        cards = self.table(BOOKMARKS)
        if cards is not None:
            out["bookmarks"] = cards.count_rows()
        return out

    def last_sync(self) -> str | None:
        return self.meta().get("last_sync")

    def passage_rows(self, dataset) -> PassageRows:
        """Every column but the vector of every passage of `dataset` (the
        passages table at one version, from dataset()), in memory.

        Why: a read of a few rows by row id costs 2 to 8 ms on a table of
        100,000 rows (each column of each row is a random read), and a search
        needs the short columns of about 200 candidates, the text of about
        100 and every column of the hits. In memory, that costs less than
        1 ms. The price: at 100,000 synthetic passages of 120 words, 106 MB
        of Arrow buffers and 282 MB more resident memory in all
        (benchmarks/index_and_retrieval.md). The vectors stay in Lance's
        index cache.

        The rows of a data fragment do not change while its data files are the
        same (Lance writes changed rows as new rows or new files), so a new
        table version reads only its new fragments: a sync that adds 1% new
        passages reads 1% of the rows. A compaction writes new files, so the
        next search reads every row again (0.5 s at 100,000 passages)."""
        identity = dataset_identity(dataset)
        rows = self._rows
        if rows is not None and rows.identity == identity:
            return rows
        with self._lock:
            rows = self._rows
            if rows is None or rows.identity != identity:
                rows = PassageRows.read(dataset, identity, rows, exact_vectors=self._exact_search(dataset),
                                        rows_dir=Path(self.rows_dir) if self.rows_dir and not self.remote else None,
                                        file_min_rows=self.rows_file_min_rows)
                self._rows = rows
        return rows

    def _exact_search(self, dataset) -> bool:
        """True when a dense query of this version is an exact search: no
        vector index, and fewer rows than make one. Then search.py compares
        the query with the vectors in memory (PassageRows.vectors): a Lance
        query costs 1 to 2 ms even on 43 rows, numpy 0.1 ms. The vectors of
        5,000 rows of 384 dimensions take 7.7 MB."""
        if dataset.count_rows() >= self._vector_index_min_rows():
            return False
        return vector_index_name(dataset) is None

    def bookmark(self, tweet_id: str) -> dict | None:
        """The card of one bookmark, payload fields at the top level."""
        cards = self.bookmarks([tweet_id])
        return cards.get(str(tweet_id))

    def bookmarks(self, tweet_ids: list[str]) -> dict[str, dict]:
        table = self.dataset(BOOKMARKS)
        if table is None or not tweet_ids:
            return {}
        # Cards of this table version that a search read before: a query for
        # them cost about as much as the retrieval on a small index. A new
        # version (a sync) empties the cache. The cache keeps the stored
        # rows (payload as JSON text, None for a bookmark without a card), and
        # each call unpacks its own copy: a deep copy of the unpacked cards
        # cost 2 ms per search on the demo, json.loads a tenth of it.
        with self._lock:
            version = table.version
            if self._cards_cache is None or self._cards_cache[0] != version:
                self._cards_cache = (version, {})
            cache = self._cards_cache[1]
            wanted = sorted({str(t) for t in tweet_ids})
            stored = {t: cache[t] for t in wanted if t in cache}
        missing = [t for t in wanted if t not in stored]
        for part in _parts(missing):
            for row in table.to_table(filter=sql_in("tweet_id", part)).to_pylist():
                stored[row["tweet_id"]] = row
        with self._lock:
            if self._cards_cache[0] == version and len(cache) < CARDS_CACHE_SIZE:
                for t in missing:
                    cache[t] = stored.get(t)
        return {t: _unpack_card(dict(row)) for t, row in stored.items() if row is not None}

    def passages(self, *, tweet_id: str | None = None, ref: str | None = None) -> list[dict]:
        """Every passage of a bookmark or of a page, in reading order
        (source, ref, position), without vectors. A page that several
        bookmarks link to appears once."""
        table = self.table(CHUNKS)
        if table is None or (tweet_id is None and ref is None):
            return []
        filters = []
        if tweet_id is not None:
            filters.append(f"tweet_id = {sql_str(tweet_id)}")
        if ref is not None:
            filters.append(f"ref = {sql_str(ref)}")
        columns = [c for c in CHUNK_FIELDS]
        rows = table.search().where(" AND ".join(filters)).select(columns).limit(None).to_arrow().to_pylist()
        rows.sort(key=lambda r: (r["tweet_id"] != tweet_id, r["source"], r["ref"], r["position"], r["tweet_id"]))
        seen: set[tuple] = set()
        out = []
        for row in rows:
            key = (row["source"], row["ref"], row["position"])
            if key in seen:
                continue
            seen.add(key)
            out.append(row)
        return out

    # --- reads for the MCP server (read only) --------------------------------
    def version(self) -> int | None:
        """The version of the passages table, or None when it does not exist.
        A new commit gives a new number, so callers can cache by it."""
        dataset = self.dataset(CHUNKS)
        return None if dataset is None else dataset.version

    def source_kinds(self) -> list[str]:
        """The source kinds that the passages have (post, link, wiki, ...)."""
        dataset = self.dataset(CHUNKS)
        if dataset is None:
            return []
        column = dataset.to_table(columns=["source"]).column("source")
        return sorted(v for v in column.unique().to_pylist() if v)

    def tweet_ids(self, *, source: str | None = None) -> set[str]:
        """The tweet ids that have passages, of one source kind or of all."""
        table = self.table(CHUNKS)
        if table is None:
            return set()
        query = table.search().select(["tweet_id"]).limit(None)
        if source is not None:
            query = query.where(f"source = {sql_str(source)}")
        return set(query.to_arrow().column("tweet_id").unique().to_pylist())

    def outline(self, tweet_id: str) -> list[dict]:
        """source, ref, position and word_count of each passage of a
        bookmark, without text and vectors: what there is to read, cheaply."""
        table = self.table(CHUNKS)
        if table is None:
            return []
        rows = (table.search().where(f"tweet_id = {sql_str(tweet_id)}")
                .select(["source", "ref", "position", "word_count"]).limit(None).to_arrow().to_pylist())
        return sorted(rows, key=lambda r: (r["source"], r["ref"], r["position"]))


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


def _bookmark_totals(rows: list[dict]) -> dict[str, tuple[int, int]]:
    totals: dict[str, list[int]] = {}
    for row in rows:
        total = totals.setdefault(row["tweet_id"], [0, 0])
        total[0] += 1
        total[1] += int(row["word_count"] or 0)
    return {tweet_id: (count, words) for tweet_id, (count, words) in totals.items()}


def _same_passages(new: dict[str, dict], stored: dict[str, dict]) -> bool:
    """True when a bookmark's stored passages are exactly its new rows (both
    {chunk_id: row}): the same chunk ids, each field equal. Their vectors
    are equal too: the same text, and check_model() keeps one model per
    index. Timestamps compare as instants, so a stored UTC value equals the
    new one."""
    return bool(stored) and new.keys() == stored.keys() and all(
        row[name] == stored[chunk_id].get(name) for chunk_id, row in new.items() for name in CHUNK_FIELDS)


def _parts(values: list, size: int = 1000):
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _chunk_table(rows: list[dict], dim: int, model: str) -> pa.Table:
    schema = chunks_schema(dim, model)
    vectors = np.asarray(np.stack([r.pop("vector") for r in rows]), dtype=np.float32)
    if vectors.shape[1] != dim:
        raise IndexModelMismatch(f"The embedder gave {vectors.shape[1]}-dimension vectors, not {dim}. {REBUILD_HINT}")
    columns = {name: pa.array([r[name] for r in rows], type=schema.field(name).type) for name in CHUNK_FIELDS}
    columns["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)
    columns[NGRAM_COLUMN] = pa.array([unspaced_runs(r["text"], r["source_text"]) for r in rows], pa.string())
    columns[AUTHOR_KEY_COLUMN] = pa.array([author_key(r["author"]) for r in rows], pa.string())
    return pa.table(columns, schema=schema)


def _card(row: dict, index: int) -> dict:
    tweet_id = row.get("tweet_id")
    if not tweet_id:
        raise ValueError(f"bookmark card {index} has no tweet_id")
    payload: dict = {}
    if row.get("payload"):
        raw = row["payload"]
        try:
            payload = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bookmark card {tweet_id}: payload is not JSON ({exc})") from exc
    for key, value in row.items():
        if key not in CARD_COLUMNS:
            payload[key] = value
    return {
        "tweet_id": str(tweet_id),
        "url": row.get("url") or "",
        "author": (row.get("author") or "").lstrip("@"),
        "author_name": row.get("author_name") or "",
        "created_at": to_utc(row.get("created_at"), name=f"created_at of bookmark {tweet_id}"),
        "text": row.get("text") or "",
        "lang": row.get("lang") or "",
        "payload": json.dumps(payload, default=_json_default, ensure_ascii=False),
        "last_sync": to_utc(row.get("last_sync"), name=f"last_sync of bookmark {tweet_id}"),
    }


def _json_default(value):
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def _unpack_card(row: dict) -> dict:
    payload = json.loads(row.pop("payload") or "{}")
    for key, value in payload.items():
        row.setdefault(key, value)
    for key in ("created_at", "last_sync"):
        if isinstance(row.get(key), datetime):
            row[key] = row[key].astimezone(timezone.utc).isoformat()
    return row
