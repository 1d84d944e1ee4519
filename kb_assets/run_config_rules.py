"""The allowlist of run config and run tags that reach the file system or a
prompt.

Why: everything in run config, every run tag and every dynamic partition key
can be set in the Dagster UI's launchpad, not only by kb's commands, the
sensors and the bot. The UI answers only the owner (kb/apps/owner_guard.py),
but a run from the UI must still stay inside KB_HOME: without these rules,
`CaptureConfig.files=["~/.config/kb/state.json"]` copied the X login into
KB_HOME/raw, an absolute `archive_name` wrote a full archive of KB_HOME
anywhere, and a wiki_topics key went as it was into the agent's prompt (its check is
topic_key() in kb/wiki/prompts.py, the bot's rule).

Each check runs at the start of its step, before the step writes anything,
and raises RunConfigRefused: a Dagster failure that no retry can fix, which
names the field and the reason.

One rule holds for the whole run config, before any step: run_config_refusal().
Dagster lets run config set every field of every resource, and a string field
can take `{env: NAME}`: a launch of wiki_index_job with
`resources: {lance: {config: {s3_endpoint: <listener>, s3_access_key_id:
{env: ANTHROPIC_API_KEY}}}}` sent the key to the listener, and a `wiki.path`
outside KB_HOME read a foreign folder into the index. So a run config may have
only the sections of RUN_CONFIG_SECTIONS, and no mapping with the key `env` at
any depth. The owner changes settings in .env. The rule runs where every run
starts: the run launcher of kb (kb_assets/run_launcher.py: each run of the UI,
GraphQL, a sensor, a schedule, a re-execution, a retry and a `kb` command
under kb up) and the one place where a `kb` command executes a run in its own
process (kb/apps/run_paths.py execute_here, with the parent's config of a
re-execution).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg

from kb.settings import CONFIG_DIR, Settings, get_settings
from kb_assets.keys import OVERRIDE_VALUE, REQUESTED_BY_TAG

log = logging.getLogger(__name__)

# The sections of run config that a run may have: `ops` (the config of a
# stage) and `loggers` (kb's commands make the console logs quiet). Not
# `resources` (the settings of .env only), not `execution` (each job names its
# executor in code), and no other key.
RUN_CONFIG_SECTIONS = ("ops", "loggers")
# Dagster reads the environment variable NAME for `{env: NAME}` in run config.
ENV_KEY = "env"

IMPORT_SUFFIX = ".json"
DOT_FOLDER_REASON = "it is in the dot-folder"
# The folder in KB_HOME where `kb import` and `kb demo` put a copy of a file
# that the owner named and that the rule below refuses (a file in a
# dot-folder, such as a virtual environment's .venv).
IMPORTS_FOLDER = "imports"


class RunConfigRefused(dg.Failure):
    """A value of run config or a run tag that kb does not accept: the step
    fails before it writes anything, and no retry can fix it."""

    def __init__(self, description: str):
        super().__init__(description=description, allow_retries=False)


class RunRefused(Exception):
    """A run whose run config kb does not accept: it does not start."""


def run_config_refusal(run_config: object) -> str | None:
    """Why kb refuses a run with this run config, or None. The reason names
    the refused key with its path, for example
    `ops.wiki_index.config.remote.env`."""
    if not run_config:
        return None
    if not isinstance(run_config, Mapping):
        return "the run config is not a mapping"
    for key, value in run_config.items():
        if key == "resources":
            names = ", ".join(map(str, value)) if isinstance(value, Mapping) else ""
            return (f"the key 'resources'{f' ({names})' if names else ''} is refused: run config cannot "
                    "configure a resource of kb. Change the settings in kb's .env file")
        if key not in RUN_CONFIG_SECTIONS:
            return (f"the key {str(key)!r} is refused: a run config of kb has only the sections "
                    f"{', '.join(RUN_CONFIG_SECTIONS)}")
    path = _env_path(run_config, ())
    if path is not None:
        return (f"the key {path!r} is refused: {{env: ...}} would read a variable of the environment of kb's "
                "process (where the API keys are). Change the settings in kb's .env file")
    return None


def _env_path(value: object, path: tuple[str, ...]) -> str | None:
    """The path of the first mapping in `value` that has the key `env`."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            here = (*path, str(key))
            if key == ENV_KEY:
                return ".".join(here)
            found = _env_path(item, here)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value):
            found = _env_path(item, (*path[:-1], f"{path[-1] if path else ''}[{number}]"))
            if found is not None:
                return found
    return None


def check_run_config(run_config: object, what: str) -> None:
    """Raise RunRefused, which names `what` (the run) and the refused key,
    when run_config_refusal() refuses the config."""
    reason = run_config_refusal(run_config)
    if reason is not None:
        raise RunRefused(f"kb refuses {what}: {reason}. Nothing ran.")


def _config_dirs(settings: Settings) -> list[Path]:
    """The folders of kb's own settings and secrets: ~/.config/kb and the
    folders of the settings files that the environment names."""
    folders = {CONFIG_DIR, *(Path(path).expanduser().parent for path in
                             (settings.x_state_path, settings.kb_config_file, settings.kb_env_file))}
    return [folder.resolve() for folder in folders]


def _dot_part(path: Path, base: Path | None = None) -> str | None:
    """The first part of `path` (after `base`) whose name starts with a dot."""
    parts = path.relative_to(base).parts if base is not None else path.parts
    return next((part for part in parts if part.startswith(".")), None)


def import_file_refusal(value: str, settings: Settings | None = None) -> str | None:
    """The reason why the import file `value` is refused, or None.

    Allowed: an absolute path of a regular `.json` file (after links are
    followed) that is not the X login state, not in a folder of kb's settings
    (~/.config/kb) and not in a dot-folder. A file that does not exist yet
    passes here: the import then fails with "no such file", and a re-run
    after the owner puts the file there works."""
    settings = settings or get_settings()
    given = Path(value).expanduser()
    if not given.is_absolute():
        return "the path is not absolute"
    target = given.resolve()
    # kb's secrets first: a refusal for these must never read as "only a
    # dot-folder" (files_for_import copies such a file).
    if settings.x_state_path.expanduser().resolve() == target:
        return "it is the X login state of `kb login`"
    for folder in _config_dirs(settings):
        if target.is_relative_to(folder):
            return f"it is in {folder}, the folder of kb's settings and keys"
    folder = settings.home / IMPORTS_FOLDER
    imports = (folder.absolute(), folder.resolve())
    for path in (given, target):
        if path.suffix.lower() != IMPORT_SUFFIX:
            return f"{path.name!r} is not a {IMPORT_SUFFIX} file"
        # kb's own copies: only their place in KB_HOME counts (KB_HOME itself may be in a dot-folder).
        dot = _dot_part(path, next((base for base in imports if path.is_relative_to(base)), None))
        if dot is not None:
            return f"{DOT_FOLDER_REASON} {dot!r}"
    if target.exists() and not target.is_file():
        return "it is not a regular file"
    return None


def check_import_files(files: list[str], settings: Settings | None = None) -> None:
    settings = settings or get_settings()
    for value in files:
        reason = import_file_refusal(value, settings)
        if reason is not None:
            raise RunConfigRefused(f"CaptureConfig.files: {value!r} is refused: {reason}. kb imports only "
                                   "regular .json files outside dot-folders and outside kb's settings folder. "
                                   "Nothing was imported.")


def files_for_import(files: list[str], settings: Settings | None = None) -> list[str]:
    """The paths that `kb import` and `kb demo` put into the run config. The
    owner named each file on the command line: a .json file that the rule
    above refuses only for its dot-folder (for example a .venv folder, where
    `kb demo` finds its pages) is copied first into KB_HOME/imports/<time>/<n>/,
    under its own name (the import reads the name of a folder page and a
    thread), and the copy is imported. Every other file goes as it is, so
    the step refuses the X login, kb's settings or a file that is not .json,
    and says why: a copy must never carry them past the rule."""
    settings = settings or get_settings()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    chosen = []
    for number, value in enumerate(files, 1):
        source = Path(value).expanduser().absolute()
        reason = import_file_refusal(str(source), settings)
        if reason is None or not reason.startswith(DOT_FOLDER_REASON) or not source.is_file():
            chosen.append(str(source))
            continue
        copy = settings.home / IMPORTS_FOLDER / stamp / f"{number:04d}" / source.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
        chosen.append(str(copy))
    return chosen


def check_archive_name(name: str) -> None:
    """An archive name is a plain file name in the backup folder."""
    reason = None
    if name in (".", ".."):
        reason = "it is not a file name"
    elif "/" in name or "\\" in name:
        reason = "it holds a path separator; give a file name only: the archive goes into KB_BACKUP_DIR"
    elif name.startswith("."):
        reason = "it starts with a dot"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        reason = "it holds a control character"
    if reason is not None:
        raise RunConfigRefused(f"BackupConfig.archive_name {name!r} is refused: {reason}. Nothing was written.")


def check_override_tag(value: str, item_known: bool, item_id: str) -> bool:
    """True when the run carries a valid override. The value must be "true",
    as the inbox sensor sets it for the bot's /override, and the run's item
    must be an item of the inbox, which the owner can override with the bot."""
    if value != OVERRIDE_VALUE:
        raise RunConfigRefused(f"the tag kb/override={value!r} is refused: its only value is 'true'.")
    if not item_known:
        raise RunConfigRefused(f"the tag kb/override is refused: {item_id!r} is not an item of the inbox; "
                               "an override names an item that the owner sent (/override <id> in the bot).")
    return True


def requester_chat(run_tags: dict[str, str], settings: Settings | None = None) -> int | None:
    """The chat of the tag kb/requested_by (the owner who sent /lint or
    /synthesize), when it names a user of ALLOWED_USER_IDS; else None, and
    the notice goes to the item's chat or OWNER_CHAT_ID. Why: the UI can set
    the tag too, and a notice to a stranger's chat would give away the wiki."""
    value = (run_tags.get(REQUESTED_BY_TAG) or "").strip()
    if not value:
        return None
    settings = settings or get_settings()
    if value.isdigit() and int(value) in settings.allowed_users():
        return int(value)
    log.warning("the tag kb/requested_by=%r names no user of ALLOWED_USER_IDS: the notice goes to OWNER_CHAT_ID",
                value[:40])
    return None
