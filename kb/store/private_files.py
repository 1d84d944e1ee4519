"""KB_HOME and the backups are private to the owner: folders 0700, files 0600.

KB_HOME holds the bookmarks, the wiki, the inbox (the owner's messages to
the bot), the logs and the Dagster home; a backup holds all of it. Other
users of the same machine must not read them. The rule is in one place:

- Each entry point of kb sets the process umask to 0o077
  (private_process): the `kb` CLI, `kb-bot`, `kb-mcp` and the load of the
  Dagster code location (kb_assets/definitions.py, for `dagster dev` and
  each run worker). `kb up` runs through the CLI, so the daemon, the
  webserver, the code server, the bot and the search page that it starts
  get the umask too. So each folder and file that kb makes is private
  from the start, at every place that makes one.
- The folders that kb makes for the owner (KB_HOME, the backup folder)
  are also made private explicitly, whatever the umask is. When one of
  them exists with a wider mode (a KB_HOME that an older kb made 0755),
  kb tightens it to 0700 and says so once (private_home). Only the top
  folder changes: its 0700 keeps other users out of everything below it.
- A backup archive is 0600 explicitly, and a restored home is made
  private file by file (make_tree_private): the archive's members carry
  the modes of the machine that wrote them (kb/backup/archive.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb.settings import Settings

PRIVATE_UMASK = 0o077
FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_process() -> None:
    """Every file and folder that this process (and each child that it
    starts) makes is private to the owner."""
    os.umask(PRIVATE_UMASK)


def make_private_folder(folder: Path) -> None:
    """Create the folder (and missing parents) with mode 0700; tighten it when
    it exists with a wider mode. chmod after mkdir makes the mode exact,
    whatever the umask is."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for part in reversed(missing):
        part.mkdir(mode=FOLDER_MODE)
        os.chmod(part, FOLDER_MODE)
    if stat.S_IMODE(folder.stat().st_mode) != FOLDER_MODE:
        os.chmod(folder, FOLDER_MODE)


def make_tree_private(root: Path) -> None:
    """Folders 0700 and files 0600 (0700 when the owner may run it) under
    `root` and `root` itself. Links stay as they are: chmod would follow them."""
    for folder, dirs, files in os.walk(root):
        os.chmod(folder, FOLDER_MODE)
        for name in files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                os.chmod(path, FILE_MODE | (info.st_mode & stat.S_IXUSR and 0o100))


def tighten(folder: Path, what: str) -> str | None:
    """Make an existing folder 0700 when group or others can use it.
    Returns the note for the owner, or None when nothing changed. A missing
    folder or a folder of another user stays as it is."""
    try:
        info = folder.stat()
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or not mode & 0o077:
        return None
    os.chmod(folder, FOLDER_MODE)
    return (f"kb made {what} {folder} private: its mode was {mode:04o}, so other users of this machine could "
            f"read it; it is 0700 now.")


def private_home(settings: Settings) -> list[str]:
    """Tighten KB_HOME and the backup folder when they exist with a wider
    mode. Returns one note for each folder that changed."""
    notes = [tighten(settings.home, "KB_HOME"), tighten(settings.backup_dir, "the backup folder")]
    return [note for note in notes if note]
