"""The room that the wiki agent's CLI runs in: a clean environment and,
where bubblewrap works, a file system that holds only the wiki.

Why a launcher: claude-agent-sdk starts its CLI with `os.environ` merged
with the `env` that kb passes (subprocess_cli.py, `{**os.environ, ...}`),
and a run worker holds every key that kb loaded (the resources export them
to the environment). The SDK has no switch against the merge. So kb gives
the SDK a launcher as `cli_path`: a small Python program that keeps only the
variables that this module names and then replaces itself with the CLI
(`execve`). The CLI never sees another variable.

Why bubblewrap, and not the SDK's `sandbox` settings: those settings wrap
the Bash tool only, and the wiki agent has no Bash tool. bubblewrap wraps
the whole CLI. Inside it, the CLI sees the system folders read-only, its own
binary, a temporary HOME, its config folder, and the wiki folder. The wiki's
`.git` is an empty folder, and `raw/`, `purpose.md` and `CLAUDE.md` are
read-only. The owner's settings file, the X login, DuckDB and the rest of
KB_HOME are not in the room at all, so no tool and no bug of the CLI can
read them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

# The only variables that the CLI gets. Each one is here for a reason:
# - PATH, HOME, TMPDIR, LANG, LC_ALL, TZ: a process needs them to run.
# - ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_API_KEY: the model
#   endpoint and its token (kb sets the API key to an empty value).
# - CLAUDE_CONFIG_DIR and the DISABLE_* and CLAUDE_CODE_* names below: the
#   CLI's own settings, which kb sets (kb/wiki_agent.py) or the SDK sets
#   (the entry point, the SDK version, the session-state protocol).
# A name that is not here never reaches the CLI, whatever its value.
AGENT_ENV_NAMES = (
    "PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ", "PWD",
    "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY",
    "CLAUDE_CONFIG_DIR",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING",
    "DISABLE_AUTOUPDATER", "DISABLE_BUG_COMMAND",
    "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_AGENT_SDK_VERSION", "CLAUDE_CODE_SDK_READS_SESSION_STATE",
)
# The PATH of the CLI: system folders only. The owner's PATH can name a
# folder in which a stranger's program waits.
AGENT_PATH = "/usr/local/bin:/usr/bin:/bin"

# The system files that a program needs to run and to reach the endpoint by
# name and by TLS. /etc as a whole is not in the room: it can hold keys.
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
SYSTEM_FILES = (
    "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
    "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/pki",
)
# Inside the wiki: what the agent reads but never writes.
READ_ONLY_IN_WIKI = ("raw", "purpose.md", "CLAUDE.md")
# Inside the wiki: what the agent never sees.
HIDDEN_IN_WIKI = (".git",)

LAUNCHER = '''#!{python} -IS
# Written by kb (kb/agent_sandbox.py) for each agent run. It keeps only the
# named variables, then replaces itself with the CLI: no secret of the run
# worker reaches the CLI's process.
import json, os, sys
config = json.loads({config!r})
env = {{name: os.environ[name] for name in config["names"] if name in os.environ}}
env.update(config["fixed"])
argv = config["prefix"] + [config["cli"]] + sys.argv[1:]
os.execve(argv[0], argv, env)
'''


class SandboxError(RuntimeError):
    """The agent's room cannot be made as the settings ask."""


@lru_cache(maxsize=1)
def bubblewrap_works() -> tuple[bool, str]:
    """True when `bwrap` is installed and can make a room on this machine
    (a container without user namespaces cannot). The reason says why not."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False, "bubblewrap is not installed (Debian: apt install bubblewrap)"
    try:
        proc = subprocess.run([bwrap, "--ro-bind", "/", "/", "--", "/bin/true"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap did not start: {exc}"
    if proc.returncode != 0:
        return False, f"bwrap cannot make a room here: {proc.stderr.strip()[:200]}"
    return True, bwrap


def sandbox_choice(setting: str) -> tuple[bool, str]:
    """Whether to use bubblewrap, from KB_AGENT_SANDBOX (auto, bwrap, none).
    `bwrap` fails when bubblewrap does not work; `auto` uses it when it works."""
    works, detail = bubblewrap_works()
    if setting == "none":
        return False, "KB_AGENT_SANDBOX=none: the agent's CLI runs without bubblewrap"
    if setting == "bwrap" and not works:
        raise SandboxError(f"KB_AGENT_SANDBOX=bwrap, but {detail}")
    if not works:
        return False, f"the agent's CLI runs without bubblewrap: {detail}"
    return True, "bubblewrap"


def bubblewrap_args(bwrap: str, *, wiki: Path, writable: list[Path], readable: list[Path]) -> list[str]:
    """The bwrap command line in front of the CLI. Later mounts cover earlier
    ones, so the read-only and hidden parts of the wiki come after the wiki."""
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for path in SYSTEM_FILES:
        args += ["--ro-bind-try", path, path]
    for path in readable:
        args += ["--ro-bind", str(path), str(path)]
    for path in writable:
        args += ["--bind", str(path), str(path)]
    args += ["--bind", str(wiki), str(wiki)]
    for name in READ_ONLY_IN_WIKI:
        if (wiki / name).exists():
            args += ["--ro-bind", str(wiki / name), str(wiki / name)]
    for name in HIDDEN_IN_WIKI:
        if (wiki / name).exists():
            args += ["--tmpfs", str(wiki / name)]
    args += ["--chdir", str(wiki), "--"]
    return args


def write_launcher(folder: Path, *, cli: str, home: Path, prefix: list[str]) -> Path:
    """Write the launcher for one run into `folder` (mode 0700) and return
    its path. It holds no secret: the token comes through the environment."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = {"names": list(AGENT_ENV_NAMES), "cli": cli, "prefix": prefix,
              "fixed": {"PATH": AGENT_PATH, "HOME": str(home), "TMPDIR": "/tmp"}}
    path = folder / "launch-cli"
    path.write_text(LAUNCHER.format(python=sys.executable, config=json.dumps(config)))
    path.chmod(0o700)
    return path


def bundled_cli() -> str:
    """The CLI that claude-agent-sdk ships (the `_bundled/claude` file)."""
    import claude_agent_sdk

    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if not path.is_file():
        found = shutil.which("claude")
        if not found:
            raise SandboxError(f"the Claude Code CLI is not at {path} and not on PATH")
        return found
    return str(path)
