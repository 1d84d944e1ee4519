"""The checks that a restore makes before it trusts an archive (kb
restore, kb/backup/archive.py). An archive is hostile input until it is
checked: anyone can forge one and send it to the owner. So each check
reads what the archive holds as data, and names what it refuses:

- a member that is not a plain file or folder, or whose path is absolute,
  has `..` or a `.git` part, or is not one of the parts that a kb backup
  writes (ARCHIVE_PARTS);
- a tar header that declares a negative size or meta data larger than
  MAX_META_BYTES, and an archive of more than MAX_MEMBERS members;
- an archive that unpacks to more than KB_RESTORE_MAX_GB, or to more than
  the free disk (each member counts at least MEMBER_BYTES);
- a manifest whose paths, commit ids, branch name, checksums or counts are
  not plain;
- a DuckDB file that holds more than kb's tables, or a table whose columns
  are not kb's (another type, a CHECK, a DEFAULT or a generated column);
- a LanceDB table that reads data files from outside its folder;
- a Dagster home that holds more than SQLite databases of tables and
  indexes (and a dagster.yaml, which the restore never uses: kb writes its
  own);
- a wiki bundle whose trees hold a symbolic link or a submodule.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import duckdb

from kb.store.duckdb_schema import TABLES
from kb.wiki.git_env import git_command, git_env

MANIFEST = "manifest.json"
DUCKDB_FILE = "kb.duckdb"
# What a kb backup holds under its top folder, by allowlist (create_backup
# writes these). Why: DuckDB reads a file "kb.duckdb.wal" beside the store
# when it opens the store, also read-only. With such a file in an archive,
# the check read the store with the WAL's changes, and the restore moved the
# store alone: the bytes that kb kept were not the bytes that it checked.
ARCHIVE_PARTS = frozenset({MANIFEST, DUCKDB_FILE, "lancedb", "wiki.bundle", "wiki-raw", "wiki-worktree", "raw",
                           "inbox", "dagster"})
# Tar meta data (a pax header, a GNU long name) is read into memory whole,
# before any member is checked: a header of 1 GB took 1.1 GB of memory.
# kb's backups write names of a few hundred bytes.
MAX_META_BYTES = 1 << 20
META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
# Each member costs memory while the restore reads the headers, and disk
# (a folder or an empty file takes a block): 100,000 empty folders in an
# archive of 470 kB took 392 MiB of disk. A home of a year holds some
# ten thousand files.
MAX_MEMBERS = 1_000_000
MEMBER_BYTES = 4096
# The restore never uses the archive's dagster.yaml (kb writes its own), so
# this one name may be in the archive's dagster/ without being a database.
DAGSTER_YAML = "dagster.yaml"
# The first 16 bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"
COMMIT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
SHA256 = re.compile(r"[0-9a-f]{64}")
# DuckDB settings for a file from an archive. External access off: no
# COPY TO, ATTACH, read_csv or httpfs, so SQL cannot reach a file or the
# network. No extension loads. lock_configuration: no SET turns it back on.
DUCKDB_DATA_ONLY = {"enable_external_access": False, "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False, "lock_configuration": True}
# The git tree modes of the files and folders that kb's wiki holds: a
# plain file, an executable file and a folder. A symbolic link (120000)
# could lead a later write of kb out of the wiki; a submodule (160000) is
# another repository.
WIKI_TREE_MODES = (b"100644", b"100755", b"40000")


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
    """What the DuckDB file holds that is not a kb table: a table outside
    schema main or with a name that kb does not give, a schema, view,
    macro, sequence, index or type, and in kb's tables a column or a
    constraint that kb's schema does not make (kb_table_shapes). A view or
    a macro is SQL that runs each time kb reads it. A DEFAULT or a
    generated column is SQL that runs each time kb writes a row, with
    kb's rights: `DEFAULT (read_text('~/.config/kb/.env'))` would copy the
    settings file into each new row. So a restored file may hold none."""
    this = "database_name = current_database()"
    queries = {
        "schema": f"SELECT schema_name FROM duckdb_schemas() WHERE {this} AND NOT internal",
        "view": f"SELECT schema_name || '.' || view_name FROM duckdb_views() WHERE {this} AND NOT internal",
        "macro": f"SELECT schema_name || '.' || function_name FROM duckdb_functions() WHERE {this} AND NOT internal",
        "sequence": f"SELECT schema_name || '.' || sequence_name FROM duckdb_sequences() WHERE {this}",
        "index": f"SELECT schema_name || '.' || index_name FROM duckdb_indexes() WHERE {this}",
        "type": f"SELECT schema_name || '.' || type_name FROM duckdb_types() WHERE {this} AND NOT internal",
    }
    conn = open_duckdb_as_data(path)
    try:
        found = []
        for kind, query in queries.items():
            found += [f"{kind} {name!r}" for (name,) in conn.execute(query + " ORDER BY 1").fetchall()]
        tables = conn.execute(f"SELECT schema_name, table_name FROM duckdb_tables() WHERE {this} ORDER BY 1, 2")
        found += [f"table {f'{schema}.{table}'!r}" for schema, table in tables.fetchall()
                  if schema != "main" or table not in TABLES]
        found += foreign_columns(conn, kb_table_shapes())
        return found
    finally:
        conn.close()


# The columns and constraints of kb's tables, as DuckDB describes them.
COLUMNS_QUERY = ("SELECT table_name, column_name, data_type, column_default, is_generated FROM duckdb_columns() "
                 "WHERE database_name = current_database() AND schema_name = 'main' ORDER BY table_name, column_index")
CONSTRAINTS_QUERY = ("SELECT table_name, constraint_type, constraint_text, constraint_column_names "
                     "FROM duckdb_constraints() WHERE database_name = current_database() AND schema_name = 'main' "
                     "ORDER BY table_name, constraint_index")
_SHAPES: dict[str, set] = {}


def kb_table_shapes() -> dict[str, set]:
    """The columns (name, type, default, generated) and the constraints of
    each kb table, read from an empty in-memory store made by the CREATE
    TABLE statements of kb/store/duckdb_schema.py: one copy of the schema."""
    if not _SHAPES:
        conn = duckdb.connect(config=DUCKDB_DATA_ONLY)
        try:
            for statement in TABLES.values():
                conn.execute(statement)
            _SHAPES["columns"] = {tuple(row) for row in conn.execute(COLUMNS_QUERY).fetchall()}
            _SHAPES["constraints"] = {_constraint(row) for row in conn.execute(CONSTRAINTS_QUERY).fetchall()}
        finally:
            conn.close()
    return _SHAPES


def _constraint(row: tuple) -> tuple:
    table, kind, text, columns = row
    return table, kind, text, tuple(columns or ())


def foreign_columns(conn: duckdb.DuckDBPyConnection, shapes: dict[str, set]) -> list[str]:
    """The columns and constraints of the file's kb tables that kb's schema
    does not make. A column that kb's schema has and the file lacks is no
    problem: it comes from a later migration, which kb applies."""
    found = []
    for table, column, data_type, default, generated in conn.execute(COLUMNS_QUERY).fetchall():
        if table not in TABLES or (table, column, data_type, default, generated) in shapes["columns"]:
            continue
        what = "generated" if generated else f"DEFAULT {default}" if default is not None else data_type
        found.append(f"column {f'{table}.{column}'!r} ({what[:80]})")
    for row in conn.execute(CONSTRAINTS_QUERY).fetchall():
        constraint = _constraint(row)
        if constraint[0] in TABLES and constraint not in shapes["constraints"]:
            found.append(f"constraint {constraint[1]} on {constraint[0]!r} ({str(constraint[2])[:80]})")
    return found


class CheckedTarInfo(tarfile.TarInfo):
    """A tar header that the restore reads (tarfile.open(tarinfo=...)): each
    header is checked when it is read, before tarfile acts on its size."""

    @classmethod
    def frombuf(cls, buf, encoding, errors):
        info = super().frombuf(buf, encoding, errors)
        # A negative size (base-256) sends Python's tarfile (3.11.7) back to
        # the same header for ever, with its memory growing (CVE-2025-8194).
        if info.size < 0:
            raise tarfile.TarError(f"a header declares a negative size ({info.size})")
        if info.type in META_TYPES and info.size > MAX_META_BYTES:
            raise tarfile.TarError(f"a header declares {info.size:,} bytes of meta data (pax header or long "
                                   f"name); a kb backup has at most {MAX_META_BYTES:,}")
        return info


def member_bytes(member: tarfile.TarInfo) -> int:
    """What a member costs against the size limit: its data, and one block
    for its entry (archive._extract counts the same while it writes)."""
    return (member.size if member.isfile() else 0) + MEMBER_BYTES


def check_members(members: list[tarfile.TarInfo], archive: Path) -> None:
    """Plain files and folders with plain relative paths only, under one top
    folder, each in one of the parts that a kb backup writes."""
    tops = set()
    for member in members:
        if not (member.isfile() or member.isdir()):
            raise BackupError(f"{archive} is refused: the member {member.name!r} is a link or a special file. "
                              "A kb backup holds plain files and folders only; nothing was restored.")
        problem = unsafe_path(member.name)
        if problem:
            raise BackupError(f"{archive} is refused: the member {member.name!r} {problem}; nothing was restored.")
        parts = member.name.rstrip("/").split("/")
        tops.add(parts[0])
        if len(parts) > 1 and parts[1] not in ARCHIVE_PARTS:
            raise BackupError(f"{archive} is refused: the member {member.name!r} is not a part of a kb backup "
                              f"(a kb backup holds {', '.join(sorted(ARCHIVE_PARTS))}); nothing was restored.")
    if len(tops) > 1:
        raise BackupError(f"{archive} is refused: its members are in {len(tops)} top folders; a kb backup has one. "
                          "Nothing was restored.")


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
    for name, facts in files.items():
        if why := unsafe_path(name):
            problems.append(f"files: {name!r} {why}")
        elif not (isinstance(facts, dict) and isinstance(facts.get("sha256"), str)
                  and SHA256.fullmatch(facts["sha256"])):
            problems.append(f"files: {name!r} has no SHA-256")
    problems += count_problems(manifest.get("counts", {}))
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
        if "branch" not in wiki:
            problems.append("wiki branch: missing")
        elif branch is not None and not plain_branch(branch):
            problems.append(f"wiki branch: {str(branch)[:80]!r} is not a plain branch name")
    if problems:
        raise BackupError(f"{archive} is refused: its {MANIFEST} names what a restore must not touch; nothing "
                          f"was restored. {len(problems)} problem(s), for example: " + "; ".join(problems[:5]))


def count_problems(counts) -> list[str]:
    """The counts that the restore compares with the restored stores
    (archive._verify_restored): numbers, in the shapes that create_backup writes."""
    if not isinstance(counts, dict):
        return ["`counts` is not a mapping"]
    problems = []
    duckdb_rows = counts.get("duckdb", {})
    if not (isinstance(duckdb_rows, dict) and all(isinstance(n, int) for n in duckdb_rows.values())):
        problems.append("counts: `duckdb` is not a mapping of tables to numbers")
    tables = counts.get("lancedb", {})
    if not (isinstance(tables, dict) and all(isinstance(t, dict) and isinstance(t.get("rows"), int)
                                             for t in tables.values())):
        problems.append("counts: `lancedb` is not a mapping of tables to their rows")
    return problems


def plain_branch(name) -> bool:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}", name):
        return False
    return ".." not in name and not name.endswith((".lock", "/", ".")) and "//" not in name


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
                          f"({'; '.join(foreign[:5])}). A kb store holds kb's tables in schema main, with kb's "
                          "columns only. Nothing was restored.")


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


def is_sqlite_file(path: Path) -> bool:
    """A SQLite database by its name and its kind: the name ends in `.db`
    (Dagster names the event log of the runless events `history/runs/.db`:
    its suffix is empty to pathlib, so the name is read, not the suffix),
    and the file starts with SQLite's header."""
    if not path.name.endswith(".db"):
        return False
    with path.open("rb") as fh:
        return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def check_dagster_home(folder: Path, archive: Path) -> None:
    """The archive's dagster/ holds what the backup writes there and nothing
    else: SQLite databases of tables and indexes. A dagster.yaml (archives of
    kb before issue 56 hold one) may be there: the restore never uses it."""
    if not folder.is_dir():
        return
    problems = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = f"dagster/{path.relative_to(folder)}"
        if path == folder / DAGSTER_YAML:
            continue
        if not is_sqlite_file(path):
            problems.append(f"{name} is not a SQLite database (a file named *.db with the SQLite header)")
            continue
        try:
            problems += [f"{name} holds a {found}" for found in sqlite_foreign_objects(path)]
        except sqlite3.Error as exc:
            problems.append(f"{name} does not open as SQLite ({exc})")
    if problems:
        raise BackupError(f"{archive} is refused: its Dagster home holds what a kb backup does not hold "
                          f"({'; '.join(problems[:5])}). Nothing was restored.")


# --- the wiki bundle --------------------------------------------------------------------


def _git_bytes(repo: Path, *args: str, input: bytes | None = None) -> bytes:
    proc = subprocess.run(git_command(*args), cwd=repo, input=input, capture_output=True, env=git_env(), timeout=600)
    if proc.returncode != 0:
        raise BackupError(f"git {args[0]} failed in {repo}: {proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout


def _trees(repo: Path) -> Iterator[tuple[str, list[tuple[bytes, str, str]]]]:
    """Each tree object of the repository: (its id, [(mode, name, child id)]),
    read from git's raw format (`<mode> <name>\\0<id bytes>` per entry)."""
    listing = _git_bytes(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype) %(objectname)")
    ids = [line.split()[1] for line in listing.splitlines() if line.startswith(b"tree ")]
    if not ids:
        return
    out = _git_bytes(repo, "cat-file", "--batch", input=b"\n".join(ids) + b"\n")
    at = 0
    while at < len(out):
        header_end = out.index(b"\n", at)
        tree_id, _, size = out[at:header_end].split()
        body = out[header_end + 1: header_end + 1 + int(size)]
        at = header_end + 1 + int(size) + 1
        id_bytes = len(tree_id) // 2  # 20 for SHA-1, 32 for SHA-256
        entries, pos = [], 0
        while pos < len(body):
            space = body.index(b" ", pos)
            nul = body.index(b"\0", space)
            entries.append((body[pos:space], body[space + 1:nul].decode(errors="replace"),
                            body[nul + 1:nul + 1 + id_bytes].hex()))
            pos = nul + 1 + id_bytes
        yield tree_id.decode(), entries


def wiki_tree_problems(repo: Path) -> list[str]:
    """The entries of any tree in the repository (every commit of every
    branch, and loose trees too) that are not a plain file or folder, each
    named by its path: `raw (mode 120000)`."""
    parent: dict[str, tuple[str, str]] = {}  # tree id -> (the tree that holds it, its name there)
    bad: list[tuple[str, str, bytes]] = []
    for tree_id, entries in _trees(repo):
        for mode, name, child in entries:
            if mode == b"40000":
                parent.setdefault(child, (tree_id, name))
            if mode not in WIKI_TREE_MODES:
                bad.append((tree_id, name, mode))
    problems = []
    for tree_id, name, mode in bad:
        parts, seen = [name], {tree_id}
        while tree_id in parent and parent[tree_id][0] not in seen:
            tree_id, folder = parent[tree_id]
            seen.add(tree_id)
            parts.insert(0, folder)
        problems.append(f"{'/'.join(parts)} (mode {mode.decode(errors='replace')})")
    return sorted(set(problems))


def check_wiki_trees(repo: Path, archive: Path) -> None:
    """Call after the fetch of the bundle and before the checkout: a
    symbolic link in a restored commit would lead the checkout, and each
    later write of kb (Wiki.ensure, the parsed files), out of the wiki."""
    problems = wiki_tree_problems(repo)
    if problems:
        raise BackupError(f"{archive} is refused: its wiki bundle holds what a kb wiki does not hold: "
                          f"{'; '.join(problems[:5])}. kb's wiki holds plain files and folders only (no "
                          "symbolic link, no submodule). Nothing was restored.")


# --- the size of an archive ---------------------------------------------------------------


def check_unpacked_size(declared: int, limit: int, folder: Path, archive: Path) -> None:
    """Before the restore unpacks: the sum of the sizes that the members
    declare must not pass the limit (KB_RESTORE_MAX_GB), nor the free disk
    of `folder` (the restore unpacks into KB_HOME)."""
    if declared > limit:
        raise BackupError(f"{archive} is refused: it unpacks to {declared:,} bytes, more than the limit of "
                          f"{limit:,} bytes (KB_RESTORE_MAX_GB). Set a larger KB_RESTORE_MAX_GB if you trust the "
                          "archive. Nothing was restored.")
    free = shutil.disk_usage(folder).free
    if declared > free:
        raise BackupError(f"{archive} is refused: it unpacks to {declared:,} bytes, and {folder} has "
                          f"{free:,} bytes free. Make room first. Nothing was restored.")
