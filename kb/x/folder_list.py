"""The folder list of a Premium account: a BookmarkFoldersSlice answer ->
{folder_id, name} rows."""

from __future__ import annotations

import re

from kb.x.graphql import PageShapeError, as_id, as_str, find_key

# A folder id goes into a file name and into an X address: only letters and
# digits pass (X's ids are digits). Anything else is hostile or unknown.
FOLDER_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")
MAX_FOLDER_NAME = 200


def parse_folder_list(payload: dict, *, name: str = "<answer>") -> tuple[list[dict], list[str]]:
    """([{folder_id, name}], problems) of a BookmarkFoldersSlice answer.
    PageShapeError when it holds no folder list."""
    data = payload.get("data") if isinstance(payload, dict) else None
    found = find_key(data, "bookmark_collections_slice") if isinstance(data, dict) else None
    items = found.get("items") if isinstance(found, dict) else None
    if not isinstance(items, list):
        errors = payload.get("errors") if isinstance(payload, dict) else None
        detail = f"X returned errors: {errors!r:.200}" if errors else "no bookmark_collections_slice.items list"
        raise PageShapeError(f"{name}: not a BookmarkFoldersSlice answer ({detail})")
    folders: list[dict] = []
    problems: list[str] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        folder_id = as_id(item.get("id")) if isinstance(item, dict) else None
        if not folder_id or not FOLDER_ID.match(folder_id):
            problems.append(f"folder {position + 1}: id {folder_id!r:.80} is not letters and digits; skipped")
            continue
        if folder_id in seen:
            continue
        seen.add(folder_id)
        label = as_str(item.get("name"))
        folders.append({"folder_id": folder_id, "name": label.strip()[:MAX_FOLDER_NAME] if label else None})
    return folders, problems
