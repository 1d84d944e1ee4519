"""The red team against `kb restore` (issue 56, "an archive is data"):
anyone can forge an archive and send it to the owner. Each test plays one
attack with a real archive of a small real home (a DuckDB store of kb's
schema, a git wiki, an inbox item, a Dagster home), repacked with a correct
manifest, so that only the guard under test can stop it. Each guard also
lets the honest archive through (the base archive restores in each test
that edits it and in test_the_base_archive_restores).

tests/test_backup.py has the end-to-end restore of a synced home and the
older attacks (links, `..`, .git paths, views, macros, triggers, Lance base
paths); tests/test_up.py restores the backups of a home after `kb up`."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from kb.apps.backup import BackupError, create_backup, restore_backup
from kb.settings import get_settings
from kb.wiki.repo import Wiki
from tests.test_backup import git, point_at, repacked

REPO = Path(__file__).resolve().parents[1]
CANARY = "CANARY-archive-settings-file-0056"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small real home and its archive, made once for the module."""
    from kb.store.duckdb_store import DuckDBStore, ensure_schema
    from kb_assets.instance_config import ensure_dagster_home
    from tests import source_helpers as h

    folder = tmp_path_factory.mktemp("archive-attacks")
    home = folder / "home"
    home.mkdir(mode=0o700)
    (folder / ".env").write_text("")
    with pytest.MonkeyPatch.context() as mp:
        point_at(mp, home)
        mp.setenv("KB_ENV_FILE", str(folder / ".env"))
        mp.setenv("KB_CONFIG_FILE", str(folder / "config.toml"))
        mp.setenv("KB_X_STATE", str(folder / "state.json"))
        with DuckDBStore.from_settings().transaction() as conn:
            ensure_schema(conn)
        Wiki.from_settings().ensure()
        item = h.add_item("text", 1, text="A note that waits in the inbox.")
        with dg.DagsterInstance.from_config(str(ensure_dagster_home())) as instance:
            instance.add_dynamic_partitions("sources", [item.id])
        archive = create_backup(folder / "backups").archive
    return {"folder": folder, "archive": archive, "item": item}


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    home = tmp_path / "restored"
    point_at(monkeypatch, home)
    return home


def assert_empty(home: Path) -> None:
    assert not home.exists() or [p.name for p in home.iterdir()] == []


def test_the_base_archive_restores(base, empty_home):
    """The honest path: every guard below lets kb's own archive through."""
    result = restore_backup(base["archive"])
    assert result.manifest["parts"] == ["duckdb", "wiki", "inbox", "dagster"]
    assert result.notes == []  # a new archive holds no dagster.yaml
    assert (empty_home / "kb.duckdb").is_file() and (empty_home / "wiki" / ".git").is_dir()


# --- 1. dagster.yaml: kb writes its own ---------------------------------------------------

FORGED_YAML = {
    # Python's logging config follows attributes: this factory is os.system.
    "python_logs": "python_logs:\n  dagster_handler_config:\n    handlers:\n      h:\n"
                   "        '()': dagster._core.log_manager.logging.os.system\n        command: touch {marker}\n",
    "run_launcher": "run_launcher:\n  module: os\n  class: system\n",
    "storage": "storage:\n  sqlite:\n    base_dir: {marker}\n",
}


@pytest.mark.parametrize("section", [pytest.param("python_logs", marks=pytest.mark.slow),  # slow: a kb import
                                     "run_launcher", "storage"])
def test_a_restore_writes_its_own_dagster_yaml(base, empty_home, tmp_path, section):
    marker = tmp_path / "command-ran"

    def forge(top: Path, manifest: dict) -> None:
        (top / "dagster" / "dagster.yaml").write_text(FORGED_YAML[section].format(marker=marker))

    result = restore_backup(repacked(base["archive"], tmp_path, forge))
    assert result.notes == ["kb wrote its own dagster.yaml; the archive's file was not used (docs/security.md). "
                            "If you edited yours by hand, edit the new file again."]

    if section == "python_logs":
        # The attack of issue 56: `kb restore`, then one `kb import`, ran the command.
        from kb.sample_data import sample_pages

        env = {**os.environ, "KB_EMBED_BACKEND": "hash", "KB_EXCLUDE": "link"}
        proc = subprocess.run([sys.executable, "-m", "kb.apps.cli", "import", str(sample_pages()[0])], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
        assert not marker.exists(), "the archive's logging handler ran a command"
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    from kb_assets.instance_config import dagster_yaml

    written = (empty_home / "dagster" / "dagster.yaml").read_text()
    assert written == dagster_yaml(get_settings())
    assert str(marker) not in written and "python_logs" not in written


# --- 2. the wiki bundle holds no symbolic link ----------------------------------------------


def _with_link(tmp_path: Path, link: str, target: Path):
    """An edit for repacked(): a new commit in the bundle with `link` as a
    symbolic link to `target`."""

    def edit(top: Path, manifest: dict) -> None:
        repo = tmp_path / "forged-wiki"
        subprocess.run(["git", "clone", "-q", str(top / "wiki.bundle"), str(repo)], check=True)
        git(repo, "config", "user.email", "a@b"), git(repo, "config", "user.name", "a")
        (repo / link).parent.mkdir(parents=True, exist_ok=True)
        if (repo / link).is_dir():
            shutil.rmtree(repo / link)
        (repo / link).symlink_to(target)
        (repo / ".gitignore").write_text("")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "a link")
        (top / "wiki.bundle").unlink()
        git(repo, "bundle", "create", str(top / "wiki.bundle"), "--all")
        manifest["wiki"]["head"] = git(repo, "rev-parse", "HEAD").strip()

    return edit


@pytest.mark.parametrize("link", ["raw", "wiki/concepts/leak.md"])
def test_a_wiki_bundle_with_a_symbolic_link_is_refused(base, empty_home, tmp_path, link):
    outside = tmp_path / "outside"
    outside.mkdir()
    hostile = repacked(base["archive"], tmp_path, _with_link(tmp_path, link, outside))
    with pytest.raises(BackupError, match=f"its wiki bundle holds .*{re.escape(link)} \\(mode 120000\\).*"
                                          "Nothing was restored"):
        restore_backup(hostile)
    assert_empty(empty_home)
    assert list(outside.iterdir()) == []


def test_no_write_of_kb_goes_through_a_link_in_the_wiki(kb_home, tmp_path):
    """The second wall: a live wiki whose raw/ is a link to a folder
    outside (a hand edit, or an archive of an earlier kb). Wiki.ensure()
    and the parsed-source writer refuse, name the path, and write nothing."""
    from datetime import datetime, timezone

    from kb.telegram.inbox import InboxItem
    from kb.telegram.parsed_files import move_parsed_file, write_parsed_file
    from kb.telegram.source_parsers import ParsedSource
    from kb.wiki_files import OutsideWiki

    wiki = Wiki.from_settings()
    root = wiki.ensure()  # the honest path: a wiki with no link
    assert (root / "raw" / "parsed").is_dir()
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(root / "raw")
    (root / "raw").symlink_to(outside)

    with pytest.raises(OutsideWiki, match=f"{re.escape(str(root / 'raw' / 'parsed'))} leads out of the wiki"):
        wiki.ensure()
    item = InboxItem(id="a1b2c3d4e5", type="text", received_at="2026-12-06T00:00:00+00:00", origin="telegram")
    parsed = ParsedSource(title="A note", body="Some words.", parser="text")
    with pytest.raises(OutsideWiki, match="raw/parsed/text/.* leads out of the wiki"):
        write_parsed_file(root, item, parsed, datetime.now(timezone.utc))
    (root / "wiki" / "sources" / "page.md").write_text("a page")
    with pytest.raises(OutsideWiki, match="raw/rejected leads out of the wiki"):
        move_parsed_file(root, root / "wiki" / "sources" / "page.md", rejected=True, item_type="text")
    assert list(outside.rglob("*")) == []


# --- 3. every backup restores -----------------------------------------------------------------


def test_the_runless_event_log_dot_db_is_a_sqlite_file(tmp_path):
    """Dagster's event log of runless events is `history/runs/.db`: a
    SQLite file whose suffix is empty to pathlib. A file that is named .db
    and is not SQLite, or that is not named .db, is still refused."""
    from kb.backup.archive_checks import check_dagster_home

    home = tmp_path / "dagster"
    (home / "history" / "runs").mkdir(parents=True)
    with sqlite3.connect(home / "history" / "runs" / ".db") as conn:
        conn.execute("CREATE TABLE event_logs (id INTEGER)")
    (home / "dagster.yaml").write_text("anything: the restore never reads it\n")
    check_dagster_home(home, tmp_path / "a.tar.gz")

    (home / "history" / "fake.db").write_text("not SQLite")
    with pytest.raises(BackupError, match=r"dagster/history/fake.db is not a SQLite database"):
        check_dagster_home(home, tmp_path / "a.tar.gz")
    (home / "history" / "fake.db").unlink()
    (home / "workspace.yaml").write_text("load_from: []\n")
    with pytest.raises(BackupError, match=r"dagster/workspace.yaml is not a SQLite database"):
        check_dagster_home(home, tmp_path / "a.tar.gz")


@pytest.mark.slow  # slow: `kb backup` in its own process
def test_kb_backup_works_with_kb_home_alone(base, tmp_path, monkeypatch):
    """No DAGSTER_HOME in the environment: `kb backup` finds the Dagster
    home in KB_HOME (it ended in a traceback)."""
    folder = tmp_path / "copy"
    restored = tmp_path / "home"
    point_at(monkeypatch, restored)
    restore_backup(base["archive"])
    monkeypatch.delenv("DAGSTER_HOME")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    proc = subprocess.run([sys.executable, "-m", "kb.apps.cli", "backup", str(folder)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    archive = Path(proc.stdout.strip().splitlines()[-1])
    assert archive.parent == folder and archive.is_file()


# --- 4. an inbox item reads only its own folder ------------------------------------------------


@pytest.mark.parametrize("kind", ["absolute", "dot-dot", "link"])
def test_an_inbox_item_whose_file_leads_out_of_its_folder_is_not_read(kb_home, kind):
    """A restored item names the settings file as its attachment: with an
    absolute path, with `..`, or through a link in its own folder. The
    real intake job refuses it by name, and the settings file reaches no
    store and no file of KB_HOME."""
    import duckdb

    from tests import source_helpers as h

    settings_file = Path(os.environ["KB_ENV_FILE"])
    settings_file.write_text(f"GROQ_API_KEY={CANARY}\n")
    item = h.add_item("md", 7, file_name="note.md", content=b"# A note\n\nAn honest note with some words.\n")
    folder = h.inbox().files_dir(item.id)
    (folder / "link.md").symlink_to(settings_file)
    forged = {"absolute": str(settings_file),
              "dot-dot": f"files/{item.id}/{os.path.relpath(settings_file, folder)}",
              "link": f"files/{item.id}/link.md"}[kind]
    manifest = next(h.inbox().items_dir.glob(f"*-{item.id}.json"))
    manifest.write_text(manifest.read_text().replace(f'"files/{item.id}/note.md"', json.dumps(forged)))

    result = h.run_item(h.instance(), item.id)

    assert not result.success
    with duckdb.connect(str(get_settings().duckdb_path), read_only=True) as conn:
        status, error = conn.execute("SELECT status, error FROM sources WHERE item_id = ?", [item.id]).fetchone()
    assert status == "failed"
    assert error.startswith(f"inbox item {item.id}: its file {forged!r} is not inside {folder}."), error
    for path in kb_home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert CANARY.encode() not in path.read_bytes(), path


def test_an_inbox_item_in_its_own_folder_is_read(kb_home):
    """The honest path: the attachment in files/<id>/ is parsed."""
    from tests import source_helpers as h

    item = h.add_item("md", 8, file_name="note.md", content=b"# A note\n\nAn honest note with enough words "
                      b"to pass the length check of a Markdown source, and a few more words.\n")
    assert h.inbox().attachment_path(item) == h.inbox().files_dir(item.id) / "note.md"


# --- 5. the size of an archive -------------------------------------------------------------------


def test_a_restore_refuses_more_than_the_limit(base, empty_home, monkeypatch):
    monkeypatch.setenv("KB_RESTORE_MAX_GB", "0.00001")  # 10,000 bytes
    with pytest.raises(BackupError, match=r"it unpacks to [\d,]+ bytes, more than the limit of 10,000 bytes "
                                          r"\(KB_RESTORE_MAX_GB\).*Nothing was restored"):
        restore_backup(base["archive"])
    assert_empty(empty_home)


def test_a_restore_refuses_more_than_the_free_disk(base, empty_home, monkeypatch):
    from kb.backup import archive_checks

    real = shutil.disk_usage

    def nearly_full(path):
        return real(path)._replace(free=1000)

    monkeypatch.setattr(archive_checks.shutil, "disk_usage", nearly_full)
    with pytest.raises(BackupError, match=r"it unpacks to [\d,]+ bytes, and .* has 1,000 bytes free"):
        restore_backup(base["archive"])
    assert_empty(empty_home)


def test_a_restore_counts_the_bytes_that_it_writes(base, empty_home, monkeypatch):
    """A member can hold more than its header says: the check of the
    declared sizes is gone here (as if every header lied), and the count of
    the written bytes still stops the unpack at the limit."""
    from kb.backup import archive

    monkeypatch.setattr(archive, "check_unpacked_size", lambda *args: None)
    monkeypatch.setenv("KB_RESTORE_MAX_GB", "0.00001")
    with pytest.raises(BackupError, match=r"it unpacked to more than the limit of 10,000 bytes .* at the member"):
        restore_backup(base["archive"])
    assert_empty(empty_home)


# --- 6. DuckDB tables have kb's own columns ------------------------------------------------------

TRANSLATIONS = ("text_hash VARCHAR PRIMARY KEY, english VARCHAR, model VARCHAR NOT NULL, "
                "translated_at TIMESTAMPTZ NOT NULL")


@pytest.mark.parametrize("columns, refused", [
    (TRANSLATIONS.replace("english VARCHAR", "english VARCHAR CHECK (length(english) > 0)"),
     "constraint CHECK on 'translations' (CHECK((length(english) > 0)))"),
    (TRANSLATIONS.replace("english VARCHAR", "english VARCHAR DEFAULT ('planted')"),
     "column 'translations.english' (DEFAULT 'planted')"),
    (TRANSLATIONS.replace("english VARCHAR", "english VARCHAR GENERATED ALWAYS AS (upper(text_hash))"),
     "column 'translations.english' (generated)"),
    (TRANSLATIONS.replace("model VARCHAR", "model INTEGER"), "column 'translations.model' (INTEGER)"),
    (TRANSLATIONS + ", leak VARCHAR", "column 'translations.leak' (VARCHAR)"),
])
def test_a_duckdb_table_must_have_kbs_own_columns(base, empty_home, tmp_path, columns, refused):
    import duckdb

    def forge(top: Path, manifest: dict) -> None:
        with duckdb.connect(str(top / "kb.duckdb")) as conn:
            conn.execute("DROP TABLE translations")
            conn.execute(f"CREATE TABLE translations ({columns})")

    with pytest.raises(BackupError, match=f"its member kb.duckdb holds .*{re.escape(refused)}.*Nothing was restored"):
        restore_backup(repacked(base["archive"], tmp_path, forge))
    assert_empty(empty_home)


def test_kbs_own_default_passes(base, empty_home, tmp_path):
    """sources.transient_failures has kb's own DEFAULT 0: the check compares
    with kb's schema, it does not refuse every DEFAULT. An older file
    without a column that a migration adds passes too."""
    import duckdb

    def older(top: Path, manifest: dict) -> None:
        with duckdb.connect(str(top / "kb.duckdb")) as conn:
            conn.execute("ALTER TABLE gate_results DROP COLUMN errors")

    restore_backup(repacked(base["archive"], tmp_path, older))
    with duckdb.connect(str(empty_home / "kb.duckdb"), read_only=True) as conn:
        assert conn.execute("SELECT column_default FROM duckdb_columns() WHERE table_name = 'sources' "
                            "AND column_name = 'transient_failures'").fetchone() == ("0",)
