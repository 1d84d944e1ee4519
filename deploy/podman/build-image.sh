#!/usr/bin/env bash
# Build kb's image (kb:latest) with podman on a machine that reaches no image
# registry, from the same Dockerfile that a Docker user builds.
#
# 1. The base image localhost/debian:bookworm comes from debootstrap, once
#    (the script skips this step when the image exists).
# 2. pip in the build uses this machine's pip settings (`pip config list`):
#    the script gives their local folders and files to the build read-only,
#    and a pip settings file that names them (build argument
#    PIP_CONFIG_FILE). The image keeps none of them.
# 3. podman keeps the layers: a new build after a change of the code only
#    takes seconds; a change of pyproject.toml installs the dependencies again.
#
# Usage: deploy/podman/build-image.sh [more arguments of podman build]
# Environment: KB_TORCH_INSTALL (default torch==2.13.0, the CPU build that
# pip finds on this machine), KB_DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}"
BASE=localhost/debian:bookworm

if ! podman image exists "$BASE"; then
  root=$(mktemp -d /var/tmp/kb-debootstrap.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase bookworm "$root" "${KB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  tar -C "$root" -c . | podman import - "$BASE"
  rm -rf "$root"
  trap - EXIT
fi

# This machine's pip settings, as a file for the build, and the local paths
# that they name, as read-only volumes of the build.
build=$(mktemp -d /var/tmp/kb-pip.XXXXXX)
trap 'rm -rf "$build"' EXIT
volumes=$(python3 - "$build" <<'EOF'
import os, shutil, subprocess, sys
from urllib.parse import urlsplit

build = sys.argv[1]
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
settings = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    settings[key.split(".", 1)[1]] = value.strip().strip("'\"")
volumes, lines = set(), ["[global]"]
for key, value in settings.items():
    if key in ("cert", "constraint"):  # files: copied beside the settings file
        if not os.path.isfile(value):
            continue
        shutil.copy(value, os.path.join(build, key))
        value = f"/run/kb-build/{key}"
    elif key in ("index-url", "extra-index-url", "find-links"):
        for item in value.split():
            path = urlsplit(item).path if item.startswith("file:") else item
            if path.startswith("/") and os.path.exists(path):
                volumes.add(path.rstrip("/").removesuffix("/simple"))
    lines.append(f"{key} = {value}")
open(os.path.join(build, "pip.conf"), "w").write("\n".join(lines) + "\n")
print(" ".join(f"-v {v}:{v}:ro" for v in sorted(volumes)))
EOF
)
chmod -R a+rX "$build"

# shellcheck disable=SC2086 # $volumes is a list of arguments
podman build --network host -t kb:latest \
  --build-arg BASE_IMAGE="$BASE" \
  --build-arg PIP_CONFIG_FILE=/run/kb-build/pip.conf \
  --build-arg TORCH_INSTALL="${KB_TORCH_INSTALL:-torch==2.13.0}" \
  -v "$build:/run/kb-build:ro" $volumes \
  "$@" .
