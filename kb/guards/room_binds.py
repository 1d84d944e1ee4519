"""The system part of every bubblewrap room of kb: the browser's
(kb/x/browser_room.py) and the wiki agent's (kb/wiki/sandbox.py). One copy,
so that both rooms see the system folders the same way, are probed the same
way, and tell the owner the same fix."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

BWRAP_MISSING = "bubblewrap is not installed (no bwrap on PATH)"
BWRAP_INSTALL = ("install it with `sudo apt-get install bubblewrap` (Debian, Ubuntu) "
                 "or `sudo dnf install bubblewrap` (Fedora)")

# Read-only in every room. /etc as a whole is not: it can hold keys; each
# room names the files of /etc that its program needs.
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")


# The signs of a container: the file that podman writes at each start, and
# the variables that container managers set (`container`: podman,
# systemd-nspawn, and kb's Dockerfile for Docker; Kubernetes sets its
# service host). Not /.dockerenv: a VM made from a Docker image keeps it (the
# development machine of kb has one), and the owner's machine must keep the
# fallback of `auto`.
CONTAINER_FILES = ("/run/.containerenv",)
CONTAINER_VARIABLES = ("container", "KUBERNETES_SERVICE_HOST")


def container_sign() -> str | None:
    """What shows that this process runs in a container, or None. Why it
    matters: in a container, the machine of the owner is not the last wall
    around the agent, and the owner did not see the room fail (docs/deploy.md)."""
    for path in CONTAINER_FILES:
        if os.path.exists(path):
            return f"{path} exists"
    for name in CONTAINER_VARIABLES:
        if os.environ.get(name):
            return f"{name} is set"
    return None


def system_binds(files: tuple[str, ...]) -> list[str]:
    """bwrap arguments for the system folders (read-only; a folder that is a
    link, as /bin on a merged-/usr system, stays a link) and the named files,
    where they exist."""
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for path in files:
        args += ["--ro-bind-try", path, path]
    return args


def bwrap_probe(room: Callable[[str], list[str]], env: dict[str, str] | None = None) -> tuple[bool, str]:
    """(True, path of bwrap) when bubblewrap makes this room here: it runs
    `room(bwrap)` (the room's own command line, up to its program) with
    /bin/true. Else (False, why): not installed (BWRAP_MISSING), or the
    kernel gives no user namespaces (a container)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False, BWRAP_MISSING
    try:
        proc = subprocess.run([*room(bwrap), "/bin/true"], capture_output=True, text=True, timeout=20, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap did not start: {exc}"
    if proc.returncode != 0:
        return False, f"bwrap cannot make a room here: {proc.stderr.strip()[:200]}"
    return True, bwrap
