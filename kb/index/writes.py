"""The writes of the LanceDB serving index: replace the passages of
bookmarks, delete bookmarks and source kinds, write bookmark cards
(IndexWrites, a mixin of ChunkIndex in kb/index/client.py). Each write holds
the writer lock for its commit only; embedding happens before it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kb.index.cards import BOOKMARKS_SCHEMA, pack_card
from kb.index.chunk_schema import AUTHOR_KEY_COLUMN, CHUNK_FIELDS, NGRAM_COLUMN, author_key, chunks_schema
from kb.index.chunking import unspaced_runs, word_count
from kb.index.store import (BOOKMARKS, CHUNKS, REBUILD_HINT, IndexModelMismatch, _parts, sql_in, to_utc)


class IndexWrites:
    """The writes of ChunkIndex. A mixin: it needs the store of IndexStore
    (kb/index/store.py) and the indexes of IndexMaintenance."""

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
        cards = [pack_card(row, index) for index, row in enumerate(rows)]
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
