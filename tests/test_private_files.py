"""KB_HOME, its logs and inbox, and the backups are the owner's only:
folders 0700, files 0600 (kb/store/private_files.py). Each test starts with an
open umask (0022), as on many systems, so only kb's own rule can make the
modes private."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.private_modes import open_to_others, open_umask

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def owner_umask():
    with open_umask():
        yield


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_wide_home_and_backup_folder_are_tightened_and_told_once(kb_home, tmp_path, monkeypatch):
    """An older kb made KB_HOME 0755. The next kb command makes it 0700 and
    says so once; the next one says nothing."""
    from kb.apps.cli import main

    backups = tmp_path / "backups"
    backups.mkdir()
    for folder in (kb_home, backups):
        os.chmod(folder, 0o755)
    monkeypatch.setenv("KB_BACKUP_DIR", str(backups))
    first = CliRunner().invoke(main, ["search", "anything"])
    assert f"kb made KB_HOME {kb_home} private: its mode was 0755" in first.stderr
    assert f"kb made the backup folder {backups} private: its mode was 0755" in first.stderr
    assert (mode(kb_home), mode(backups)) == (0o700, 0o700)
    again = CliRunner().invoke(main, ["search", "anything"])
    assert "private" not in again.stderr
    assert os.umask(0o022) == 0o077  # the command left the process private


def test_the_code_location_makes_its_process_private(tmp_path):
    """`dagster dev` and its run workers do not come through the kb CLI:
    the load of kb's code location sets the umask."""
    check = "import os, kb_assets.definitions as d; d.defs(); print(oct(os.umask(0o077)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("DAGSTER_HOME", None)
    result = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # the child starts with the open umask of this test
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "0o77"


def test_a_backup_archive_and_its_new_folder_are_private(kb_home, tmp_path):
    from kb.backup.archive import create_backup

    (kb_home / "inbox").mkdir()
    (kb_home / "inbox" / "note.txt").write_text("a message to the bot")
    result = create_backup(tmp_path / "new" / "backups", include_dagster=False)
    assert mode(result.archive) == 0o600
    assert (mode(tmp_path / "new"), mode(tmp_path / "new" / "backups")) == (0o700, 0o700)
