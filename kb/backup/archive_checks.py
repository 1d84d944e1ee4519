"""The checks that a restore makes before it trusts an archive (kb
restore, kb/backup/archive.py). An archive is hostile input until it is
checked: anyone can forge one and send it to the owner. So each check
reads what the archive holds as data, and names what it refuses:

- a member that is not a plain file or folder, or whose path is absolute,
  has `..` or a `.git` part;
- a manifest whose paths, commit ids or branch name are not plain;
- a dagster.yaml that names a class that is not kb's or Dagster's;
- a DuckDB file that holds more than plain tables in schema main;
- a LanceDB table that reads data files from outside its folder;
- a Dagster home that holds more than dagster.yaml and SQLite databases
  of tables and indexes.
"""

from __future__ import annotations

import re
import sqlite3
import tarfile
from pathlib import Path

import duckdb

MANIFEST = "manifest.json"
DUCKDB_FILE = "kb.duckdb"
# Modules whose classes a restored dagster.yaml may name: Dagster's and kb's.
DAGSTER_YAML_MODULES = ("dagster", "dagster_postgres", "kb_assets", "kb")
COMMIT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
# DuckDB settings for a file from an archive. External access off: no
# COPY TO, ATTACH, read_csv or httpfs, so SQL cannot reach a file or the
# network. No extension loads. lock_configuration: no SET turns it back on.
DUCKDB_DATA_ONLY = {"enable_external_access": False, "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False, "lock_configuration": True}
# The table names that kb gives (kb/store/duckdb_schema.py). Anything else in a
# restored file is refused by name.
PLAIN_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class BackupError(RuntimeError):
    """A backup or a restore that cannot go on. The message says why and what to do."""


def open_duckdb_as_data(path: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection that reads `path` as data only: no file,
    network or extension access, and no statement can turn it back on. A
    restored file comes from an archive that anyone can forge."""
    return duckdb.connect(str(path), read_only=True, config=DUCKDB_DATA_ONLY)


def quote_identifier(name: str) -> str:
    """`name` as one SQL identifier: in double quotes, each quote doubled."""
    return '"' + name.replace('"', '""') + '"'


def duckdb_foreign_objects(path: Path) -> list[str]:
    """What the DuckDB file holds that is not a plain kb table: a table
    outside schema main or with a name that is not plain, a schema, view,
    macro, sequence, index or type. kb makes base tables in main only
    (kb/store/duckdb_schema.py). A view or a macro is SQL that runs each time kb
    reads it, so a restored file may hold none."""
    this = "database_name = current_database()"
    queries = {
        "schema": f"SELECT schema_name FROM duckdb_schemas() WHERE {this} AND NOT internal",
        "view": f"SELECT schema_name || '.' || view_name FROM duckdb_views() WHERE {this} AND NOT internal",
        "macro": f"SELECT schema_name || '.' || function_name FROM duckdb_functions() WHERE {this} AND NOT internal",
        "sequence": f"SELECT schema_name || '.' || sequence_name FROM duckdb_sequences() WHERE {this}",
        "index": f"SELECT schema_name || '.' || index_name FROM duckdb_indexes() WHERE {this}",
        "type": f"SELECT schema_name || '.' || type_name FROM duckdb_types() WHERE {this} AND NOT internal",
        "table": f"SELECT schema_name || '.' || table_name FROM duckdb_tables() WHERE {this} AND (schema_name <> "
                 f"'main' OR NOT regexp_full_match(table_name, '{PLAIN_TABLE_NAME.pattern}'))",
    }
    conn = open_duckdb_as_data(path)
    try:
        found = []
        for kind, query in queries.items():
            found += [f"{kind} {name!r}" for (name,) in conn.execute(query + " ORDER BY 1").fetchall()]
        return found
    finally:
        conn.close()


def check_members(members: list[tarfile.TarInfo], archive: Path) -> None:
    """Plain files and folders with plain relative paths only."""
    for member in members:
        if not (member.isfile() or member.isdir()):
            raise BackupError(f"{archive} is refused: the member {member.name!r} is a link or a special file. "
                              "A kb backup holds plain files and folders only; nothing was restored.")
        problem = unsafe_path(member.name)
        if problem:
            raise BackupError(f"{archive} is refused: the member {member.name!r} {problem}; nothing was restored.")


def unsafe_path(path: str) -> str | None:
    """Why a path from an archive is not safe to use, or None. Safe: relative,
    no empty, `.` or `..` part, no `.git` part at any depth (in any case)."""
    if not isinstance(path, str) or not path or "\0" in path or "\\" in path:
        return "is not a plain path"
    if path.startswith("/"):
        return "is an absolute path"
    parts = path.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, `.` or `..` part"
    if any(part.lower() == ".git" for part in parts):
        return "is under .git (git hooks and config run code)"
    return None


def check_manifest(manifest: dict, archive: Path) -> None:
    """Every path, commit id and branch name that the restore acts on."""
    problems = []
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        problems.append("`files` is not a mapping")
        files = {}
    for name in files:
        if why := unsafe_path(name):
            problems.append(f"files: {name!r} {why}")
    wiki = manifest.get("wiki")
    if wiki is not None:
        if not isinstance(wiki, dict):
            raise BackupError(f"{archive} is refused: the wiki part of its {MANIFEST} is not a mapping.")
        for key in ("uncommitted_files", "uncommitted_deletions"):
            paths = wiki.get(key, [])
            for path in paths if isinstance(paths, list) else [paths]:
                if why := unsafe_path(path):
                    problems.append(f"wiki {key}: {path!r} {why}")
        for key in ("head", "change_in_progress"):
            value = wiki.get(key)
            if (key == "head" or value is not None) and not (isinstance(value, str) and COMMIT_ID.fullmatch(value)):
                problems.append(f"wiki {key}: {str(value)[:80]!r} is not a commit id")
        branch = wiki.get("branch")
        if branch is not None and not plain_branch(branch):
            problems.append(f"wiki branch: {str(branch)[:80]!r} is not a plain branch name")
    if problems:
        raise BackupError(f"{archive} is refused: its {MANIFEST} names what a restore must not touch; nothing "
                          f"was restored. {len(problems)} problem(s), for example: " + "; ".join(problems[:5]))


def plain_branch(name) -> bool:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}", name):
        return False
    return ".." not in name and not name.endswith((".lock", "/", ".")) and "//" not in name


def check_dagster_yaml(path: Path, archive: Path) -> None:
    """Dagster imports every class that its dagster.yaml names (storage, run
    launcher, coordinator, compute logs, logging handlers). A restored file
    may name kb's and Dagster's classes only."""
    if not path.is_file():
        return
    import yaml

    try:
        config = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BackupError(f"{archive} is refused: its dagster/dagster.yaml is not YAML ({exc}).") from exc
    foreign = sorted(set(foreign_classes(config)))
    if foreign:
        raise BackupError(f"{archive} is refused: its dagster/dagster.yaml names code that is not kb's or "
                          f"Dagster's ({', '.join(foreign[:5])}); Dagster would import it. Nothing was restored.")


def check_duckdb(path: Path, archive: Path) -> None:
    """The archive's DuckDB file may hold kb's plain tables only. Its names
    are data: the check reads them through fixed queries, with the file
    opened as data only (open_duckdb_as_data)."""
    if not path.is_file():
        return
    try:
        foreign = duckdb_foreign_objects(path)
    except duckdb.Error as exc:
        raise BackupError(f"{archive} is refused: its member {DUCKDB_FILE} does not open as a DuckDB store "
                          f"({type(exc).__name__}: {str(exc)[:200]}). Nothing was restored.") from exc
    if foreign:
        raise BackupError(f"{archive} is refused: its member {DUCKDB_FILE} holds what a kb store does not hold "
                          f"({'; '.join(foreign[:5])}). A kb store holds plain tables in schema main only. "
                          "Nothing was restored.")


def lance_files_outside(folder: Path) -> list[str]:
    """The data files that a Lance table in `folder` reads from outside its
    own folder, in any version: a base path (another folder, a bucket, a
    web address) or a file path that is not plain. kb writes neither, and a
    read of them would reach the disk or the network."""
    from kb.index.lance_loader import lancedb_module

    lancedb_module()  # lance imports the REST client that kb never uses; see lance_loader
    import lance

    found = []
    for table in sorted(p for p in folder.glob("*.lance") if p.is_dir()):
        for version in lance.dataset(str(table)).versions():
            dataset = lance.dataset(str(table), version=version["version"])
            found += [f"{table.name} version {version['version']}: base path {b.path!r}"
                      for b in dataset.base_paths().values()]
            for fragment in dataset.get_fragments():
                for data in fragment.data_files():
                    if data.base_id is not None or unsafe_path(data.path):
                        found.append(f"{table.name} version {version['version']}: data file {data.path!r}")
    return found


def check_lancedb(folder: Path, archive: Path) -> None:
    if not folder.is_dir():
        return
    try:
        outside = lance_files_outside(folder)
    except Exception as exc:  # Lance raises OSError, ValueError or its own errors for a bad file
        raise BackupError(f"{archive} is refused: its member lancedb/ does not open as a LanceDB index "
                          f"({type(exc).__name__}: {str(exc)[:200]}). Nothing was restored.") from exc
    if outside:
        raise BackupError(f"{archive} is refused: its member lancedb/ reads files outside the archive "
                          f"({'; '.join(outside[:5])}). Nothing was restored.")


def foreign_classes(node, key: str = "") -> list[str]:
    found = []
    if isinstance(node, dict):
        module = node.get("module")
        if module is not None and not own_module(module):
            found.append(f"module {module}")
        for name in ("class", "()"):
            value = node.get(name)
            if module is None and value is not None and not own_module(str(value).rsplit(".", 1)[0]):
                found.append(f"{name} {value}")  # a dotted path, as logging's dictConfig takes it
        for child_key, child in node.items():
            found += foreign_classes(child, str(child_key))
    elif isinstance(node, list):
        for child in node:
            found += foreign_classes(child, key)
    return found


def own_module(module) -> bool:
    module = str(module)
    return any(module == root or module.startswith(root + ".") for root in DAGSTER_YAML_MODULES)


def sqlite_foreign_objects(path: Path) -> list[str]:
    """The objects of a SQLite file that are not tables or indexes. Dagster
    makes tables and indexes only. A trigger is SQL that runs when Dagster
    writes (it could add a tag such as kb/override to every run), and a
    view is SQL that runs when Dagster reads."""
    # mode=ro and immutable: the check writes nothing, not even a journal.
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        rows = conn.execute("SELECT type, name FROM sqlite_master WHERE type NOT IN ('table', 'index') "
                            "ORDER BY 1, 2").fetchall()
        return [f"{kind} {name!r}" for kind, name in rows]
    finally:
        conn.close()


def check_dagster_home(folder: Path, archive: Path) -> None:
    """The archive's dagster/ holds what the backup writes there and nothing
    else: dagster.yaml and SQLite databases of tables and indexes."""
    if not folder.is_dir():
        return
    problems = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = f"dagster/{path.relative_to(folder)}"
        if path == folder / "dagster.yaml":
            continue
        # The name, not Path.suffix: Dagster's event log of the run id ""
        # is history/runs/.db, and the suffix of ".db" is "".
        if not path.name.endswith(".db"):
            problems.append(f"{name} is not a SQLite database (*.db)")
            continue
        try:
            problems += [f"{name} holds a {found}" for found in sqlite_foreign_objects(path)]
        except sqlite3.Error as exc:
            problems.append(f"{name} does not open as SQLite ({exc})")
    if problems:
        raise BackupError(f"{archive} is refused: its Dagster home holds what a kb backup does not hold "
                          f"({'; '.join(problems[:5])}). Nothing was restored.")
