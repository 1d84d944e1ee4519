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
import tarfile
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


# --- 9. What the check reads is what the restore keeps; tar headers that cost memory ----------------


def store_with_a_hiding_wal(view: str):
    """An edit for repacked(): the store holds a view `authors` (its SQL:
    `view`) in place of kb's table, and a WAL beside it drops the view and
    makes the table again. DuckDB reads the WAL when it opens the store."""
    import duckdb

    from kb.store.duckdb_schema import TABLES

    def forge(top, manifest):
        conn = duckdb.connect(str(top / "kb.duckdb"))
        conn.execute("DROP TABLE authors")
        conn.execute(f"CREATE VIEW authors AS {view}")
        conn.execute("CHECKPOINT")
        conn.execute("PRAGMA disable_checkpoint_on_shutdown")
        conn.execute("SET wal_autocheckpoint='1TB'")
        conn.execute("DROP VIEW authors")
        conn.execute(TABLES["authors"])
        conn.close()
        assert (top / "kb.duckdb.wal").is_file()

    return forge


def test_a_wal_beside_the_store_is_refused_and_cannot_hide_a_view(base, empty_home, tmp_path):
    """The archive's store holds a view `authors` that reads a file of the
    owner; its WAL drops the view. The check read the store with the WAL
    (clean tables), and the restore moved the store without it: kb then
    read the owner's file through its own table name."""
    secret = tmp_path / "owner.env"
    secret.write_text("TELEGRAM_BOT_TOKEN=123:SECRET-OF-THE-OWNER\n")
    forge = store_with_a_hiding_wal(f"SELECT content AS handle FROM read_text('{secret}')")
    with pytest.raises(BackupError, match=r"the member '[^']+/kb\.duckdb\.wal' is not a part of a kb backup"):
        restore_backup(repacked(base["archive"], tmp_path, forge))
    assert_empty(empty_home)


def test_the_check_reads_the_store_where_the_restore_keeps_it(base, empty_home, tmp_path, monkeypatch):
    """The second wall: with the allowlist of parts gone, the WAL comes
    along into the stage, and the check of the kept file still finds the view."""
    from kb.backup import archive_checks

    monkeypatch.setattr(archive_checks, "ARCHIVE_PARTS", archive_checks.ARCHIVE_PARTS | {"kb.duckdb.wal"})
    forge = store_with_a_hiding_wal("SELECT 'x' AS handle")
    with pytest.raises(BackupError, match=r"holds what a kb store does not hold \(view 'main.authors'"):
        restore_backup(repacked(base["archive"], tmp_path, forge))
    assert_empty(empty_home)


def tar_header(name: bytes, size_field: bytes, kind: bytes = b"0") -> bytes:
    """One ustar header, as a forger writes it (the size field as given)."""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108], block[108:116], block[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    block[124:136], block[136:148], block[156:157] = size_field, b"00000000000\0", kind
    block[257:263], block[263:265] = b"ustar\0", b"00"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def test_a_header_with_a_negative_size_is_refused_at_once(empty_home, tmp_path):
    """A size of -512 (base-256) sends Python 3.11.7's tarfile back onto the
    same header for ever (CVE-2025-8194): the restore read 534,553 members
    in 20 s, with its memory growing."""
    import gzip

    negative = b"\xff" * 10 + (-512 & 0xFFFF).to_bytes(2, "big")
    archive = tmp_path / "loop.tar.gz"
    archive.write_bytes(gzip.compress(tar_header(b"top/", b"00000000000\0", b"5")
                                      + tar_header(b"top/x", negative) + b"\0" * 1024))
    with pytest.raises(BackupError, match=r"a header declares a negative size \(-512\)"):
        restore_backup(archive)
    assert_empty(empty_home)


def test_a_pax_header_larger_than_any_name_is_refused_before_it_is_read(empty_home, tmp_path):
    """tarfile reads a pax header into memory whole, before any member is
    checked: 1 GiB of zeros made 1.1 GB of memory. Here a header of 16 MiB
    (an archive of 16 kB) is refused from its declared size alone."""
    import gzip

    size = 16 << 20
    archive = tmp_path / "pax.tar.gz"
    archive.write_bytes(gzip.compress(tar_header(b"././@PaxHeader", b"%011o\0" % size, b"x") + bytes(size)))
    with pytest.raises(BackupError, match=r"a header declares 16,777,216 bytes of meta data"):
        restore_backup(archive)
    assert_empty(empty_home)


def test_each_member_counts_against_the_limit_and_the_members_are_counted(base, empty_home, tmp_path, monkeypatch):
    """Folders and empty files declare no bytes, and each takes disk: 100,000
    empty folders (an archive of 470 kB) took 392 MiB of disk under a limit of 1 MB."""
    from kb.backup import archive_checks
    from tests.test_backup import member, top_of

    top = top_of(base["archive"])
    folders = [member(f"{top}/raw/f{i}", type=tarfile.DIRTYPE) for i in range(300)]
    monkeypatch.setenv("KB_RESTORE_MAX_GB", "0.001")  # 1,000,000 bytes: 245 members of 4,096 bytes
    with pytest.raises(BackupError, match=r"it unpacks to [\d,]+ bytes, more than the limit of 1,000,000 bytes"):
        restore_backup(repacked(base["archive"], tmp_path / "a", members=folders))
    monkeypatch.delenv("KB_RESTORE_MAX_GB")
    monkeypatch.setattr(archive_checks, "MAX_MEMBERS", 100)
    from kb.backup import archive
    monkeypatch.setattr(archive, "MAX_MEMBERS", 100)
    with pytest.raises(BackupError, match=r"it has more than 100 members"):
        restore_backup(repacked(base["archive"], tmp_path / "b", members=folders))
    assert_empty(empty_home)


@pytest.mark.parametrize("name, edit, refused", [
    ("a file without its checksum", lambda m: m["files"].update({"kb.duckdb": "0" * 64}),
     r"files: 'kb.duckdb' has no SHA-256"),
    ("counts that are no mapping", lambda m: m.update(counts=[]), r"`counts` is not a mapping"),
    ("DuckDB counts that are no numbers", lambda m: m["counts"].update(duckdb={"sources": "3"}),
     r"counts: `duckdb` is not a mapping of tables to numbers"),
    ("a wiki without its branch", lambda m: m["wiki"].pop("branch"), r"wiki branch: missing"),
])
def test_a_manifest_of_another_shape_is_refused_by_name(base, empty_home, tmp_path, name, edit, refused):
    """The manifest is the archive's too: a shape that kb does not write gave
    a TypeError or a KeyError, or (counts = []) skipped the comparison of
    the restored stores with it."""
    out = tmp_path / "edited.tar.gz"
    source = repacked(base["archive"], tmp_path)
    unpacked = tmp_path / "again"
    with tarfile.open(source) as tar:
        tar.extractall(unpacked, filter="data")
    [top] = list(unpacked.iterdir())
    manifest = json.loads((top / "manifest.json").read_text())
    edit(manifest)
    (top / "manifest.json").write_text(json.dumps(manifest))
    with tarfile.open(out, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    with pytest.raises(BackupError, match=refused):
        restore_backup(out)
    assert_empty(empty_home)


def test_a_store_without_its_counts_in_the_manifest_is_not_restored(base, empty_home, tmp_path):
    def drop_counts(top, manifest):
        manifest["counts"].pop("duckdb")

    with pytest.raises(BackupError, match=r"the DuckDB row counts differ from the manifest"):
        restore_backup(repacked(base["archive"], tmp_path, drop_counts))
    assert_empty(empty_home)


def test_a_failed_move_aside_puts_every_part_back(base, tmp_path, monkeypatch):
    """`--force` moves the old home aside part by part. When one part does
    not move (a mount point: EBUSY), the parts moved so far come back, and
    the error names the part."""
    import errno

    from kb.backup import archive

    home = tmp_path / "old"
    point_at(monkeypatch, home)
    restore_backup(base["archive"])
    before = sorted(p.name for p in home.iterdir())
    real_move = archive.move

    def move(source: Path, target: Path) -> None:
        if source.name == "wiki" and archive.ASIDE_PREFIX in target.parent.name:
            raise OSError(errno.EBUSY, "Device or resource busy", str(source))
        real_move(source, target)

    monkeypatch.setattr(archive, "move", move)
    with pytest.raises(BackupError, match=r"could not move wiki aside .*KB_HOME is as it was before the restore"):
        restore_backup(base["archive"], force=True)
    assert sorted(p.name for p in home.iterdir()) == before
