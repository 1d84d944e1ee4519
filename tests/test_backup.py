"""`kb backup` and `kb restore` end to end: a real store (the sample import
with the hash embedder, a git wiki with a commit, an inbox item, the Dagster
home) goes into one archive and comes back in a new KB_HOME, where the same
searches give the same hits in the same order."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import dagster as dg
import pytest

from kb.apps.backup import BackupError, create_backup, restore_backup
from kb.sample_data import DEMO_QUERIES, sample_pages
from kb.settings import get_settings
from kb.wiki_repo import Wiki

PAGE = "wiki/concepts/write-ahead-logging.md"
PARSED = "raw/parsed/text/wal-note-0001.md"
QUERIES = [q.query for q in DEMO_QUERIES] + ["bread"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def searches() -> dict[str, list[tuple]]:
    from kb.search import search

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
    assert wiki["uncommitted_files"] == ["index.md"]
    with tarfile.open(archive) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    top = archive.name.removesuffix(".tar.gz")
    assert names == set(manifest["files"]) | {"manifest.json"}
    assert {"kb.duckdb", "wiki.bundle", f"wiki-raw/{PARSED.removeprefix('raw/')}", "wiki-worktree/index.md",
            "dagster/history/runs.db"} <= names
    assert not any(n.startswith("dagster/storage/") for n in names)  # compute logs are left out
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
    assert git(wiki, "status", "--porcelain") == " M index.md\n"
    # The Dagster home came along: the batches and the inbox item's partition are known.
    instance = dg.DagsterInstance.get()
    assert sorted(instance.get_dynamic_partitions("sync_batches")) == before["batches"]
    assert (home / "inbox").is_dir() and list((home / "inbox" / "items").glob(f"*{store['item']}*.json"))


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

    instance = dg.DagsterInstance.from_config(str(ensure_dagster_home()))
    live = instance.add_run(dg.DagsterRun(job_name="source_intake", status=dg.DagsterRunStatus.STARTED,
                                          tags={"kb/pid": str(os.getppid())}))
    dead = instance.add_run(dg.DagsterRun(job_name="source_intake", status=dg.DagsterRunStatus.STARTED,
                                          tags={"kb/pid": "999999999"}))
    with pytest.raises(BackupError, match=f"A run is in progress .*: source_intake {live.run_id} \\(STARTED\\)"):
        create_backup(kb_home.parent / "backups")
    assert not (kb_home.parent / "backups").exists() or not any((kb_home.parent / "backups").iterdir())

    # Once the live run has ended, the backup starts: the run whose process is
    # gone stays STARTED, and it does not block a backup.
    instance.report_run_failed(live)
    result = create_backup(kb_home.parent / "backups")
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.STARTED
    assert result.manifest["parts"] == ["dagster"] and result.archive.is_file()
