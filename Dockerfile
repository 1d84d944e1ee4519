# One image for every kb container: the code location (gRPC), the Dagster
# webserver and daemon, and the Telegram bot. docker-compose.yml starts them.
# docs/deploy.md says what was tested and what was not.
FROM python:3.11-slim-bookworm

# Chromium from Debian: Playwright uses it (KB_CHROMIUM_PATH) for the X
# capture and for pages that need a browser. git: the wiki is a git
# repository. ffmpeg: yt-dlp and faster-whisper read video and voice files.
RUN apt-get update \
 && apt-get install -y --no-install-recommends chromium git ffmpeg ca-certificates bubblewrap \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# The CPU build of torch first. Without the CPU index, pip takes the CUDA
# build of several GB. Any torch of version 2.4 or newer works (README).
RUN pip install --no-cache-dir torch --index-url https://download.pytorch.org/whl/cpu

# The project. Dependencies change less often than the code, but pip needs
# the packages to install them, so both come in one layer.
COPY pyproject.toml README.md ./
COPY kb ./kb
COPY kb_assets ./kb_assets
COPY kb_resources ./kb_resources
COPY sensors ./sensors
COPY telegram_bridge ./telegram_bridge
COPY mcp_server ./mcp_server
RUN pip install --no-cache-dir .
COPY workspace.yaml workspace-grpc.yaml workspace-socket.yaml ./
# The folder of the code server's gRPC socket (the compose volume kb-grpc
# takes its mode 0700): Dagster's gRPC has no authentication, so no TCP port.
RUN mkdir -m 0700 /run/kb-grpc

# All data in one volume. The DuckDB file has one writer: only the
# container that runs the code location (and its runs) writes it.
ENV KB_HOME=/data \
    DAGSTER_HOME=/data/dagster \
    KB_CHROMIUM_PATH=/usr/bin/chromium \
    HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1
VOLUME /data
EXPOSE 3000

# The code location. The compose file gives each other container its command.
CMD ["sh", "-c", "python -m kb_assets.instance_config && exec dagster api grpc -m kb_assets.definitions --socket /run/kb-grpc/code-server.sock"]
