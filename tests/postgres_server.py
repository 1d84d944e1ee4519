"""A real PostgreSQL server on 127.0.0.1 for the tests: Debian's
`postgresql` package (.ci/run installs it), a new cluster in a temp folder,
a free port, a password. initdb refuses root, so as root the server runs as
the `postgres` user."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

USER = "kb"


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: install the Debian package `postgresql` (.ci/run does)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def postgres_server():
    """Yield a postgresql:// URL of a new server with one database `dagster`."""
    bin_dir = _bin_dir()
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    folder = Path(tempfile.mkdtemp(prefix="kb-pg-"))
    password = secrets.token_hex(12)
    (folder / "pw").write_text(password)
    if as_root:
        shutil.chown(folder, "postgres")
        shutil.chown(folder / "pw", "postgres")
    data, port = folder / "data", _free_port()

    def run(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, capture_output=True, cwd=folder)

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={folder / 'pw'}",
        "--auth=scram-sha-256", "--no-sync")
    # fsync off: a test cluster need not survive a power cut, and it saves seconds.
    options = f"-p {port} -h 127.0.0.1 -k {folder} -c fsync=off -c full_page_writes=off"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
    try:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=port, user=USER, password=password, dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE dagster")
        conn.close()
        yield f"postgresql://{USER}:{password}@127.0.0.1:{port}/dagster"
    finally:
        subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, cwd=folder)
        shutil.rmtree(folder, ignore_errors=True)
