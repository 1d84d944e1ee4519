"""The backup and the restore of the whole KB_HOME in one archive: the core
of `kb backup [DEST]`, `kb restore ARCHIVE` and the daily backup schedule
(kb_assets/backups.py). No Dagster here: the caller gives the check that
no run writes (`check_no_run`).

The archive is one tar.gz with one top folder:

    manifest.json      versions, counts, and the SHA-256 of every other file
    kb.duckdb          the DuckDB store
    lancedb/           the LanceDB serving index (with the embedding cache)
    wiki.bundle        the wiki's git history: every branch and tag
    wiki-raw/          the wiki's raw/ folder (parsed sources). git holds only
                       the parsed files that an ingest took, so the bundle
                       does not hold all of raw/
    wiki-worktree/     wiki files that the owner changed and did not commit
    raw/               captured X pages, exactly as they came
    inbox/             inbox items and their attachments
    dagster/           the Dagster home: its SQLite files (no dagster.yaml:
                       the restore writes kb's own)

How each part is made consistent:
- No writer runs: the backup refuses to start while a run of this home is
  in progress (a run whose process lives), so no stage writes during it.
  The check reads the Dagster instance: the caller passes it in.
- DuckDB: COPY FROM DATABASE inside one read transaction of a READ_ONLY
  attach. DuckDB gives that transaction one snapshot, and the attach fails
  while a writer holds the file, so a half-written state cannot come in.
  The copy is also compact (no free blocks, no write-ahead log).
- LanceDB: for each table, the version manifests are copied first, then the
  files that they name. Lance writes data and index files before the
  manifest that names them and never changes them after, so every copied
  manifest finds its files. The copy is then opened and read; a copy that
  does not read is made again.
- Wiki: `git bundle --all` (git packs a consistent set of objects); raw/ and
  uncommitted files are copied as they are.
- Dagster home: the SQLite online backup API, one database at a time. It is
  part of the backup because Dagster is the state store of the Telegram
  inflow: the `sources` partitions, the inbox sensor's cursor and each
  item's runs. Without it, a restored home would take every inbox item as
  new and ingest it again. Compute logs (run stdout and stderr) are left
  out: they are large and only logs. `include_dagster=False` leaves the
  whole Dagster home out.

Restore goes into an EMPTY KB_HOME only (`force` moves what is there aside
into KB_HOME/.pre-restore-<time>/; nothing is deleted). An archive is
hostile input until it is checked, so the restore first makes the checks
of kb/backup/archive_checks.py (the size and paths of members, the paths of
the manifest, the objects of the DuckDB file and of the Dagster SQLite
files, the columns of the DuckDB tables, the files of the LanceDB tables,
the trees of the wiki bundle). It opens each restored store as data only:
DuckDB read-only with external access off, and no SQL is built from a name
in the archive. It never takes the archive's dagster.yaml: Dagster imports
each class that the file names, and its logging config follows attributes
(`dagster._core.log_manager.logging.os.system` is os.system). The caller
gives kb's own dagster.yaml for the settings (`dagster_yaml`).
Then it:
- builds the whole new home in KB_HOME/.kb-restore-<random>/ first (the
  same file system as its place, also when KB_HOME is a mount point such
  as a Docker volume), and opens each store there and compares its counts
  with the manifest. Only then is the old data moved aside and the new data
  moved in. A move across file systems (EXDEV) copies and then removes.
  When a move fails, what was moved in goes out again and the old data
  comes back.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import duckdb

from kb.backup.archive_checks import (
    DAGSTER_YAML, DUCKDB_FILE, MANIFEST, MAX_MEMBERS, MEMBER_BYTES, BackupError, CheckedTarInfo, check_dagster_home,
    check_duckdb, check_lancedb, check_manifest, check_members, check_unpacked_size, check_wiki_trees,
    member_bytes, open_duckdb_as_data, quote_identifier,
)
from kb.store.duckdb_store import LOCK_ATTEMPTS, retry_while_locked, signals_reach_caller
from kb.store.atomic_files import write_atomic
from kb.store.private_files import FILE_MODE, make_private_folder, make_tree_private
from kb.settings import Settings, get_settings
from kb.wiki.git_env import git_command, git_env

FORMAT = 1
WIKI_BUNDLE = "wiki.bundle"
WIKI_RAW = "wiki-raw"
WIKI_WORKTREE = "wiki-worktree"
# The agent's CLI keeps its own settings and session files in KB_HOME/agent:
# not data, and they can hold tokens. Not backed up.
HOME_FOLDERS = ("raw", "inbox")
CHANGE_MARKER = ".git/kb-change-in-progress"  # see kb/wiki/repo.py
STAGE_PREFIX = ".kb-restore-"
ASIDE_PREFIX = ".pre-restore-"
LANCE_COPY_ATTEMPTS = 3
CHUNK = 1 << 20


@dataclass
class BackupResult:
    archive: Path
    manifest: dict
    seconds: float


@dataclass
class RestoreResult:
    home: Path
    manifest: dict
    moved_aside: Path | None = None
    checked_files: int = 0
    notes: list[str] = field(default_factory=list)


# --- helpers ---------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(cwd: Path, *args: str) -> str:
    # kb's own git: none of the owner's git settings (kb.wiki.git_env).
    proc = subprocess.run(git_command(*args), cwd=cwd, capture_output=True, text=True, env=git_env(), timeout=600)
    if proc.returncode != 0:
        raise BackupError(f"git {args[0]} failed in {cwd}: {(proc.stderr or proc.stdout).strip()[:300]}")
    return proc.stdout.strip()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _copy_tree(source: Path, target: Path, *, skip_dirs: tuple[str, ...] = (), within: Path | None = None) -> int:
    """Copy regular files; no links (a link could point out of KB_HOME).
    Nothing is written through a link in the target either: a restored
    wiki commit can hold a link (raw -> /home/owner), and the files of
    wiki-raw/ must not follow it. Every file lands inside `within`
    (default: the target)."""
    count = 0
    inside = (within or target).resolve()
    for folder, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs and not Path(folder, d).is_symlink())
        for name in sorted(files):
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            destination = target / path.relative_to(source)
            if not destination.parent.resolve().is_relative_to(inside):
                raise BackupError(f"{destination} leads out of {target} through a link; the copy stopped.")
            destination.parent.mkdir(parents=True, exist_ok=True)
            if destination.is_symlink():
                destination.unlink()  # the file replaces the link; it is not written through it
            shutil.copy2(path, destination)
            count += 1
    return count


# --- the parts of a backup ---------------------------------------------------------------


def backup_duckdb(source: Path, target: Path, attempts: int = LOCK_ATTEMPTS) -> dict[str, int]:
    """One snapshot of the DuckDB file into `target`. Returns rows per table.
    While a writer holds the file (a stage started after the run check), wait
    and try again from an empty target."""

    @retry_while_locked(attempts, before_sleep=lambda: target.unlink(missing_ok=True))
    def copy() -> None:
        conn = duckdb.connect()
        try:
            conn.execute(f"ATTACH '{_sql_path(source)}' AS src (READ_ONLY)")
            conn.execute(f"ATTACH '{_sql_path(target)}' AS dst")
            conn.execute("COPY FROM DATABASE src TO dst")
            conn.execute("DETACH dst")
            conn.execute("DETACH src")
        finally:
            conn.close()

    # A signal in the copy or the count (kb up stopped during the nightly
    # backup) must end the run as interrupted, so that its run retry takes it.
    with signals_reach_caller(f"backup of {source}"):
        try:
            copy()
        except duckdb.IOException as exc:
            raise BackupError(f"Cannot read {source}: {exc}. Another process writes it; "
                              "run the backup again when it ends.") from exc
        return duckdb_counts(target)


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def duckdb_counts(path: Path) -> dict[str, int]:
    """Rows per table of schema main. The table names come from the file
    (an archive is hostile), so they go into the SQL quoted, never as text."""
    conn = open_duckdb_as_data(path)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM duckdb_tables() "
            "WHERE database_name = current_database() AND schema_name = 'main' ORDER BY 1").fetchall()]
        return {t: conn.execute(f"SELECT count(*) FROM main.{quote_identifier(t)}").fetchone()[0] for t in tables}
    finally:
        conn.close()


def backup_lancedb(source: Path, target: Path) -> dict[str, dict]:
    """Copy the LanceDB folder, manifests first. Returns, per table, the
    version and the row count read back from the copy."""
    last_error: Exception | None = None
    for _ in range(LANCE_COPY_ATTEMPTS):
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for table in sorted(p for p in source.iterdir() if p.is_dir()):
            _copy_lance_table(table, target / table.name)
        for other in sorted(p for p in source.iterdir() if p.is_file()):
            shutil.copy2(other, target / other.name)
        try:
            return lancedb_facts(target)
        except Exception as exc:  # a commit or a clean-up raced the copy: copy again
            last_error = exc
    raise BackupError(f"The copy of {source} does not read after {LANCE_COPY_ATTEMPTS} attempts: {last_error}. "
                      "Another process changes the index; run the backup again when it ends.")


def _copy_lance_table(source: Path, target: Path) -> None:
    versions = source / "_versions"
    if versions.is_dir():
        # latest_version_hint.json is left out: it can name a version newer
        # than the manifests copied here. Lance lists _versions without it.
        for manifest in sorted(versions.glob("*.manifest")):
            (target / "_versions").mkdir(parents=True, exist_ok=True)
            shutil.copy2(manifest, target / "_versions" / manifest.name)
    _copy_tree(source, target, skip_dirs=("_versions",))


def lancedb_facts(folder: Path) -> dict[str, dict]:
    from kb.index.lance_loader import lancedb_module

    db = lancedb_module().connect(str(folder))
    facts = {}
    # The table folders on disk, not a listing call: every folder must read.
    for name in sorted(p.name.removesuffix(".lance") for p in folder.glob("*.lance") if p.is_dir()):
        table = db.open_table(name)
        rows = table.to_arrow().num_rows  # reads every fragment: a missing file fails here
        facts[name] = {"version": table.version, "rows": rows,
                       "indices": sorted("/".join(ix.columns) for ix in table.list_indices())}
    return facts


def backup_wiki(wiki: Path, stage: Path) -> dict | None:
    """The wiki as a git bundle of every ref, plus raw/ and uncommitted files."""
    if not (wiki / ".git").is_dir():
        return None
    _git(wiki, "bundle", "create", str(stage / WIKI_BUNDLE), "--all")
    _git(wiki, "bundle", "verify", str(stage / WIKI_BUNDLE))
    raw_files = _copy_tree(wiki / "raw", stage / WIKI_RAW) if (wiki / "raw").is_dir() else 0
    # Tracked changes and untracked files that git does not ignore: the
    # owner's edits since the last commit. A bundle holds commits only.
    changed = _git(wiki, "ls-files", "--modified", "--others", "--exclude-standard", "-z").split("\0")
    dirty = sorted({p for p in changed if p and (wiki / p).is_file()})
    deleted = sorted({p for p in _git(wiki, "ls-files", "--deleted", "-z").split("\0") if p})
    for path in dirty:
        destination = stage / WIKI_WORKTREE / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wiki / path, destination)
    marker = wiki / CHANGE_MARKER
    branch = subprocess.run(git_command("symbolic-ref", "--short", "-q", "HEAD"), cwd=wiki, capture_output=True,
                            text=True, env=git_env()).stdout.strip()
    return {
        "head": _git(wiki, "rev-parse", "HEAD"),
        "branch": branch or None,  # None: HEAD was detached
        "commits": int(_git(wiki, "rev-list", "--count", "--all")),
        "raw_files": raw_files,
        "uncommitted_files": dirty,
        "uncommitted_deletions": deleted,
        # A change that a killed run left: the restored wiki must still roll it back.
        "change_in_progress": marker.read_text().strip() if marker.exists() else None,
    }


def backup_dagster_home(home: Path, target: Path) -> dict:
    """Every SQLite database, each by the online backup API. `*.db` takes
    `history/runs/.db` too (the event log of the runless events). No
    dagster.yaml: the restore writes kb's own."""
    databases = 0
    for path in sorted(home.rglob("*.db")):
        if "storage" in path.relative_to(home).parts[:1]:
            continue  # compute logs and step outputs: logs only
        destination = target / path.relative_to(home)
        destination.parent.mkdir(parents=True, exist_ok=True)
        source_db = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)
        copy_db = sqlite3.connect(destination)
        try:
            source_db.backup(copy_db)
        finally:
            copy_db.close()
            source_db.close()
        databases += 1
    return {"databases": databases}


# --- backup --------------------------------------------------------------------------------


def default_archive_name(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"kb-backup-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"


def create_backup(dest: Path | str | None = None, *, include_dagster: bool = True,
                  settings: Settings | None = None,
                  check_no_run: Callable[[Settings], None] | None = None) -> BackupResult:
    """Write one tar.gz of KB_HOME. `dest`: a folder (the archive gets a
    dated name), a path that ends in .tar.gz, or None for the current folder.
    `check_no_run` raises BackupError while a run of this home may write."""
    started = time.monotonic()
    settings = settings or get_settings()
    home = settings.home
    if not home.is_dir():
        raise BackupError(f"KB_HOME {home} does not exist: there is nothing to back up.")
    target = Path(dest).expanduser() if dest else Path.cwd()
    if not str(target).endswith(".tar.gz"):
        target = target / default_archive_name()
    target = target.resolve()
    if target.is_relative_to(home):
        raise BackupError(f"The archive {target} is inside KB_HOME {home}. Choose a folder outside it.")
    if target.exists():
        raise BackupError(f"{target} exists already. Choose another name; kb does not overwrite a backup.")
    if not target.parent.exists():
        make_private_folder(target.parent)  # kb makes it: the owner's only (kb/store/private_files.py)
    if check_no_run is not None:
        check_no_run(settings)

    top = target.name.removesuffix(".tar.gz")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".kb-backup-") as tmp:
        stage = Path(tmp) / top
        stage.mkdir()
        manifest = _make_parts(settings, stage, include_dagster)
        manifest["files"] = {str(p.relative_to(stage)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                             for p in sorted(stage.rglob("*")) if p.is_file()}
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        partial = Path(tmp) / "archive.tar.gz"
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(stage, arcname=top)
        # The archive holds all of KB_HOME: the owner's only, whatever the umask.
        os.chmod(partial, FILE_MODE)
        os.replace(partial, target)  # the archive appears whole, or not at all
    return BackupResult(target, manifest, round(time.monotonic() - started, 2))


# The names that default_archive_name gives: retention removes only these.
ARCHIVE_NAME = re.compile(r"kb-backup-\d{8}T\d{6}Z\.tar\.gz")


def dated_archives(folder: Path) -> list[Path]:
    """The archives with kb's dated names in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and ARCHIVE_NAME.fullmatch(p.name))


def prune_archives(folder: Path, keep: int) -> list[Path]:
    """Remove the oldest dated archives in `folder` so that `keep` stay.
    Other files stay: the folder may hold archives that the owner named.
    Returns the removed archives."""
    removed = dated_archives(folder)[:-keep] if keep > 0 else []
    for path in removed:
        path.unlink()
    return removed


def last_backup(settings: Settings | None = None) -> dict:
    """The newest dated archive in KB_BACKUP_DIR, for `kb status`."""
    settings = settings or get_settings()
    archives = dated_archives(settings.backup_dir)
    if not archives:
        return {"folder": str(settings.backup_dir), "last": None, "bytes": None, "kept": 0}
    newest = archives[-1]
    return {"folder": str(settings.backup_dir), "last": newest.name, "bytes": newest.stat().st_size,
            "kept": len(archives)}


def _make_parts(settings: Settings, stage: Path, include_dagster: bool) -> dict:
    from kb.store.duckdb_schema import SCHEMA_VERSION

    manifest: dict = {
        "format": FORMAT,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kb_home": str(settings.home),
        "versions": {
            "kb": _version("kb"), "python": platform.python_version(), "duckdb": duckdb.__version__,
            "lancedb": _version("lancedb"), "dagster": _version("dagster"),
            "git": _git(Path.cwd(), "--version").removeprefix("git version "),
            "duckdb_schema": SCHEMA_VERSION,
        },
        "parts": [],
        "counts": {},
    }
    if settings.duckdb_path.is_file():
        manifest["counts"]["duckdb"] = backup_duckdb(settings.duckdb_path, stage / DUCKDB_FILE)
        manifest["parts"].append("duckdb")
    if settings.lancedb_dir.is_dir():
        manifest["counts"]["lancedb"] = backup_lancedb(settings.lancedb_dir, stage / "lancedb")
        manifest["parts"].append("lancedb")
    wiki = backup_wiki(settings.wiki_dir, stage)
    if wiki is not None:
        manifest["wiki"] = wiki
        manifest["parts"].append("wiki")
    for name in HOME_FOLDERS:
        folder = settings.home / name
        if folder.is_dir():
            manifest["counts"][f"{name}_files"] = _copy_tree(folder, stage / name)
            manifest["parts"].append(name)
    if include_dagster and settings.dagster_home.is_dir():
        manifest["counts"]["dagster"] = backup_dagster_home(settings.dagster_home, stage / "dagster")
        manifest["parts"].append("dagster")
    return manifest


# --- restore -------------------------------------------------------------------------------


def restore_backup(archive: Path | str, *, force: bool = False, settings: Settings | None = None,
                   dagster_yaml: Callable[[Settings], str] | None = None) -> RestoreResult:
    """Restore an archive of create_backup into KB_HOME, which must be empty
    (with `force`, what is there moves aside, after the new home is
    complete and checked). `dagster_yaml` gives the text of kb's own
    dagster.yaml for the settings; None: the restored Dagster home gets none,
    and kb writes it at its first use."""
    settings = settings or get_settings()
    archive = Path(archive).expanduser().resolve()
    home = settings.home
    if not archive.is_file():
        raise BackupError(f"No such archive: {archive}.")
    present = sorted(p.name for p in home.iterdir() if not p.name.startswith(STAGE_PREFIX)) if home.is_dir() else []
    if present and not force:
        raise BackupError(f"KB_HOME {home} is not empty ({', '.join(present[:5])}). Restore into an empty "
                          "folder, or use --force to move what is there aside first.")
    make_private_folder(home)

    with tempfile.TemporaryDirectory(dir=home, prefix=STAGE_PREFIX) as tmp:
        root = _unpack(archive, Path(tmp) / "archive", settings.restore_max_bytes)
        manifest = _read_manifest(root, archive)
        checked = _verify_checksums(root, manifest, archive)
        check_lancedb(root / "lancedb", archive)
        check_dagster_home(root / "dagster", archive)
        new_home = Path(tmp) / "home"
        notes = []
        if (root / "dagster" / DAGSTER_YAML).is_file():
            notes.append("kb wrote its own dagster.yaml; the archive's file was not used (docs/security.md). "
                         "If you edited yours by hand, edit the new file again.")
        _build_home(root, manifest, new_home, archive)
        # The check reads the file where the restore keeps it: only the
        # bytes that KB_HOME gets, and no file beside it.
        check_duckdb(new_home / DUCKDB_FILE, archive)
        if dagster_yaml is not None and (new_home / "dagster").is_dir():
            write_atomic(new_home / "dagster" / DAGSTER_YAML, dagster_yaml(settings).encode())
        # The members carry the modes of the machine that wrote them (0644):
        # the restored home is the owner's only, whatever they say.
        make_tree_private(new_home)
        _verify_restored(new_home, manifest, home)
        moved = _move_aside(home, present) if present else None
        _move_in(new_home, home, moved)
    return RestoreResult(home=home, manifest=manifest, moved_aside=moved, checked_files=checked, notes=notes)


def _unpack(archive: Path, tmp: Path, limit: int) -> Path:
    """Unpack into `tmp`: at most `limit` bytes, and no more than the free disk."""
    try:
        with tarfile.open(archive, "r:gz", tarinfo=CheckedTarInfo) as tar:
            members, declared = [], 0
            # Member by member, so that an archive that declares too much
            # stops at the first header past the limit, not after a read of all.
            while (info := tar.next()) is not None:
                members.append(info)
                declared += member_bytes(info)
                if declared > limit:
                    break
                if len(members) > MAX_MEMBERS:
                    raise BackupError(f"{archive} is refused: it has more than {MAX_MEMBERS:,} members; a kb "
                                      "backup has fewer. Nothing was restored.")
            check_members(members, archive)
            tmp.mkdir(parents=True, exist_ok=True)
            check_unpacked_size(declared, limit, tmp, archive)
            _extract(tar, members, tmp, limit, archive)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BackupError(f"{archive} is not a readable kb backup (tar.gz): {exc}") from exc
    tops = [p for p in tmp.iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / MANIFEST).is_file():
        raise BackupError(f"{archive} is not a kb backup: it has no single top folder with {MANIFEST}.")
    return tops[0]


def _extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], tmp: Path, limit: int, archive: Path) -> None:
    """Write each member and count the bytes written: a member can hold more
    than its header declares, so the count stops the unpack at `limit`.
    Each file is new (O_EXCL): a member that comes twice is refused."""
    written = 0
    for info in members:
        # The "data" filter refuses absolute paths, `..`, links out of the
        # folder and device files as well: a second wall after check_members.
        info = tarfile.data_filter(info, str(tmp))
        target = tmp / info.name
        written += MEMBER_BYTES  # the entry's block, as member_bytes() counts it
        if written > limit:
            raise BackupError(f"{archive} is refused: it unpacked to more than the limit of {limit:,} bytes "
                              f"(KB_RESTORE_MAX_GB), at the member {info.name!r}. Nothing was restored.")
        if info.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(info)
        try:
            with open(target, "xb") as out:
                while block := source.read(CHUNK):
                    written += len(block)
                    if written > limit:
                        raise BackupError(f"{archive} is refused: it unpacked to more than the limit of {limit:,} "
                                          f"bytes (KB_RESTORE_MAX_GB), at the member {info.name!r}. Nothing was "
                                          "restored.")
                    out.write(block)
            os.utime(target, (info.mtime, info.mtime))
        except FileExistsError:
            raise BackupError(f"{archive} is refused: the member {info.name!r} comes twice. Nothing was "
                              "restored.") from None
        finally:
            source.close()


def _read_manifest(root: Path, archive: Path) -> dict:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except ValueError as exc:
        raise BackupError(f"The {MANIFEST} of {archive} is not JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        format_ = manifest.get("format") if isinstance(manifest, dict) else None
        raise BackupError(f"{archive} has backup format {format_!r}; this kb reads format {FORMAT}.")
    check_manifest(manifest, archive)
    return manifest


def _verify_checksums(root: Path, manifest: dict, archive: Path) -> int:
    listed = manifest.get("files", {})
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} - {MANIFEST}
    problems = [f"{name}: missing" for name in sorted(set(listed) - present)]
    problems += [f"{name}: not in the manifest" for name in sorted(present - set(listed))]
    for name in sorted(set(listed) & present):
        if sha256_file(root / name) != listed[name]["sha256"]:
            problems.append(f"{name}: checksum differs")
    if problems:
        raise BackupError(f"{archive} is damaged; nothing was restored. {len(problems)} problem(s), for example: "
                          + "; ".join(problems[:5]))
    return len(listed)


def _build_home(root: Path, manifest: dict, new_home: Path, archive: Path) -> None:
    """The restored home, complete, in the stage folder (same file system as KB_HOME)."""
    new_home.mkdir()
    if (root / DUCKDB_FILE).is_file():
        os.replace(root / DUCKDB_FILE, new_home / DUCKDB_FILE)
    (root / "dagster" / DAGSTER_YAML).unlink(missing_ok=True)  # never the archive's: see the module's text
    for name in ("lancedb", "raw", "inbox", "dagster"):
        if (root / name).is_dir():
            os.replace(root / name, new_home / name)
    if manifest.get("wiki"):
        _restore_wiki(root, manifest["wiki"], new_home / "wiki", archive)


def _move_aside(home: Path, names: list[str]) -> Path:
    """Move the parts of the old home into a folder beside them. When one
    move fails (a mount point, a signal), the parts moved so far come back."""
    aside = home / f"{ASIDE_PREFIX}{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}"
    aside.mkdir()
    try:
        for name in names:
            if not name.startswith(ASIDE_PREFIX):
                move(home / name, aside / name)
    except BaseException as exc:
        _bring_back(aside, home)
        if isinstance(exc, OSError):
            raise BackupError(f"The restore into {home} could not move {name} aside ({exc}); KB_HOME is as it was "
                              "before the restore.") from exc
        raise
    return aside


def _move_in(new_home: Path, home: Path, aside: Path | None) -> None:
    """Move each part of the new home into KB_HOME. When one move fails, the
    parts moved so far go out again and the old data comes back."""
    placed: list[Path] = []
    try:
        for part in sorted(new_home.iterdir()):
            move(part, home / part.name)
            placed.append(home / part.name)
    except BaseException as exc:
        for path in placed:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if aside is not None:
            _bring_back(aside, home)
        if isinstance(exc, OSError):
            raise BackupError(f"The restore into {home} could not move {part.name} into place ({exc}); "
                              "KB_HOME is as it was before the restore.") from exc
        raise


def _bring_back(aside: Path, home: Path) -> None:
    for old in sorted(aside.iterdir()):
        move(old, home / old.name)
    aside.rmdir()


def move(source: Path, target: Path) -> None:
    """Rename `source` to `target`. Across file systems (EXDEV) copy to a
    temp name beside the target, rename that into place, then remove the
    source: the target appears whole or not at all."""
    try:
        os.rename(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    partial = target.with_name(f"{STAGE_PREFIX}{target.name}.partial")
    try:
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, partial, symlinks=True)
        else:
            shutil.copy2(source, partial, follow_symlinks=False)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True) if partial.is_dir() else partial.unlink(missing_ok=True)
        raise
    shutil.rmtree(source) if source.is_dir() and not source.is_symlink() else source.unlink()


def _restore_wiki(root: Path, facts: dict, wiki: Path, archive: Path) -> None:
    # init and fetch every ref, not clone: a clone keeps only one local
    # branch and adds a remote that names the temp bundle. The paths, ids
    # and branch of `facts` were checked (check_manifest), so git cannot
    # read them as options; the checks below and in _copy_tree keep them
    # from leaving the wiki through a link that a restored commit holds.
    wiki.mkdir(parents=True)
    _git(wiki, "init", "--quiet", "--initial-branch", facts.get("branch") or "main")
    _git(wiki, "fetch", "--quiet", "--update-head-ok", str(root / WIKI_BUNDLE), "refs/*:refs/*")
    check_wiki_trees(wiki, archive)  # before the checkout writes a link
    if facts.get("branch"):
        _git(wiki, "reset", "--quiet", "--hard", facts["head"])
    else:
        _git(wiki, "checkout", "--quiet", "--detach", facts["head"])
    if (root / WIKI_RAW).is_dir():
        _copy_tree(root / WIKI_RAW, wiki / "raw", within=wiki)
    if (root / WIKI_WORKTREE).is_dir():
        _copy_tree(root / WIKI_WORKTREE, wiki, within=wiki)
    inside = wiki.resolve()
    for path in facts.get("uncommitted_deletions", []):
        target = wiki / path
        if not target.resolve().is_relative_to(inside) or target.resolve().is_relative_to(inside / ".git"):
            raise BackupError(f"The wiki deletion {path!r} of the archive leads out of the wiki; nothing was restored.")
        if target.is_file() or target.is_symlink():
            target.unlink()
    if facts.get("change_in_progress"):
        (wiki / CHANGE_MARKER).write_text(facts["change_in_progress"])


def _verify_restored(new_home: Path, manifest: dict, home: Path) -> None:
    """Open each store of the new home and compare it with the manifest."""
    counts = manifest.get("counts", {})
    problems = []
    try:
        # A store that the archive holds is compared always: a manifest
        # without its counts is a manifest that does not match.
        if (new_home / DUCKDB_FILE).is_file() and duckdb_counts(new_home / DUCKDB_FILE) != counts.get("duckdb"):
            problems.append("the DuckDB row counts differ from the manifest")
        if (new_home / "lancedb").is_dir():
            restored = {name: {"rows": f["rows"]} for name, f in lancedb_facts(new_home / "lancedb").items()}
            if restored != {name: {"rows": f["rows"]} for name, f in counts.get("lancedb", {}).items()} \
                    or "lancedb" not in counts:
                problems.append("the LanceDB row counts differ from the manifest")
    except Exception as exc:  # a store that does not open: the same answer as a wrong count
        problems.append(f"a store does not open ({type(exc).__name__}: {str(exc)[:200]})")
    wiki = manifest.get("wiki")
    if wiki and _git(new_home / "wiki", "rev-parse", "HEAD") != wiki["head"]:
        problems.append("the wiki HEAD differs from the manifest")
    if problems:
        raise BackupError(f"The restore into {home} does not match its manifest: {'; '.join(problems)}. "
                          "Nothing was changed in KB_HOME.")
