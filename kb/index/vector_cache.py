"""The cache of document vectors: vectors by (model, sha256 of the text) in
the LanceDB table `embedding_cache`, so unchanged text is never embedded
twice. The cache is in LanceDB and not in DuckDB on purpose: the embedding
step runs while no DuckDB connection is open (see duckdb_store.py)."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

CACHE_TABLE = "embedding_cache"
# Write new cache rows at most this many at a time: an interrupted run keeps
# what it embedded, and the table does not get one small file per batch.
CACHE_FLUSH_ROWS = 1024
# Compact the cache table after this many new versions. Many small appends
# make lookups slow.
CACHE_COMPACT_EVERY = 64


class VectorCache:
    """Vectors by (model, sha256 of the text) in a LanceDB table."""

    LOOKUP_CHUNK = 2000

    def __init__(self, folder: Path, model: str):
        self.folder = folder
        self.model = model

    def _table(self, create: bool):
        from kb.index.lance_loader import lancedb_module

        lancedb = lancedb_module()
        self.folder.mkdir(parents=True, exist_ok=True)
        db = lancedb.connect(str(self.folder))
        try:
            return db.open_table(CACHE_TABLE)
        except ValueError:
            if not create:
                return None
        schema = pa.schema([("model", pa.string()), ("key", pa.string()), ("vector", pa.list_(pa.float32()))])
        # exist_ok: another process may create the table at the same time.
        return db.create_table(CACHE_TABLE, schema=schema, exist_ok=True)

    def lookup(self, keys: set[str]) -> dict[str, np.ndarray]:
        table = self._table(create=False)
        if table is None or not keys:
            return {}
        found: dict[str, np.ndarray] = {}
        ordered = sorted(keys)
        model = _sql_str(self.model)
        for start in range(0, len(ordered), self.LOOKUP_CHUNK):
            part = ordered[start:start + self.LOOKUP_CHUNK]
            in_list = ", ".join(f"'{k}'" for k in part)  # keys are hex digests: safe to inline
            result = (table.search().where(f"model = {model} AND key IN ({in_list})")
                      .select(["key", "vector"]).limit(None).to_arrow())
            for key, vector in zip(result.column("key").to_pylist(), result.column("vector").to_numpy(zero_copy_only=False)):
                found[key] = np.asarray(vector, dtype=np.float32)
        return found

    def store(self, keys: list[str], vectors: list[np.ndarray]) -> None:
        """Add the vectors, with the writer lock of the LanceDB folder (the
        same lock as ChunkIndex.writing): a compaction here and a commit of
        another process to this table make a commit conflict."""
        from kb.store.writer_lock import writer_lock

        with writer_lock(Path(str(self.folder).rstrip("/") + ".lock"), f"LanceDB {self.folder}").hold():
            self._store(keys, vectors)

    def _store(self, keys: list[str], vectors: list[np.ndarray]) -> None:
        table = self._table(create=True)
        data = pa.table({
            "model": pa.array([self.model] * len(keys), pa.string()),
            "key": pa.array(keys, pa.string()),
            "vector": pa.array([v.astype(np.float32).tolist() for v in vectors], pa.list_(pa.float32())),
        })
        table.add(data)
        if table.version % CACHE_COMPACT_EVERY == 0:
            # Keep old versions for a while: another process may be reading one.
            table.optimize(cleanup_older_than=timedelta(minutes=10))
            try:
                if not any(ix.columns == ["key"] for ix in table.list_indices()):
                    table.create_scalar_index("key", index_type="BTREE")
            except Exception as exc:  # noqa: BLE001 - an index only makes lookups faster
                log.warning("Could not index the embedding cache: %s", exc)

    def count(self) -> int:
        table = self._table(create=False)
        return 0 if table is None else table.count_rows(f"model = {_sql_str(self.model)}")


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
