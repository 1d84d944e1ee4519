"""Bookmark folders in the serving index: which bookmarks each folder holds,
under the folder's current name.

One small LanceDB table, `folders`, next to the passages: one row per
(folder, bookmark), and one row with an empty tweet_id per folder, so that an
empty folder is known too. The `chunk_index` asset writes it whole from
DuckDB at each run, when it changed. Why whole, and not per batch: a change
of folder of an old bookmark (whose page is not in the new batch) must show
at the next sync. A folder is keyed by X's id: after a rename it keeps its
bookmarks and shows the new name.

The readers (search, the MCP server, the web page) never open DuckDB; they
read this table. A search with a folder filter keeps to the bookmarks of the
folder: the filter becomes `tweet_id IN (...)` in the one place that makes
the where clause (kb/index/search.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa

from kb.index.client import ChunkIndex
from kb.index.store import KEEP_VERSIONS

FOLDERS = "folders"
FOLDERS_SCHEMA = pa.schema([("folder_id", pa.string()), ("name", pa.string()), ("tweet_id", pa.string())])


@dataclass(frozen=True)
class Folder:
    folder_id: str
    name: str  # the current name; the id when X gave none
    tweet_ids: frozenset[str]


def folder_rows(folders: list[tuple[str, str | None]], members: list[tuple[str, str]]) -> list[dict]:
    """The table's rows: (folder_id, name) of each folder, and (folder_id,
    tweet_id) of each live bookmark in it."""
    names = {folder_id: name or "" for folder_id, name in folders}
    rows = [{"folder_id": folder_id, "name": name, "tweet_id": ""} for folder_id, name in sorted(names.items())]
    rows += [{"folder_id": folder_id, "name": names[folder_id], "tweet_id": tweet_id}
             for folder_id, tweet_id in sorted(members) if folder_id in names]
    return rows


def stored_folders(conn) -> list[dict]:
    """Every folder of DuckDB and its live bookmarks, as the rows of the
    whole folders table of the index (folder_rows())."""
    folders = conn.execute("SELECT folder_id, name FROM folders").fetchall()
    members = conn.execute("""SELECT fb.folder_id, fb.tweet_id FROM folder_bookmarks fb
                              JOIN bookmarks b USING (tweet_id) WHERE b.removed_at IS NULL""").fetchall()
    return folder_rows(folders, members)


def replace_folders(index: ChunkIndex, rows: list[dict]) -> bool:
    """Write the folders table when its rows changed. True when written. An
    unchanged table is not written: each write is a new table version."""
    current = index.dataset(FOLDERS)
    if current is not None:
        stored = {tuple(row.values()) for row in current.to_table().to_pylist()}
        if stored == {(r["folder_id"], r["name"], r["tweet_id"]) for r in rows}:
            return False
    elif not rows:
        return False
    with index.writing():
        index.overwrite_table(FOLDERS, pa.Table.from_pylist(rows, schema=FOLDERS_SCHEMA))
        # Each write is a version; old ones go once no reader can still read them.
        index.table(FOLDERS).optimize(cleanup_older_than=KEEP_VERSIONS)
    return True


_cache_lock = threading.Lock()
_cache: dict[str, tuple[int, list[Folder]]] = {}  # index path -> (table version, folders)


def folders(index: ChunkIndex) -> list[Folder]:
    """Every folder with its live bookmarks, by name. Read once per table version."""
    dataset = index.dataset(FOLDERS)
    if dataset is None:
        return []
    with _cache_lock:
        kept = _cache.get(index.path)
        if kept is not None and kept[0] == dataset.version:
            return kept[1]
    members: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for row in dataset.to_table().to_pylist():
        names[row["folder_id"]] = row["name"] or row["folder_id"]
        bucket = members.setdefault(row["folder_id"], set())
        if row["tweet_id"]:
            bucket.add(row["tweet_id"])
    found = sorted((Folder(fid, names[fid], frozenset(ids)) for fid, ids in members.items()),
                   key=lambda f: (f.name.lower(), f.folder_id))
    with _cache_lock:
        _cache[index.path] = (dataset.version, found)
    return found


def folder_members(index: ChunkIndex, folder: str) -> list[str]:
    """The tweet ids of the folder that has this name (case and outer spaces
    do not count) or this id. ValueError names the folders that exist."""
    wanted = " ".join(str(folder).split()).lower()
    known = folders(index)
    matched = [f for f in known if f.name.lower() == wanted or f.folder_id == wanted]
    if not matched:
        names = ", ".join(repr(f.name) for f in known[:30])
        raise ValueError(f"folder={folder!r} is unknown: " + (f"the folders are {names}" if known else
                         "the index has no bookmark folders (X Premium folders come with `kb sync`)"))
    return sorted(set().union(*(f.tweet_ids for f in matched)))


def folders_of(index: ChunkIndex, tweet_id: str) -> list[str]:
    """The current names of the folders that hold this bookmark."""
    return [f.name for f in folders(index) if tweet_id in f.tweet_ids]
