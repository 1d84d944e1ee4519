"""The client of the LanceDB serving index: ChunkIndex, one object with the
store (kb/index/store.py), the writes (kb/index/writes.py), the maintenance
(kb/index/maintenance.py) and the reads that status, search and the serving
side ask (IndexReads, here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cachetools import LRUCache

from kb.index.cards import unpack_card
from kb.index.chunk_schema import CHUNK_FIELDS
from kb.index.maintenance import IndexMaintenance, vector_index_name
from kb.index.passage_rows import PassageRows, dataset_identity
from kb.index.store import BOOKMARKS, CHUNKS, IndexStore, _parts, sql_in, sql_str
from kb.index.writes import IndexWrites

# Bookmark cards kept in memory per table version (see bookmarks()).
CARDS_CACHE_SIZE = 4096


class IndexReads:
    """The reads of ChunkIndex. A mixin: it needs the store of IndexStore."""

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
                self._cards_cache = (version, LRUCache(maxsize=CARDS_CACHE_SIZE))
            cache = self._cards_cache[1]
            wanted = sorted({str(t) for t in tweet_ids})
            stored = {t: cache[t] for t in wanted if t in cache}  # cache[t] marks t as used
        missing = [t for t in wanted if t not in stored]
        for part in _parts(missing):
            for row in table.to_table(filter=sql_in("tweet_id", part)).to_pylist():
                stored[row["tweet_id"]] = row
        with self._lock:
            if self._cards_cache[0] == version:
                for t in missing:
                    cache[t] = stored.get(t)
        return {t: unpack_card(dict(row)) for t, row in stored.items() if row is not None}

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



class ChunkIndex(IndexReads, IndexWrites, IndexMaintenance, IndexStore):
    """The LanceDB index, in a local folder or in an S3-compatible bucket
    (IndexStore has the fields). One writer (the `chunk_index` asset) and
    many readers (search, MCP, bot)."""
