"""The embedding model is a choice that the owner sees (issue 48).

The index records its model in the passages table (kb/index/chunk_schema.py).
With the setting `auto`, kb keeps to that model (Embedder.keeping_to): a
sync while Ollama is down for a moment must not change the model under the
owner. The price was a silent one: a first index made while Ollama was down
kept MiniLM after Ollama came up. So:
- model_note() says when the configured model is ready and the index holds
  another one; `kb status`, the end report of a sync and the MCP answers
  show the model of the index.
- rebuild_beside() makes the new index beside the old one and swaps the two
  when the new one is complete: search works all the time.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from kb.index.chunk_schema import CHUNK_FIELDS
from kb.index.embedder import Embedder, forget_backend_choice
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS
from kb.index.writes import _chunk_table

# The new passages table, beside CHUNKS until the swap.
NEXT = "chunks_next"
# Rows per embedding call of the rebuild: the progress moves, and memory stays small.
REBUILD_PART = 512


def configured_model(embedder: Embedder | None = None) -> tuple[str | None, bool]:
    """(the model that the settings choose now, whether it is ready). It does
    not keep to the index's model, and it never raises. It asks Ollama
    again: `auto` keeps its first answer for the life of a process."""
    forget_backend_choice()
    report = (embedder or Embedder.from_settings()).readiness()
    return report.get("active"), bool(report.get("ready"))


def model_note(index_model: str | None, embedder: Embedder | None = None) -> str:
    """A sentence when the configured model is ready and the index holds
    another; else "". """
    if not index_model:
        return ""
    configured, ready = configured_model(embedder)
    if not configured or not ready or configured == index_model:
        return ""
    return (f"The index holds vectors of {index_model}, and the configured model {configured} is ready. "
            "Run `kb index --rebuild` to change to it: kb builds the new index beside the old one, "
            "and search works during the rebuild.")


def rebuild_beside(index: ChunkIndex, embedder: Embedder,
                   on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Embed every passage of the index again with `embedder` into a new
    table beside the passages table, then swap the two tables. Readers use
    the old table until the swap, and the new one after it. A bucket has no
    folders to swap, and a table of an old layout lacks columns: there the
    old way stays (drop, then index again)."""
    old = index.table(CHUNKS)
    if old is None:
        return {"passages": 0, "swapped": False}
    if index.remote or set(CHUNK_FIELDS) - set(old.schema.names):
        # A table of an old layout cannot give its rows: the runs that follow index every batch again.
        index.rebuild()
        return {"passages": 0, "swapped": False}
    rows = old.search().select(list(CHUNK_FIELDS)).limit(None).to_arrow().to_pylist()
    model, dim = embedder.model_name, embedder.dim
    db = index._connect()
    with contextlib.suppress(ValueError, FileNotFoundError):
        db.drop_table(NEXT)  # a rebuild that stopped before its end
    table = None
    for start in range(0, len(rows), REBUILD_PART):
        part = rows[start:start + REBUILD_PART]
        for row, vector in zip(part, embedder.embed_documents([r["text"] for r in part])):
            row["vector"] = vector
        data = _chunk_table(part, dim, model)
        if table is None:
            table = db.create_table(NEXT, data=data)
        else:
            table.add(data)
        if on_progress:
            on_progress(min(start + REBUILD_PART, len(rows)), len(rows))
    if table is None:  # no passage at all
        index.rebuild()
        return {"passages": 0, "swapped": False}
    index._create_fts(table)
    with index.writing():
        _swap(Path(index.table_uri(CHUNKS)), Path(index.table_uri(NEXT)))
    shutil.rmtree(index.table_uri(NEXT), ignore_errors=True)  # the old table now
    index.maintain()  # the vector index of the new table, once it has enough rows
    return {"passages": len(rows), "swapped": True, "model": model}


RENAME_EXCHANGE = 2


def _swap(a: Path, b: Path) -> None:
    """Exchange two folders in one step (Linux renameat2 RENAME_EXCHANGE):
    a reader never finds no table. Elsewhere, two renames."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd = -100
        if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0:
            return
    except (AttributeError, OSError):
        pass
    parked = a.with_name(a.name + ".swap")
    os.rename(a, parked)
    os.rename(b, a)
    os.rename(parked, b)
