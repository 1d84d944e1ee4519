"""Serving benchmark: the MCP server (kb-mcp) and a cold `kb search`.

    .venv/bin/python benchmarks/bench_serving.py mcp --home /tmp/kb-demo [--calls 30]
    .venv/bin/python benchmarks/bench_serving.py mcp --passages 100000
    .venv/bin/python benchmarks/bench_serving.py cold --home /tmp/kb-demo [--runs 3]
    .venv/bin/python benchmarks/bench_serving.py memory --home /tmp/kb-demo [--clients 3] [--calls 30]
    .venv/bin/python benchmarks/bench_serving.py memory --passages 100000 [--keep DIR]

mcp: starts `python -m mcp_server.server` (--service: `kb web`, then the
console command kb-mcp, which relays to it) on KB_HOME and speaks JSON-RPC on
its stdin and stdout, as an agent client does. It measures the time from the
start to the "kb-mcp serves" log line (ready), the first search_bookmarks
after ready, and the warm calls: each call has a new query text, so the
query embedding is in every call. It also reports the CPU time of the server
process per warm call and its resident memory at the end (psutil).

--home: an existing KB_HOME, for example the demo (`kb demo --home DIR`),
with the local model. --passages N: a new KB_HOME in a temporary folder with
N synthetic passages (the corpus of bench_index.py) and random 256-dimension
vectors that the index records as the hash embedder's, so the server embeds
each query with KB_EMBED_BACKEND=hash (no model). The figures then show the
search and the memory at that size, not the local model.

memory: starts --clients kb-mcp servers one after the other (as agent
clients start them), then `kb web`, each with --calls searches. After each
start it waits until every process is idle (the word counts end on a thread
of their own), and then reads /proc/PID/smaps_rollup of each process: RSS,
PSS (a shared page counts for a share), USS (the pages that only this
process holds) and the anonymous memory (not backed by a file). The sum of
the PSS of all the processes is what they cost the machine together: its
growth from one client to the next is the cost of a further client.
--service: kb web (the search service, mcp_server/service.py) starts
first, so each kb-mcp relays to it; the sums then hold kb web too.
--keep DIR (with --passages): build the synthetic KB_HOME in DIR, or use it
when it is there already (a build of 1,000,000 passages takes minutes).

memory-parts: in one new process on --home (local model) or --keep (a
synthetic home, hash embedder), the memory after each step of a server's
start: imports, a first search, the index prewarm, the passage rows, the
word counts, a hybrid search (and, in a synthetic home, 300 hybrid
searches of corpus words). --rows-files: the rows from memory-mapped
files, as kb web reads them.

cold: runs `kb search QUERY -n 3` in a new process, then the same steps in a
new process with a timer on each: import, query model load, query
embedding, search.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUERIES = ["rust borrow checker", "sourdough starter", "how do transformers attend", "vector database index",
           "espresso grind size", "kubernetes operator", "python packaging", "local first software",
           "attention is all you need", "sqlite performance"]


def synthetic_home(passages: int, folder: Path) -> None:
    """A KB_HOME whose index holds `passages` synthetic passages."""
    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_index import make_corpus

    from kb.index.client import ChunkIndex
    from kb.settings import Settings

    rows, _, _, _ = make_corpus(passages)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((len(rows), 256)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    by_text = {row["text"]: vector for row, vector in zip(rows, vectors)}

    class HashNamed:
        # The name and dimension of the hash embedder: the server then embeds
        # queries with it. The passage vectors are random.
        model_name, dim, stats = "hash:bow-256", 256, {}

        def keeping_to(self, recorded_model):
            return self

        def embed_documents(self, texts):
            return np.stack([by_text[t] for t in texts])

    index = ChunkIndex.from_settings(Settings(kb_home=folder))
    for at in range(0, len(rows), 20_000):
        part = rows[at:at + 20_000]
        index.replace_chunks(sorted({r["tweet_id"] for r in part}), [dict(r) for r in part], HashNamed())
    index.maintain(skip_if_current=True)


def bench_mcp(home: Path, calls: int, backend: str, service: bool = False) -> dict:
    """kb-mcp alone (`python -m mcp_server.server`), or, with service, the
    console command kb-mcp relayed to kb web (started first)."""
    import psutil

    env = {**os.environ, "KB_HOME": str(home), "HF_HUB_OFFLINE": "1", "KB_EMBED_BACKEND": backend,
           "PYTHONPATH": str(REPO)}
    web = start_web(env)[0] if service else None
    try:
        client = McpClient(env, None if service else [sys.executable, "-m", "mcp_server.server"])
        ready_s = client.open()
        first = client.search("machine learning papers")
        # The CPU of the process that searches: kb web when it relays.
        process = psutil.Process(web.pid if web else client.process.pid)
        cpu_before = sum(process.cpu_times()[:2])
        warm = [client.search(q) for q in call_queries(calls)]
        cpu_ms = (sum(process.cpu_times()[:2]) - cpu_before) * 1000 / calls
        rss_mb = process.memory_info().rss / 1e6
        client.close()
    finally:
        if web is not None:
            web.terminate()
            web.wait(10)
    ordered = sorted(warm)
    return {"start_to_ready_s": round(ready_s, 2), "first_search_ms": round(first, 1),
            "warm_p50_ms": round(statistics.median(warm), 1),
            "warm_p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
            "server_cpu_ms_per_call": round(cpu_ms, 1), "server_rss_mb": round(rss_mb, 1), "calls": calls,
            "relayed": service, "warm_up_log": [line[-90:] for line in client.log if "loaded the query" in line]}


def memory_of(pid: int) -> dict:
    """RSS, PSS, USS and anonymous memory of a process, in MB, from
    /proc/PID/smaps_rollup (kB there)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return {"rss_mb": round(fields["Rss"] / 1024, 1), "pss_mb": round(fields["Pss"] / 1024, 1),
            "uss_mb": round((fields["Private_Clean"] + fields["Private_Dirty"]) / 1024, 1),
            "anonymous_mb": round(fields["Anonymous"] / 1024, 1)}


def wait_idle(pids: list[int], quiet_s: float = 3.0, timeout_s: float = 900.0) -> float:
    """Wait until no process of `pids` used more than 2% of a core for
    quiet_s seconds. Returns the seconds waited."""
    import psutil

    processes = [psutil.Process(pid) for pid in pids]
    started = time.monotonic()
    last = [sum(p.cpu_times()[:2]) for p in processes]
    quiet_since = time.monotonic()
    while time.monotonic() - started < timeout_s:
        time.sleep(0.5)
        now = [sum(p.cpu_times()[:2]) for p in processes]
        if any(b - a > 0.01 for a, b in zip(last, now)):
            quiet_since = time.monotonic()
        last = now
        if time.monotonic() - quiet_since >= quiet_s:
            break
    return round(time.monotonic() - started, 1)


class McpClient:
    """One kb-mcp process (the console command, as an agent client starts
    it), spoken to over its stdin and stdout."""

    def __init__(self, env: dict[str, str], command: list[str] | None = None):
        command = command or [str(Path(sys.executable).with_name("kb-mcp"))]
        self.started = time.perf_counter()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env, text=True, bufsize=1)
        self.log: list[str] = []
        self.ready = threading.Event()
        self._ident = 0
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            if "kb-mcp serves" in line or "kb-mcp relays" in line:
                self.ready.set()

    def rpc(self, method: str, params: dict) -> dict:
        self._ident += 1
        ident = self._ident
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
                                 + "\n")
        self.process.stdin.flush()
        while True:
            message = json.loads(self.process.stdout.readline())
            if message.get("id") == ident:
                return message

    def open(self) -> float:
        if not self.ready.wait(600):
            self.process.kill()
            raise SystemExit("kb-mcp did not get ready:\n" + "\n".join(self.log[-20:]))
        ready_s = time.perf_counter() - self.started
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "bench", "version": "1"}})
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        self.process.stdin.flush()
        return ready_s

    def search(self, query: str) -> float:
        at = time.perf_counter()
        # The fast search: the serving figures are of it (the deep search
        # is MCP's default since issue 49, and adds the cross-encoder).
        answer = self.rpc("tools/call", {"name": "search_bookmarks", "arguments": {"query": query, "rerank": False}})
        assert "result" in answer and not answer["result"].get("isError"), answer
        return (time.perf_counter() - at) * 1000

    def close(self) -> None:
        self.process.stdin.close()
        self.process.terminate()
        self.process.wait(10)


def start_web(env: dict[str, str]) -> tuple[subprocess.Popen, int, float]:
    """`kb web` on a free loopback port; returns when it answers."""
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.perf_counter()
    process = subprocess.Popen([str(Path(sys.executable).with_name("kb")), "web", "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while time.perf_counter() - started < 600:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5).read()
            return process, port, time.perf_counter() - started
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"kb web stopped with code {process.returncode}")
            time.sleep(0.2)
    process.kill()
    raise SystemExit("kb web did not answer in 600 s")


def web_search(port: int, query: str) -> float:
    import urllib.parse
    import urllib.request

    at = time.perf_counter()
    answer = json.loads(urllib.request.urlopen(
        f"http://127.0.0.1:{port}/api/search?" + urllib.parse.urlencode({"q": query}), timeout=60).read())
    assert "hits" in answer, answer
    return (time.perf_counter() - at) * 1000


def call_queries(calls: int) -> list[str]:
    return [f"{QUERIES[i % len(QUERIES)]} {i // len(QUERIES)}" if i >= len(QUERIES) else QUERIES[i]
            for i in range(calls)]


def bench_memory(home: Path, clients: int, calls: int, backend: str, service: bool = False) -> dict:
    """Memory of kb-mcp servers (one after the other) and of kb web: see the
    module text. service: kb web starts first, so each kb-mcp relays to it."""
    env = {**os.environ, "KB_HOME": str(home), "HF_HUB_OFFLINE": "1", "KB_EMBED_BACKEND": backend,
           "PYTHONPATH": str(REPO)}
    running: list[McpClient] = []
    steps = []
    web = None
    try:
        if service:
            web, port, web_ready_s = start_web(env)
        for number in range(1, clients + 1):
            client = McpClient(env)
            running.append(client)
            ready_s = client.open()
            warm = [client.search(q) for q in call_queries(calls)]
            pids = [c.process.pid for c in running] + ([web.pid] if web else [])
            waited = wait_idle(pids)
            memory = [memory_of(pid) for pid in pids]
            steps.append({"clients": number, "ready_s": round(ready_s, 2),
                          "warm_p50_ms": round(statistics.median(warm), 1), "idle_after_s": waited,
                          "newest": memory[number - 1], "sum_pss_mb": round(sum(m["pss_mb"] for m in memory), 1),
                          "sum_uss_mb": round(sum(m["uss_mb"] for m in memory), 1),
                          "mode": "relay" if any("relays" in line for line in client.log) else "alone"})
            print(json.dumps(steps[-1]), flush=True)
        for client in running:
            client.close()
        running = []
        if web is None:
            web, port, web_ready_s = start_web(env)
        warm = [web_search(port, q) for q in call_queries(calls)]
        waited = wait_idle([web.pid])
        web_step = {"ready_s": round(web_ready_s, 2), "warm_p50_ms": round(statistics.median(warm), 1),
                    "idle_after_s": waited, **memory_of(web.pid)}
        print(json.dumps({"kb_web": web_step}), flush=True)
    finally:
        for client in running:
            client.process.kill()
        if web is not None:
            web.terminate()
            web.wait(10)
    return {"kb_mcp": steps, "kb_web": web_step, "service": service,
            "further_client_pss_mb": [round(b["sum_pss_mb"] - a["sum_pss_mb"], 1) for a, b in zip(steps, steps[1:])]}


PARTS_STEPS = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, os.environ["BENCH_DIR"])
from bench_serving import memory_of
steps = {"start": memory_of(os.getpid())}
import kb.index.exact_words as E
import kb.index.search as S
from kb.index.embed_local import use_cpu_threads
from kb.index.client import ChunkIndex
from kb.index.store import CHUNKS
use_cpu_threads(1)
steps["imports"] = memory_of(os.getpid())
index = ChunkIndex.from_settings(rows_dir=os.environ.get("ROWS_DIR", ""))
table = index.dataset(CHUNKS)
table.count_rows()
steps["table opened"] = memory_of(os.getpid())
S.prewarm_indexes(table)
steps["index prewarm (as warm_up(): the vector index in Lance's cache)"] = memory_of(os.getpid())
rows = index.passage_rows(table)
steps["passage rows"] = memory_of(os.getpid())
rows.words_of = E.lowered_words
E._count_words(rows)  # as warm_up() starts it, on its thread
steps["word counts"] = memory_of(os.getpid())
S.search("warm up", index=index, limit=1, mode="bm25")
steps["a bm25 search"] = memory_of(os.getpid())
try:
    S.search("vector database", index=index, limit=10)
    steps["a hybrid search (query model loaded)"] = memory_of(os.getpid())
except Exception as exc:  # an index of bench_index.py records a model that no embedder gives
    steps["a hybrid search"] = str(exc)[:100]
if os.environ["KB_EMBED_BACKEND"] == "hash":
    # A synthetic home: queries of its own words, so that the full-text
    # index loads the posting lists that such queries read.
    # An index of bench_index.py: random query vectors of its size.
    from bench_index import corpus_queries
    import numpy as np
    known_model = "a hybrid search (query model loaded)" in steps
    size = table.schema.field("vector").type.list_size
    random = np.random.default_rng(3)
    cpu, wall, times = time.process_time(), time.perf_counter(), []
    for query in corpus_queries(300):
        vector = None if known_model else random.standard_normal(size).astype(np.float32)
        started = time.perf_counter()
        S.search(query, index=index, limit=10,
                 query_vector=None if vector is None else vector / np.linalg.norm(vector))
        times.append((time.perf_counter() - started) * 1000)
    steps["300 hybrid searches of corpus words"] = memory_of(os.getpid())
    times.sort()
    steps["300 searches: CPU ms per search, wall p50 / p95 ms"] = [
        round((time.process_time() - cpu) * 1000 / 300, 1), round(times[150], 1), round(times[284], 1)]
    steps["Lance index cache MB"] = round(table.session().size_bytes() / 1e6, 1)
print(json.dumps(steps))
"""


def bench_memory_parts(home: Path, backend: str, rows_files: bool = False) -> dict:
    """Resident memory after each step of a server's start, in one new
    process: where the memory of the passages goes."""
    env = {**os.environ, "KB_HOME": str(home), "HF_HUB_OFFLINE": "1", "KB_EMBED_BACKEND": backend,
           "PYTHONPATH": str(REPO), "BENCH_DIR": str(REPO / "benchmarks"),
           "ROWS_DIR": str(home / "cache" / "passage-rows") if rows_files else ""}
    done = subprocess.run([sys.executable, "-c", PARTS_STEPS], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


COLD_STEPS = """
import json, sys, time
t0 = time.perf_counter()
import kb.index.search as S
t1 = time.perf_counter()
from kb.index.embed_local import use_cpu_threads
from kb.index.client import ChunkIndex
from kb.index.search import embedder_for_index
use_cpu_threads(1)
index = ChunkIndex.from_settings()
embedder = embedder_for_index(index.model_info())
embedder.model_name  # loads the query model
t2 = time.perf_counter()
vector = embedder.embed_query("vector database")
t3 = time.perf_counter()
S.search("vector database", index=index, embedder=embedder, query_vector=vector, limit=3)
t4 = time.perf_counter()
print(json.dumps({"import_kb_search_s": round(t1 - t0, 2), "model_load_s": round(t2 - t1, 2),
                  "query_embedding_ms": round((t3 - t2) * 1000, 1), "search_ms": round((t4 - t3) * 1000, 1),
                  "lancedb_imported": "lancedb" in sys.modules, "torch_imported": "torch" in sys.modules}))
"""


def bench_cold(home: Path, runs: int) -> dict:
    env = {**os.environ, "KB_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    walls, steps = [], []
    kb = str(Path(sys.executable).with_name("kb"))
    for _ in range(runs):
        at = time.perf_counter()
        subprocess.run([kb, "search", "vector database", "-n", "3"], env=env, check=True, capture_output=True)
        walls.append(round(time.perf_counter() - at, 2))
        done = subprocess.run([sys.executable, "-c", COLD_STEPS], env=env, check=True, capture_output=True, text=True)
        steps.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"kb_search_wall_s": walls, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["mcp", "cold", "memory", "memory-parts"])
    parser.add_argument("--home", type=Path, help="an existing KB_HOME (local model)")
    parser.add_argument("--passages", type=int, help="mcp: a new KB_HOME with this many synthetic passages")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=3, help="memory: kb-mcp servers, one after the other")
    parser.add_argument("--service", action="store_true",
                        help="memory: kb web (the search service) starts first; each kb-mcp relays to it")
    parser.add_argument("--rows-files", action="store_true",
                        help="memory-parts: the passage rows as memory-mapped files (as kb web reads them)")
    parser.add_argument("--keep", type=Path, help="memory --passages: keep the synthetic KB_HOME here")
    args = parser.parse_args()
    if args.what == "memory-parts":
        backend = "local" if args.home else "hash"
        print(json.dumps(bench_memory_parts(args.home or args.keep, backend, args.rows_files), indent=2))
        return
    if args.what == "memory":
        if args.passages:
            home = args.keep or Path(tempfile.mkdtemp(prefix="kb-memory-"))
            if not (home / "lancedb").is_dir():
                built = time.perf_counter()
                synthetic_home(args.passages, home)
                print(f"built {args.passages} passages in {time.perf_counter() - built:.1f} s", flush=True)
            print(json.dumps(bench_memory(home, args.clients, args.calls, "hash", args.service), indent=2))
            return
        print(json.dumps(bench_memory(args.home, args.clients, args.calls, "local", args.service), indent=2))
        return
    if args.what == "cold":
        print(json.dumps(bench_cold(args.home, args.runs), indent=2))
        return
    if args.passages:
        with tempfile.TemporaryDirectory(prefix="kb-serving-") as tmp:
            built = time.perf_counter()
            synthetic_home(args.passages, Path(tmp))
            print(f"built {args.passages} passages in {time.perf_counter() - built:.1f} s", flush=True)
            print(json.dumps(bench_mcp(Path(tmp), args.calls, "hash", args.service), indent=2))
        return
    print(json.dumps(bench_mcp(args.home, args.calls, "local", args.service), indent=2))


if __name__ == "__main__":
    main()
