"""`kb backup` and `kb restore` end to end: a real store (the sample import
with the hash embedder, a git wiki with a commit, an inbox item, the Dagster
home) goes into one archive and comes back in a new KB_HOME, where the same
searches give the same hits in the same order."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

import dagster as dg
import pytest

from kb.apps.backup import BackupError, create_backup, move, restore_backup, sha256_file
from kb.sample_data import DEMO_QUERIES, sample_pages
from kb.settings import get_settings
from kb.wiki.repo import Wiki

pytestmark = pytest.mark.slow  # slow: a sync, sensors and source runs

PAGE = "wiki/concepts/write-ahead-logging.md"
PARSED = "raw/parsed/text/wal-note-0001.md"
QUERIES = [q.query for q in DEMO_QUERIES] + ["bread"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def searches() -> dict[str, list[tuple]]:
    from kb.index.search import search

    return {q: [(h.tweet_id, round(h.score, 6), h.best_chunk) for h in search(q, limit=5).hits] for q in QUERIES}


def point_at(monkeypatch, home: Path) -> None:
    monkeypatch.setenv("KB_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One real store for the module: built once (it takes a sync), backed up once."""
    from kb.apps.sync import run_sync
    from tests import source_helpers as h

    base = tmp_path_factory.mktemp("backup")
    home = base / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        point_at(mp, home)
        mp.setenv("KB_CONFIG_FILE", str(base / "config.toml"))
        mp.setenv("KB_X_STATE", str(base / "state.json"))
        mp.setenv("KB_EMBED_BACKEND", "hash")
        mp.setenv("KB_EXCLUDE", "link")
        report = run_sync(files=[str(p) for p in sample_pages()])
        assert report.failed == []
        item = h.add_item("text", 1, text="A note that waits in the inbox.")
        wiki = Wiki.from_settings()
        root = wiki.ensure()
        (root / PAGE).write_text("---\ntype: concept\n---\n# Write-ahead logging\nThe log comes first.\n")
        wiki.commit_all("ingest: write-ahead logging")
        (root / PARSED).parent.mkdir(parents=True, exist_ok=True)
        (root / PARSED).write_text("---\ntitle: WAL note\n---\nThe log comes first.\n")  # git ignores raw/
        (root / "index.md").write_text((root / "index.md").read_text() + "\n- an edit not committed yet\n")
        before = {
            "searches": searches(),
            "wiki_log": git(root, "log", "--all", "--format=%H %P %s"),
            "index_md": (root / "index.md").read_text(),
            "batches": sorted(dg.DagsterInstance.get().get_dynamic_partitions("sync_batches")),
        }
        result = create_backup(base / "backups")
        yield {"base": base, "home": home, "archive": result.archive, "manifest": result.manifest,
               "before": before, "item": item.id}


def test_the_archive_holds_every_part_with_a_manifest(store):
    manifest = store["manifest"]
    archive = store["archive"]
    assert archive.name.startswith("kb-backup-") and archive.name.endswith(".tar.gz")
    assert manifest["parts"] == ["duckdb", "lancedb", "wiki", "raw", "inbox", "dagster"]
    assert manifest["counts"]["duckdb"]["bookmarks"] == 39
    assert manifest["counts"]["lancedb"]["chunks"]["rows"] > 39
    assert manifest["counts"]["lancedb"]["bookmarks"]["rows"] == 39
    assert {"kb", "python", "duckdb", "lancedb", "dagster", "git", "duckdb_schema"} <= set(manifest["versions"])
    wiki = manifest["wiki"]
    assert (wiki["branch"], wiki["commits"], wiki["raw_files"]) == ("main", 2, 1)
    # The parsed file goes into git with its ingest; until then it is an untracked file.
    assert wiki["uncommitted_files"] == ["index.md", PARSED]
    with tarfile.open(archive) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    top = archive.name.removesuffix(".tar.gz")
    assert names == set(manifest["files"]) | {"manifest.json"}
    assert {"kb.duckdb", "wiki.bundle", f"wiki-raw/{PARSED.removeprefix('raw/')}", "wiki-worktree/index.md",
            "dagster/history/runs.db"} <= names
    assert not any(n.startswith("dagster/storage/") for n in names)  # compute logs are left out
    assert "dagster/dagster.yaml" not in names  # the restore writes kb's own
    assert any(n.startswith("raw/x/") for n in names) and any(n.startswith("inbox/items/") for n in names)
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    assert top.startswith("kb-backup-")


def test_a_restored_home_answers_the_same_searches(store, tmp_path, monkeypatch):
    home = tmp_path / "restored"
    point_at(monkeypatch, home)
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")

    result = restore_backup(store["archive"])

    assert result.home == home and result.checked_files == len(store["manifest"]["files"])
    assert result.moved_aside is None
    before = store["before"]
    after = searches()
    assert all(after[q] for q in QUERIES)  # the searches find something: the test can fail
    assert after == before["searches"]  # same hits, same order, same scores
    wiki = get_settings().wiki_dir
    assert git(wiki, "log", "--all", "--format=%H %P %s") == before["wiki_log"]
    assert git(wiki, "remote") == ""
    assert (wiki / PARSED).read_text() == "---\ntitle: WAL note\n---\nThe log comes first.\n"
    assert (wiki / "index.md").read_text() == before["index_md"]  # the edit not committed is back
    assert git(wiki, "status", "--porcelain") == " M index.md\n?? raw/\n"
    # The Dagster home came along: the batches and the inbox item's partition are known.
    instance = dg.DagsterInstance.get()
    assert sorted(instance.get_dynamic_partitions("sync_batches")) == before["batches"]
    assert (home / "inbox").is_dir() and list((home / "inbox" / "items").glob(f"*{store['item']}*.json"))


def test_the_backup_schedule_keeps_the_newest_archives_and_the_newest_restores_every_part(store, tmp_path,
                                                                                            monkeypatch):
    """What the daemon does each night: the schedule's run request, run by
    Dagster. Three nights with KB_BACKUP_KEEP=2: the oldest archive goes,
    an archive that the owner named stays, `kb status` names the newest,
    and the newest restores into an empty KB_HOME with every part."""
    from datetime import datetime, timezone

    from kb.apps.status import collect_status, format_status
    from kb_assets.backups import backup_job
    from sensors.backup_schedule import build_backup_schedule

    point_at(monkeypatch, store["home"])
    folder = tmp_path / "scheduled"
    monkeypatch.setenv("KB_BACKUP_DIR", str(folder))
    monkeypatch.setenv("KB_BACKUP_KEEP", "2")
    folder.mkdir()
    (folder / "kb-backup-mine.tar.gz").write_bytes(b"an archive that the owner named")
    assert collect_status()["backups"]["last"] is None
    instance = dg.DagsterInstance.get()
    names = []
    for day in (1, 2, 3):
        tick = datetime(2026, 12, day, 3, 30, tzinfo=timezone.utc)
        request = build_backup_schedule(get_settings())(dg.build_schedule_context(instance=instance, scheduled_execution_time=tick))
        result = backup_job.execute_in_process(run_config=request.run_config, instance=instance, tags=request.tags)
        assert result.success  # its own run is in progress: the backup does not wait for it
        names.append(request.run_key)
    assert names[0] == "kb-backup-20261201T033000Z.tar.gz"
    assert sorted(p.name for p in folder.iterdir()) == sorted([*names[1:], "kb-backup-mine.tar.gz"])

    newest = folder / names[-1]
    backups = collect_status()["backups"]
    assert backups == {"folder": str(folder), "last": names[-1], "bytes": newest.stat().st_size, "kept": 2}
    assert f"backup   last {names[-1]} ({newest.stat().st_size / 1e6:.1f} MB), 2 kept in {folder}" in \
        format_status(collect_status())

    home = tmp_path / "restored"
    point_at(monkeypatch, home)
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    result = restore_backup(newest)
    assert result.manifest["parts"] == ["duckdb", "lancedb", "wiki", "raw", "inbox", "dagster"]
    assert searches() == store["before"]["searches"]
    assert git(get_settings().wiki_dir, "log", "--all", "--format=%H %P %s") == store["before"]["wiki_log"]
    assert sorted(dg.DagsterInstance.get().get_dynamic_partitions("sync_batches")) == store["before"]["batches"]
    assert list((home / "inbox" / "items").glob(f"*{store['item']}*.json"))
    assert any((home / "raw" / "x").rglob("*.json"))


def test_a_restored_home_is_the_owners_only(store, tmp_path, monkeypatch):
    """The archive's members carry modes such as 0644; the restored home
    has 0700 folders and 0600 files all the same (kb/store/private_files.py)."""
    from tests.private_modes import open_to_others, open_umask

    home = tmp_path / "restored"
    point_at(monkeypatch, home)

    def open_modes(top: Path, manifest: dict) -> None:
        for path in [top, *top.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)

    archive = repacked(store["archive"], tmp_path, open_modes)
    with tarfile.open(archive) as tar:
        assert all(m.mode & 0o044 for m in tar.getmembers())  # the archive gives group and others read
    with open_umask():
        restore_backup(archive)
    assert (home / "kb.duckdb").is_file() and (home / "wiki" / ".git").is_dir()
    assert open_to_others(home) == []


def test_the_first_kb_up_of_a_restored_home_starts_whatever_heartbeats_the_archive_holds(store, tmp_path,
                                                                                         monkeypatch):
    """A backup of a home whose kb up ran holds its daemon's heartbeats. That
    daemon does not run for the restored home: its first kb up must start
    (issue 55's month: "A Dagster daemon already runs for this KB_HOME")."""
    import time

    from dagster._daemon.types import DaemonHeartbeat

    from kb.apps.up import check_no_daemon, daemon_heartbeat

    home = tmp_path / "restored"
    point_at(monkeypatch, home)
    restore_backup(store["archive"])
    dagster_home = home / "dagster"
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        # A heartbeat of the old home's daemon, from just before the restore.
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - 5, "SENSOR", "daemon-of-the-old-home", []))
    assert daemon_heartbeat(dagster_home) is None
    check_no_daemon(dagster_home)  # no error: kb up starts


def test_restore_refuses_a_home_that_is_not_empty(store, tmp_path, monkeypatch):
    home = tmp_path / "busy"
    home.mkdir()
    (home / "kb.duckdb").write_bytes(b"the owner's data")
    point_at(monkeypatch, home)

    with pytest.raises(BackupError, match=r"is not empty \(kb.duckdb\).*--force"):
        restore_backup(store["archive"])
    assert sorted(p.name for p in home.iterdir()) == ["kb.duckdb"]

    result = restore_backup(store["archive"], force=True)
    assert result.moved_aside is not None and (result.moved_aside / "kb.duckdb").read_bytes() == b"the owner's data"
    assert get_settings().duckdb_path.stat().st_size > 1000


def test_a_damaged_archive_restores_nothing(store, tmp_path, monkeypatch):
    # Change one byte of one file inside the archive, and pack it again.
    unpacked = tmp_path / "unpacked"
    with tarfile.open(store["archive"]) as tar:
        tar.extractall(unpacked, filter="data")
    [top] = list(unpacked.iterdir())
    bundle = top / "wiki.bundle"
    data = bytearray(bundle.read_bytes())
    data[-1] ^= 0xFF
    bundle.write_bytes(bytes(data))
    damaged = tmp_path / "damaged.tar.gz"
    with tarfile.open(damaged, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    home = tmp_path / "empty"
    point_at(monkeypatch, home)

    with pytest.raises(BackupError, match="is damaged; nothing was restored.*wiki.bundle: checksum differs"):
        restore_backup(damaged)
    assert not home.exists() or not any(home.iterdir())

    with pytest.raises(BackupError, match="not a readable kb backup"):
        restore_backup(store["manifest"] and _not_an_archive(tmp_path))


def _not_an_archive(tmp_path: Path) -> Path:
    path = tmp_path / "notes.tar.gz"
    path.write_text("just text")
    return path


def test_backup_refuses_to_overwrite_or_to_write_into_kb_home(store, monkeypatch):
    point_at(monkeypatch, store["home"])
    with pytest.raises(BackupError, match="exists already"):
        create_backup(store["archive"])
    with pytest.raises(BackupError, match="inside KB_HOME"):
        create_backup(store["home"] / "backups")


def test_backup_waits_for_no_run(kb_home):
    """A run whose process lives may write: the backup does not start."""
    from kb_assets.instance_config import ensure_dagster_home
    from kb_resources.run_worker import worker_tags

    instance = dg.DagsterInstance.from_config(str(ensure_dagster_home()))
    live = instance.add_run(dg.DagsterRun(job_name="source_intake", status=dg.DagsterRunStatus.STARTED,
                                          tags={"kb/pid": str(os.getppid()), **worker_tags()}))
    dead = instance.add_run(dg.DagsterRun(job_name="source_intake", status=dg.DagsterRunStatus.STARTED,
                                          tags={"kb/pid": "999999999", **worker_tags()}))
    with pytest.raises(BackupError, match=f"A run is in progress .*: source_intake {live.run_id} \\(STARTED\\)"):
        create_backup(kb_home.parent / "backups")
    assert not (kb_home.parent / "backups").exists() or not any((kb_home.parent / "backups").iterdir())

    # Once the live run has ended, the backup starts: the run whose process is
    # gone stays STARTED, and it does not block a backup.
    instance.report_run_failed(live)
    result = create_backup(kb_home.parent / "backups")
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.STARTED
    assert result.manifest["parts"] == ["dagster"] and result.archive.is_file()


# --- a hostile archive ------------------------------------------------------------------------
# Each archive below is repacked from the real one with a correct manifest
# (every checksum matches), so only the new checks can stop it.


def repacked(archive: Path, folder: Path, edit=None, members=()) -> Path:
    """The archive with `edit(top, manifest)` applied, checksums made anew,
    and extra tar `members` ((TarInfo, bytes or None), ...) added."""
    unpacked = folder / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    [top] = list(unpacked.iterdir())
    manifest = json.loads((top / "manifest.json").read_text())
    if edit:
        edit(top, manifest)
    manifest["files"] = {str(p.relative_to(top)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                         for p in sorted(top.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (top / "manifest.json").write_text(json.dumps(manifest))
    out = folder / "hostile.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(top, arcname=top.name)
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def member(name: str, data: bytes = b"", **attributes) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attributes.items():
        setattr(info, key, value)
    return info, (data if info.isfile() else None)


def top_of(archive: Path) -> str:
    return archive.name.removesuffix(".tar.gz")


@pytest.fixture
def target_home(tmp_path, monkeypatch):
    """An empty KB_HOME, with a file beside it that an attack wants to reach."""
    home = tmp_path / "home"
    point_at(monkeypatch, home)
    victim = tmp_path / "victim.txt"
    victim.write_text("the owner's file outside KB_HOME")
    return home, victim


def assert_nothing_restored(home: Path, victim: Path) -> None:
    assert victim.read_text() == "the owner's file outside KB_HOME"
    assert not home.exists() or [p.name for p in home.iterdir()] == []


@pytest.mark.parametrize("name, why", [
    ("{top}/../../victim.txt", "has an empty, `.` or `..` part"),
    ("/tmp/kb-restore-absolute-victim.txt", "is an absolute path"),
    ("{top}/wiki-worktree/.git/hooks/post-commit", r"is under .git \(git hooks and config run code\)"),
    ("{top}/wiki-worktree/sub/.GIT/config", r"is under .git \(git hooks and config run code\)"),
])
def test_restore_refuses_a_member_with_a_path_it_must_not_write(store, tmp_path, target_home, name, why):
    home, victim = target_home
    name = name.format(top=top_of(store["archive"]))
    hostile = repacked(store["archive"], tmp_path, members=[member(name, b"#!/bin/sh\ntouch /tmp/pwned\n")])
    with pytest.raises(BackupError, match=f"the member {re.escape(repr(name))} {why}; nothing was restored"):
        restore_backup(hostile)
    assert_nothing_restored(home, victim)
    assert not Path("/tmp/kb-restore-absolute-victim.txt").exists()


def test_restore_refuses_a_link_in_the_archive(store, tmp_path, target_home):
    home, victim = target_home
    name = f"{top_of(store['archive'])}/wiki-worktree/notes.md"
    link = member(name, type=tarfile.SYMTYPE, linkname=str(victim))
    hard = member(f"{top_of(store['archive'])}/raw/copy", type=tarfile.LNKTYPE, linkname=str(victim))
    for extra in (link, hard):
        with pytest.raises(BackupError, match="is a link or a special file"):
            restore_backup(repacked(store["archive"], tmp_path / extra[0].name.rsplit("/", 1)[1], members=[extra]))
        assert_nothing_restored(home, victim)


def test_restore_refuses_a_git_hook_in_the_uncommitted_files(store, tmp_path, target_home):
    home, victim = target_home

    def plant_hook(top: Path, manifest: dict) -> None:
        hook = top / "wiki-worktree" / ".git" / "hooks" / "post-commit"
        hook.parent.mkdir(parents=True)
        hook.write_text(f"#!/bin/sh\necho pwned > {victim}\n")
        manifest["wiki"]["uncommitted_files"].append(".git/hooks/post-commit")

    with pytest.raises(BackupError, match="is under .git"):
        restore_backup(repacked(store["archive"], tmp_path, plant_hook))
    assert_nothing_restored(home, victim)


@pytest.mark.parametrize("key, value, why", [
    ("uncommitted_deletions", ["../../victim.txt"], "has an empty, `.` or `..` part"),
    ("uncommitted_deletions", [None], "is not a plain path"),
    ("uncommitted_files", ["/etc/passwd"], "is an absolute path"),
    ("head", "--upload-pack=touch /tmp/pwned", "is not a commit id"),
    ("change_in_progress", "HEAD~1; rm -rf ~", "is not a commit id"),
    ("branch", "--orphan", "is not a plain branch name"),
])
def test_restore_refuses_a_manifest_path_or_id_that_is_not_plain(store, tmp_path, target_home, key, value, why):
    home, victim = target_home

    def edit(top: Path, manifest: dict) -> None:
        manifest["wiki"][key] = value

    with pytest.raises(BackupError, match=f"wiki {key}: .*{re.escape(why)}"):
        restore_backup(repacked(store["archive"], tmp_path, edit))
    assert_nothing_restored(home, victim)


def forge_duckdb(sql: str, name: str | None = None):
    """An edit for repacked(): run `sql` (may use {q}, the quoted `name`)
    on the archive's kb.duckdb, with real DuckDB, and list the new table in
    the manifest's counts so that the counts match."""
    import duckdb

    def edit(top: Path, manifest: dict) -> None:
        quoted = '"' + name.replace('"', '""') + '"' if name else ""
        with duckdb.connect(str(top / "kb.duckdb")) as conn:
            conn.execute(sql.format(q=quoted))
        if name:
            manifest["counts"]["duckdb"][name] = 0

    return edit


def test_restore_refuses_a_table_name_that_holds_sql_and_writes_no_file(store, tmp_path, monkeypatch):
    """The table name closes the quote of `SELECT count(*) FROM "..."` and
    adds a COPY that writes a .pth file (code at the next Python start).
    The restore must read the name as data, refuse the file by name, write
    nothing and leave KB_HOME as it was."""
    home = tmp_path / "busy"
    home.mkdir()
    (home / "kb.duckdb").write_bytes(b"the owner's data")
    point_at(monkeypatch, home)
    planted = tmp_path / "kb_pwned.pth"
    name = f"bookmarks\"; COPY (SELECT 'import os') TO '{planted}' (FORMAT csv, HEADER false); --"
    hostile = repacked(store["archive"], tmp_path, forge_duckdb("CREATE TABLE {q} (x INTEGER)", name))

    with pytest.raises(BackupError, match=f"its member kb.duckdb holds .*table {re.escape(repr('main.' + name))}.*"
                                          "Nothing was restored"):
        restore_backup(hostile, force=True)
    assert not planted.exists()
    assert sorted(p.name for p in home.iterdir()) == ["kb.duckdb"]
    assert (home / "kb.duckdb").read_bytes() == b"the owner's data"


@pytest.mark.parametrize("sql, refused", [
    # A view or a macro is SQL that runs each time kb reads it: here it
    # would read a file of the owner into kb's data.
    ("CREATE VIEW leak AS SELECT * FROM read_text('/etc/hostname')", "view 'main.leak'"),
    ("CREATE MACRO clean(x) AS x", "macro 'main.clean'"),
    ("CREATE SCHEMA extra", "schema 'extra'"),
    ("CREATE TABLE Bookmarks2 (x INTEGER)", "table 'main.Bookmarks2'"),
])
def test_restore_refuses_a_duckdb_file_with_more_than_plain_tables(store, tmp_path, target_home, sql, refused):
    home, victim = target_home
    with pytest.raises(BackupError, match=f"its member kb.duckdb holds .*{re.escape(refused)}"):
        restore_backup(repacked(store["archive"], tmp_path, forge_duckdb(sql)))
    assert_nothing_restored(home, victim)


def test_restore_refuses_a_lance_table_that_reads_files_outside_the_archive(store, tmp_path, target_home):
    """A Lance manifest can name a base path elsewhere (a folder of the
    owner, a bucket): the restore would read it as part of the index."""
    import lance
    import pyarrow as pa

    home, victim = target_home
    outside = tmp_path / "outside"

    def add_table(top: Path, manifest: dict) -> None:
        lance.write_dataset(pa.table({"x": [1]}), str(top / "lancedb" / "extra.lance"),
                            initial_bases=[lance.DatasetBasePath(str(outside), name="elsewhere")],
                            target_bases=["elsewhere"])
        manifest["counts"]["lancedb"]["extra"] = {"rows": 1, "version": 1, "indices": []}

    with pytest.raises(BackupError, match=f"its member lancedb/ reads files outside the archive "
                                          f"\\(extra.lance version 1: base path '{re.escape(str(outside))}'"):
        restore_backup(repacked(store["archive"], tmp_path, add_table))
    assert_nothing_restored(home, victim)


def test_restore_refuses_a_trigger_in_a_dagster_database(store, tmp_path, target_home):
    """A trigger runs its SQL each time Dagster writes: here it would tag
    every new run kb/override, and the quality gate would let it pass."""
    import sqlite3

    home, victim = target_home

    def add_trigger(top: Path, manifest: dict) -> None:
        conn = sqlite3.connect(top / "dagster" / "history" / "runs.db")
        conn.execute("CREATE TRIGGER override AFTER INSERT ON runs BEGIN "
                     "INSERT INTO run_tags (run_id, key, value) VALUES (new.run_id, 'kb/override', 'x'); END")
        conn.commit()
        conn.close()  # the close folds the write-ahead log into runs.db

    with pytest.raises(BackupError, match="its Dagster home holds .*dagster/history/runs.db holds a trigger 'override'"):
        restore_backup(repacked(store["archive"], tmp_path, add_trigger))
    assert_nothing_restored(home, victim)


def test_the_event_log_of_the_empty_run_id_passes_and_a_dot_file_of_other_bytes_does_not(tmp_path):
    """Dagster keeps the events of run id "" in history/runs/.db: a home
    that ran `kb up` has it (issue 55's month). Its suffix is "", so the
    check reads the name. A `.db` that is not SQLite stays refused."""
    import sqlite3

    from kb.backup.archive_checks import check_dagster_home

    runs = tmp_path / "dagster" / "history" / "runs"
    runs.mkdir(parents=True)
    with sqlite3.connect(runs / ".db") as conn:
        conn.execute("CREATE TABLE event_logs (id INTEGER PRIMARY KEY, event TEXT)")
    conn.close()
    check_dagster_home(tmp_path / "dagster", tmp_path / "a.tar.gz")  # no error
    (runs / ".db").write_bytes(b"not SQLite at all, " * 100)
    with pytest.raises(BackupError, match=r"dagster/history/runs/\.db is not a SQLite database"):
        check_dagster_home(tmp_path / "dagster", tmp_path / "a.tar.gz")
    (runs / ".db").unlink()
    (runs / ".dbx").write_bytes(b"x")
    with pytest.raises(BackupError, match=r"dagster/history/runs/\.dbx is not a SQLite database"):
        check_dagster_home(tmp_path / "dagster", tmp_path / "a.tar.gz")


def test_the_counts_of_a_restored_file_read_it_with_external_access_off(tmp_path):
    """The second wall: even a statement that gets into the SQL of a
    count cannot reach a file."""
    import duckdb

    from kb.backup.archive_checks import open_duckdb_as_data

    path = tmp_path / "kb.duckdb"
    duckdb.connect(str(path)).close()
    with open_duckdb_as_data(path) as conn:
        with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
            conn.execute(f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'")
        with pytest.raises(duckdb.Error, match="locked"):
            conn.execute("SET enable_external_access = true")
    assert not (tmp_path / "out.csv").exists()


# --- the old data stays until the new data is complete ------------------------------------------


def test_a_restore_that_does_not_check_out_leaves_the_old_home_in_place(store, tmp_path, monkeypatch):
    home = tmp_path / "busy"
    home.mkdir()
    (home / "kb.duckdb").write_bytes(b"the owner's data")
    point_at(monkeypatch, home)

    def wrong_counts(top: Path, manifest: dict) -> None:
        manifest["counts"]["duckdb"]["bookmarks"] += 1

    with pytest.raises(BackupError, match="DuckDB row counts differ.*Nothing was changed in KB_HOME"):
        restore_backup(repacked(store["archive"], tmp_path, wrong_counts), force=True)
    assert sorted(p.name for p in home.iterdir()) == ["kb.duckdb"]  # not moved aside, no stage left
    assert (home / "kb.duckdb").read_bytes() == b"the owner's data"


def test_move_copies_across_file_systems():
    """A real EXDEV: /dev/shm (tmpfs) and the temp folder (another file system)."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm) as a, tempfile.TemporaryDirectory() as b:
        if os.stat(a).st_dev == os.stat(b).st_dev:
            pytest.skip("/dev/shm and the temp folder are on one file system here")
        with pytest.raises(OSError) as rename_error:
            os.rename(Path(a), Path(b) / "x")
        assert rename_error.value.errno == errno.EXDEV
        source = Path(a) / "lancedb"
        (source / "t.lance").mkdir(parents=True)
        (source / "t.lance" / "data").write_bytes(b"rows")
        (Path(a) / "kb.duckdb").write_bytes(b"db")
        move(source, Path(b) / "lancedb")
        move(Path(a) / "kb.duckdb", Path(b) / "kb.duckdb")
        assert (Path(b) / "lancedb" / "t.lance" / "data").read_bytes() == b"rows"
        assert (Path(b) / "kb.duckdb").read_bytes() == b"db"
        assert not source.exists() and not (Path(a) / "kb.duckdb").exists()
        assert sorted(p.name for p in Path(b).iterdir()) == ["kb.duckdb", "lancedb"]  # no partial left


def _renames_that_cross(monkeypatch, boundary: Path, fail_for: str | None = None):
    """os.rename as on a KB_HOME whose parts sit on other file systems: a
    rename into `boundary` gives EXDEV (or another error for `fail_for`)."""
    real_rename = os.rename

    def rename(source, target):
        source, target = Path(source), Path(target)
        if target.parent == boundary and source.parent != boundary:
            if fail_for and target.name == fail_for:
                raise OSError(errno.ENOSPC, "No space left on device", str(target))
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(target))
        return real_rename(source, target)

    monkeypatch.setattr(os, "rename", rename)


def test_restore_copies_when_rename_gives_exdev(store, tmp_path, monkeypatch):
    home = tmp_path / "mounted"
    home.mkdir()
    (home / "kb.duckdb").write_bytes(b"the owner's data")
    point_at(monkeypatch, home)
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    _renames_that_cross(monkeypatch, home)

    result = restore_backup(store["archive"], force=True)

    assert (result.moved_aside / "kb.duckdb").read_bytes() == b"the owner's data"
    assert sorted(p.name for p in home.iterdir() if not p.name.startswith(".")) == \
        ["dagster", "inbox", "kb.duckdb", "lancedb", "raw", "wiki"]
    assert not [p for p in home.iterdir() if p.name.startswith(".kb-restore-")]
    assert searches() == store["before"]["searches"]


def test_a_move_that_fails_puts_the_old_home_back(store, tmp_path, monkeypatch):
    home = tmp_path / "full"
    (home / "wiki").mkdir(parents=True)
    (home / "kb.duckdb").write_bytes(b"the owner's data")
    (home / "wiki" / "page.md").write_text("the owner's page")
    point_at(monkeypatch, home)
    _renames_that_cross(monkeypatch, home, fail_for="raw")

    with pytest.raises(BackupError, match="could not move raw into place .*KB_HOME is as it was before"):
        restore_backup(store["archive"], force=True)
    assert sorted(p.name for p in home.iterdir()) == ["kb.duckdb", "wiki"]
    assert (home / "kb.duckdb").read_bytes() == b"the owner's data"
    assert (home / "wiki" / "page.md").read_text() == "the owner's page"
