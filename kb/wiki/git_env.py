"""kb's own git: every git command of kb starts here.

kb's git runs without the owner's git settings. Why: the owner's global
config once hid a page from kb. A global `core.excludesFile` that holds
`node_modules/` (common) made `wiki/concepts/node_modules/x.md` invisible
to the check of a change (no path rule, no secret scan) and to the
rollback (`git clean`), and then the search index, the MCP server and the
next agent runs read it. Other settings of the owner can do the same: a
hook path, a credential helper, a `GIT_DIR` or `GIT_INDEX_FILE` in the
shell that points git at another repository.

So the environment of git is an allowlist (GIT_ENV_NAMES), the global and
system config files are off (GIT_CONFIG_GLOBAL=/dev/null,
GIT_CONFIG_NOSYSTEM=1), and the command line turns off the default
excludes and attributes files (~/.config/git/ignore and
~/.config/git/attributes), hooks and fsmonitor. The repository's own
.gitignore and .git/config still count: they are kb's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# The only variables of kb's process that git gets. PATH finds git and ssh;
# HOME and SSH_AUTH_SOCK let a push over ssh use the owner's ssh keys (ssh
# reads ~/.ssh, not git's config); TMPDIR is where git may write temporary
# files; the proxy and CA names let a push over https pass the owner's
# proxy. Each other GIT_* variable of the owner's shell stays out.
GIT_ENV_NAMES = (
    "PATH", "HOME", "TMPDIR", "SSH_AUTH_SOCK",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH",
)
GIT_FIXED_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",  # nobody is at the keyboard to type a password
    "LC_ALL": "C",  # kb reads git's messages
}
# Before the subcommand. An empty core.excludesFile turns off the default
# ~/.config/git/ignore too (git 2.39, measured): without it, that file of
# the owner still counts when no config names one.
GIT_OPTIONS = (
    "-c", "core.excludesFile=",
    "-c", "core.attributesFile=",
    # No hooks and no fsmonitor: a file in .git/hooks must never run a
    # program when kb commits (a restored archive or a hand edit can hold one).
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git command of kb: the allowed names of this
    process, the fixed values, then `extra` (kb's own names for one call)."""
    env = {name: os.environ[name] for name in GIT_ENV_NAMES if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return {**env, **GIT_FIXED_ENV, **(extra or {})}


def git_command(*args: str) -> list[str]:
    """The argument list of `git <args>` with kb's options in front."""
    return ["git", *GIT_OPTIONS, *args]
