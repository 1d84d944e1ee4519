"""`kb backup [DEST]` and `kb restore ARCHIVE`: the whole KB_HOME in one archive.

The archive is one tar.gz with one top folder:

    manifest.json      versions, counts, and the SHA-256 of every other file
    kb.duckdb          the DuckDB store
    lancedb/           the LanceDB serving index (with the embedding cache)
    wiki.bundle        the wiki's git history: every branch and tag
    wiki-raw/          the wiki's raw/ folder (parsed sources). git ignores
                       raw/ on purpose, so the bundle does not hold it
    wiki-worktree/     wiki files that the owner changed and did not commit
    raw/               captured X pages, exactly as they came
    inbox/             inbox items and their attachments
    dagster/           the Dagster home: dagster.yaml and its SQLite files

How each part is made consistent:
- No writer runs: the backup refuses to start while a run of this home is
  in progress (a run whose process lives), so no stage writes during it.
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
into KB_HOME/.pre-restore-<time>/ first; nothing is deleted). It checks every
checksum before it puts anything in place, then opens each store and
compares its counts with the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import duckdb

from kb.settings import Settings, get_settings

FORMAT = 1
MANIFEST = "manifest.json"
DUCKDB_FILE = "kb.duckdb"
WIKI_BUNDLE = "wiki.bundle"
WIKI_RAW = "wiki-raw"
WIKI_WORKTREE = "wiki-worktree"
# The agent's CLI keeps its own settings and session files in KB_HOME/agent:
# not data, and they can hold tokens. Not backed up.
HOME_FOLDERS = ("raw", "inbox")
CHANGE_MARKER = ".git/kb-change-in-progress"  # see kb/wiki_repo.py
LANCE_COPY_ATTEMPTS = 3
CHUNK = 1 << 20


class BackupError(RuntimeError):
    """A backup or a restore that cannot go on. The message says why and what to do."""


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
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise BackupError(f"git {args[0]} failed in {cwd}: {(proc.stderr or proc.stdout).strip()[:300]}")
    return proc.stdout.strip()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _copy_tree(source: Path, target: Path, *, skip_dirs: tuple[str, ...] = ()) -> int:
    """Copy regular files; no links (a link could point out of KB_HOME)."""
    count = 0
    for folder, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs and not Path(folder, d).is_symlink())
        for name in sorted(files):
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)
            count += 1
    return count


# --- the parts of a backup ---------------------------------------------------------------


def refuse_if_runs_in_progress(settings: Settings) -> None:
    """No run of this home may write while the backup copies."""
    if not (settings.dagster_home / "dagster.yaml").exists():
        return
    import dagster as dg

    from dagster._core.launcher import WorkerStatus

    unfinished = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
                  dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        launcher = instance.run_launcher
        for record in instance.get_run_records(filters=dg.RunsFilter(statuses=unfinished)):
            run = record.dagster_run
            # The run launcher's health check, as the daemon's run monitoring asks it.
            if launcher.supports_check_run_worker_health and \
                    launcher.check_run_worker_health(run).status == WorkerStatus.FAILED:
                continue  # its worker is dead: it writes nothing
            # Alive, or the launcher cannot tell.
            raise BackupError(
                f"A run is in progress in {settings.dagster_home}: {run.job_name} {run.run_id} "
                f"({run.status.value}). Start the backup when it has ended, so that no stage writes "
                "during the copy.")


def backup_duckdb(source: Path, target: Path, attempts: int = 20) -> dict[str, int]:
    """One snapshot of the DuckDB file into `target`. Returns rows per table."""
    for attempt in range(attempts):
        conn = duckdb.connect()
        try:
            conn.execute(f"ATTACH '{_sql_path(source)}' AS src (READ_ONLY)")
            conn.execute(f"ATTACH '{_sql_path(target)}' AS dst")
            conn.execute("COPY FROM DATABASE src TO dst")
            conn.execute("DETACH dst")
            conn.execute("DETACH src")
            break
        except duckdb.IOException as exc:
            # A writer holds the file: a stage started after the run check.
            if "lock" not in str(exc).lower() or attempt == attempts - 1:
                raise BackupError(f"Cannot read {source}: {exc}. Another process writes it; "
                                  "run the backup again when it ends.") from exc
            target.unlink(missing_ok=True)
            time.sleep(0.25 * (attempt + 1))
        finally:
            conn.close()
    return duckdb_counts(target)


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def duckdb_counts(path: Path) -> dict[str, int]:
    conn = duckdb.connect(str(path), read_only=True)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_catalog = current_database() AND table_schema = 'main' ORDER BY 1").fetchall()]
        return {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
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
    from kb.lance_loader import lancedb_module

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
    branch = subprocess.run(["git", "symbolic-ref", "--short", "-q", "HEAD"], cwd=wiki, capture_output=True,
                            text=True).stdout.strip()
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
    """dagster.yaml and every SQLite database, each by the online backup API."""
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
    for name in ("dagster.yaml",):
        if (home / name).is_file():
            shutil.copy2(home / name, target / name)
    return {"databases": databases}


# --- backup --------------------------------------------------------------------------------


def default_archive_name(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"kb-backup-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"


def create_backup(dest: Path | str | None = None, *, include_dagster: bool = True,
                  settings: Settings | None = None) -> BackupResult:
    """Write one tar.gz of KB_HOME. `dest`: a folder (the archive gets a
    dated name), a path that ends in .tar.gz, or None for the current folder."""
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
    target.parent.mkdir(parents=True, exist_ok=True)
    refuse_if_runs_in_progress(settings)

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
        os.replace(partial, target)  # the archive appears whole, or not at all
    return BackupResult(target, manifest, round(time.monotonic() - started, 2))


def _make_parts(settings: Settings, stage: Path, include_dagster: bool) -> dict:
    from kb.duckdb_schema import SCHEMA_VERSION

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


def restore_backup(archive: Path | str, *, force: bool = False, settings: Settings | None = None) -> RestoreResult:
    """Restore an archive of create_backup into KB_HOME, which must be empty
    (with `force`, what is there moves aside first)."""
    settings = settings or get_settings()
    archive = Path(archive).expanduser().resolve()
    home = settings.home
    if not archive.is_file():
        raise BackupError(f"No such archive: {archive}.")
    present = sorted(p.name for p in home.iterdir()) if home.is_dir() else []
    if present and not force:
        raise BackupError(f"KB_HOME {home} is not empty ({', '.join(present[:5])}). Restore into an empty "
                          "folder, or use --force to move what is there aside first.")
    home.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(dir=home.parent, prefix=".kb-restore-") as tmp:
        root = _unpack(archive, Path(tmp))
        manifest = _read_manifest(root, archive)
        checked = _verify_checksums(root, manifest, archive)
        moved = _move_aside(home, present) if present else None
        result = RestoreResult(home=home, manifest=manifest, moved_aside=moved, checked_files=checked)
        _put_in_place(root, manifest, settings)
    _verify_restored(settings, manifest)
    return result


def _unpack(archive: Path, tmp: Path) -> Path:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # The "data" filter refuses absolute paths, `..`, links out of the
            # folder and device files: an archive cannot write outside tmp.
            tar.extractall(tmp, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BackupError(f"{archive} is not a readable kb backup (tar.gz): {exc}") from exc
    tops = [p for p in tmp.iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / MANIFEST).is_file():
        raise BackupError(f"{archive} is not a kb backup: it has no single top folder with {MANIFEST}.")
    return tops[0]


def _read_manifest(root: Path, archive: Path) -> dict:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except ValueError as exc:
        raise BackupError(f"The {MANIFEST} of {archive} is not JSON: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{archive} has backup format {manifest.get('format')!r}; this kb reads format {FORMAT}.")
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


def _move_aside(home: Path, names: list[str]) -> Path:
    aside = home / f".pre-restore-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}"
    aside.mkdir()
    for name in names:
        if not name.startswith(".pre-restore-"):
            os.replace(home / name, aside / name)
    return aside


def _put_in_place(root: Path, manifest: dict, settings: Settings) -> None:
    home = settings.home
    if (root / DUCKDB_FILE).is_file():
        os.replace(root / DUCKDB_FILE, settings.duckdb_path)
    for name, target in (("lancedb", settings.lancedb_dir), ("raw", home / "raw"), ("inbox", home / "inbox"),
                         ("dagster", settings.dagster_home)):
        if (root / name).is_dir():
            os.replace(root / name, target)
    if manifest.get("wiki"):
        _restore_wiki(root, manifest["wiki"], settings.wiki_dir)


def _restore_wiki(root: Path, facts: dict, wiki: Path) -> None:
    # init and fetch every ref, not clone: a clone keeps only one local
    # branch and adds a remote that names the temp bundle.
    wiki.mkdir(parents=True)
    _git(wiki, "init", "--quiet", "--initial-branch", facts["branch"] or "main")
    _git(wiki, "fetch", "--quiet", "--update-head-ok", str(root / WIKI_BUNDLE), "refs/*:refs/*")
    if facts["branch"]:
        _git(wiki, "reset", "--quiet", "--hard", facts["head"])
    else:
        _git(wiki, "checkout", "--quiet", "--detach", facts["head"])
    if (root / WIKI_RAW).is_dir():
        _copy_tree(root / WIKI_RAW, wiki / "raw")
    if (root / WIKI_WORKTREE).is_dir():
        _copy_tree(root / WIKI_WORKTREE, wiki)
    for path in facts.get("uncommitted_deletions", []):
        (wiki / path).unlink(missing_ok=True)
    if facts.get("change_in_progress"):
        (wiki / CHANGE_MARKER).write_text(facts["change_in_progress"])


def _verify_restored(settings: Settings, manifest: dict) -> None:
    counts = manifest.get("counts", {})
    problems = []
    if "duckdb" in counts and duckdb_counts(settings.duckdb_path) != counts["duckdb"]:
        problems.append("the DuckDB row counts differ from the manifest")
    if "lancedb" in counts:
        restored = {name: {"rows": f["rows"]} for name, f in lancedb_facts(settings.lancedb_dir).items()}
        if restored != {name: {"rows": f["rows"]} for name, f in counts["lancedb"].items()}:
            problems.append("the LanceDB row counts differ from the manifest")
    wiki = manifest.get("wiki")
    if wiki and _git(settings.wiki_dir, "rev-parse", "HEAD") != wiki["head"]:
        problems.append("the wiki HEAD differs from the manifest")
    if problems:
        raise BackupError(f"The restore into {settings.home} does not match its manifest: {'; '.join(problems)}.")
