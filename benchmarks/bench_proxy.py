"""The fetch guard's proxy: the time and CPU of one request through it.

kb's proxy (kb/guards/fetch_guard.py, GuardProxy) parses each request of
the browser, yt-dlp and requests. Issue 57 asked for a well-kept parser
(h11) in place of kb's own, where it measures as fast. This benchmark
sends `--requests` requests through the proxy to a loopback site, each on
its own connection as the browser's page loads do: a GET, and a POST of
`--body` bytes. It prints p50 and p95 of the wall time per request, and
the CPU seconds of this process per request (the proxy runs in it).

    .venv/bin/python benchmarks/bench_proxy.py --requests 400
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time


def _site() -> tuple[socket.socket, threading.Event]:
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            conn, _ = server.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    return server, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--body", type=int, default=4096)
    args = parser.parse_args()
    server, stop = _site()
    port = server.getsockname()[1]
    os.environ["KB_FETCH_ALLOW_HOSTS"] = f"127.0.0.1:{port}"
    from kb.guards.fetch_guard import FetchGuard, GuardProxy

    body = b"x" * args.body
    with GuardProxy(FetchGuard.from_settings(), timeout_s=5) as proxy:
        host, proxy_port = proxy.url.removeprefix("http://").split(":")
        for method in ("GET", "POST"):
            extra = f"Content-Length: {len(body)}\r\n" if method == "POST" else ""
            request = (f"{method} http://127.0.0.1:{port}/p HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n"
                       .encode() + (body if method == "POST" else b""))
            times = []
            cpu = time.process_time()
            for _ in range(args.requests):
                start = time.perf_counter()
                with socket.create_connection((host, int(proxy_port))) as sock:
                    sock.sendall(request)
                    answer = b""
                    while block := sock.recv(65536):
                        answer += block
                assert answer.endswith(b"ok"), answer[:100]
                times.append(time.perf_counter() - start)
            cpu = time.process_time() - cpu
            times.sort()
            print(f"{method}: p50 {statistics.median(times) * 1000:.2f} ms, "
                  f"p95 {times[int(len(times) * 0.95)] * 1000:.2f} ms, "
                  f"CPU {cpu / args.requests * 1000:.2f} ms per request ({args.requests} requests)")
    stop.set()
    print(f"load average: {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()
