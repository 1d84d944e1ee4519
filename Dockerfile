# One image for every kb container: the code location (gRPC), the Dagster
# webserver and daemon, the Telegram bot and the search page.
# docker-compose.yml starts them; docs/deploy.md tells how and what was tested.
#
# Build arguments. Their defaults suit a machine with internet; each one is
# a no-op or the usual source there.
# - BASE_IMAGE: a Debian 12 image. A machine that reaches no image registry
#   makes one with debootstrap (docs/deploy.md) and gives its name here.
# - PIP_CONFIG_FILE: a pip settings file for the build (local package
#   indexes, a CA file). /dev/null: pip reads no settings file.
# - TORCH_INSTALL: what pip installs for torch. The default takes the CPU
#   build; without the CPU index, pip takes the CUDA build of several GB.
ARG BASE_IMAGE=debian:bookworm
FROM ${BASE_IMAGE}
ARG PIP_CONFIG_FILE=/dev/null
ARG TORCH_INSTALL="torch --index-url https://download.pytorch.org/whl/cpu"

# Python 3.11 and the programs of kb from Debian. Chromium: Playwright uses
# it (KB_CHROMIUM_PATH). git: the wiki is a git repository. ffmpeg: yt-dlp
# and faster-whisper read video and voice files. bubblewrap: the wiki
# agent's room and the browser's room. tini: signals and zombie processes.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv chromium git ffmpeg ca-certificates bubblewrap tini \
 && rm -rf /var/lib/apt/lists/*

# The user of every kb container: not root (uid 1000, as the specification
# says). The folders of the data belong to it: a new named volume takes the
# owner of the folder that it covers.
RUN useradd --uid 1000 --user-group --create-home --home-dir /home/kb kb \
 && mkdir -p /data/raw /data/inbox /data/wiki /data/lancedb /data/dagster /run/kb-grpc /app \
 && chown -R 1000:1000 /data /run/kb-grpc \
 && chmod 0700 /run/kb-grpc

ENV VIRTUAL_ENV=/opt/kb PATH=/opt/kb/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN python3 -m venv /opt/kb && pip install --no-cache-dir $TORCH_INSTALL

# The dependencies first, in their own layer: it stays in the build cache
# until pyproject.toml changes. Empty package folders and an empty README
# stand in for the code and the README (the README changes often).
WORKDIR /app
COPY pyproject.toml ./
RUN mkdir kb kb_assets kb_resources sensors telegram_bridge mcp_server && touch README.md \
 && pip install --no-cache-dir . && pip uninstall -y kb \
 && rm -rf kb kb_assets kb_resources sensors telegram_bridge mcp_server build *.egg-info README.md

# The folder of the search page's passage rows: the compose file mounts a
# volume of its own there. (Here, not with the other folders above: a change
# of an early layer builds every layer after it again.)
RUN mkdir -p /data/cache && chown 1000:1000 /data/cache

# The project: a layer of seconds.
COPY README.md ./
COPY kb ./kb
COPY kb_assets ./kb_assets
COPY kb_resources ./kb_resources
COPY sensors ./sensors
COPY telegram_bridge ./telegram_bridge
COPY mcp_server ./mcp_server
RUN pip install --no-cache-dir --no-deps . && rm -rf build *.egg-info
COPY workspace.yaml workspace-grpc.yaml ./

# KB_HOME is /data. The compose file mounts a volume on each folder of it,
# and gives each container only the folders that it needs.
# container=docker: the sign of a container for kb (kb/guards/room_binds.py)
# under Docker, which sets no such variable; podman sets container=podman.
ENV KB_HOME=/data \
    container=docker \
    DAGSTER_HOME=/data/dagster \
    KB_CHROMIUM_PATH=/usr/bin/chromium \
    HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 1000:1000
EXPOSE 3000 8765
ENTRYPOINT ["/usr/bin/tini", "--"]

# The code location, on a Unix socket in a 0700 folder: only the containers
# that mount that folder reach it. The compose file gives each other
# container its command.
CMD ["sh", "-c", "python -m kb_assets.instance_config && rm -f /run/kb-grpc/code.sock && exec dagster api grpc -m kb_assets.definitions --socket /run/kb-grpc/code.sock"]
