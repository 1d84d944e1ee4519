"""Every backup restores (issue 56): the checks that run on the home of a
real `kb up` (tests/test_up.py), so that no test needs a `kb up` start of
its own. The daemon of kb up makes files that a home of a plain sync does
not have, for example `dagster/history/runs/.db` (the event log of the
runless events); a restore once refused each such archive."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

QUERY = "write-ahead logging crash safe"


def check_backups_of_a_kb_up_home(kb_home: Path, tmp_path: Path) -> None:
    """`kb backup` with KB_HOME alone (no DAGSTER_HOME) and the daily
    `backup_job` each write an archive of the home that kb up used; each
    archive restores into a fresh home, where a search answers as in the
    home itself."""
    from kb.apps.backup import create_backup, restore_backup
    from kb.index.search import search
    from kb_assets.backups import backup_job

    assert (kb_home / "dagster" / "history" / "runs" / ".db").is_file()  # the file that the daemon makes
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KB_HOME", str(kb_home))
        mp.setenv("KB_EMBED_BACKEND", "hash")
        mp.delenv("DAGSTER_HOME", raising=False)
        before = [hit.tweet_id for hit in search(QUERY, limit=5).hits]
        assert before, "the home of kb up answers the query"
        archives = [create_backup(tmp_path / "by-hand").archive]  # as `kb backup`: KB_HOME alone

        mp.setenv("KB_BACKUP_DIR", str(tmp_path / "daily"))
        mp.setenv("DAGSTER_HOME", str(kb_home / "dagster"))
        name = "kb-backup-20261206T033000Z.tar.gz"
        with dg.DagsterInstance.from_config(str(kb_home / "dagster")) as instance:
            result = backup_job.execute_in_process(
                instance=instance, run_config={"ops": {"kb_backup": {"config": {"archive_name": name}}}})
        assert result.success
        archives.append(tmp_path / "daily" / name)

        for number, archive in enumerate(archives):
            home = tmp_path / f"restored-{number}"
            mp.setenv("KB_HOME", str(home))
            mp.setenv("DAGSTER_HOME", str(home / "dagster"))
            restored = restore_backup(archive)
            assert "dagster" in restored.manifest["parts"]
            assert (home / "dagster" / "history" / "runs" / ".db").is_file()
            assert [hit.tweet_id for hit in search(QUERY, limit=5).hits] == before, archive
