"""Load benchmark: 8 clients search while a sync writes the index.

The serving side must keep answering while a sync runs: it reads LanceDB
only, and a LanceDB reader sees one committed version while the writer
commits the next one (DESIGN.md, "Stores"). This benchmark measures it.

- The index: `--bookmarks` stable bookmarks of 3 passages each (each with
  a rare key word of its own), plus `--churn` bookmarks that the writer
  rewrites again and again.
- The writer (a separate process, as a sync is): ChunkIndex.replace_chunks
  of the churn bookmarks in a loop, each time with new texts and a new
  number of passages, so the embedder works; bookmark cards and
  ChunkIndex.maintain() (compaction, index update, old versions pruned)
  every few commits, as the `chunk_index` asset does at the end of a sync.
- The clients: `--cli` processes that call kb.index.search.search() as
  `kb search` does, and `--mcp` MCP clients, each with its own
  `python -m mcp_server.server` over stdio (an agent client starts its own
  server), calling search_bookmarks. All start together, after the writer's
  first commit, and each sends `--queries` queries.

Every answer is checked: a rare-key query must give its bookmark first, and
a churn hit must come from one committed version (its passage count is the
count of the version that its text names). A wrong answer counts as an
error, as an exception does. The report gives p50 and p95 per client kind.

    .venv/bin/python benchmarks/bench_load.py              # the local model (all-MiniLM-L6-v2)
    .venv/bin/python benchmarks/bench_load.py --backend hash --queries 20

tests/test_load.py runs the same harness, small, with the hash embedder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script from any folder

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WORDS = ("river delta glacier valley harbour bridge tunnel engine compiler kernel network database index "
         "storage memory cache thread process signal garden forest meadow orchard recipe bread cheese "
         "market trade money bank ledger court law treaty border ocean island coral reef storm cloud").split()
CHURN_AUTHOR = "churner"


# --- the corpus ---------------------------------------------------------------------------
def stable_rows(n_bookmarks: int, seed: int = 7) -> list[dict]:
    """3 passages per bookmark; passage 0 holds the bookmark's rare key word."""
    rng = random.Random(seed)
    rows = []
    for b in range(n_bookmarks):
        tweet_id = f"s{b}"
        for p in range(3):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90)))
            text = f"{rare_key(b)} {words}" if p == 0 else words
            rows.append({"chunk_id": f"{tweet_id}-{p}", "tweet_id": tweet_id, "url": f"https://x.com/u/status/{b}",
                         "author": f"user{b % 50}", "created_at": T0 + timedelta(hours=b), "source": "post",
                         "ref": f"https://x.com/u/status/{b}", "position": p, "text": text})
    return rows


def rare_key(bookmark: int) -> str:
    return f"zq{bookmark}key"


def churn_count(version: int) -> int:
    """Passages of each churn bookmark in this version: it changes every commit."""
    return 3 + version % 5


def churn_rows(version: int, n_churn: int) -> list[dict]:
    rows = []
    for c in range(n_churn):
        tweet_id = f"c{c}"
        for p in range(churn_count(version)):
            rows.append({"chunk_id": f"{tweet_id}-{p}", "tweet_id": tweet_id, "url": f"https://x.com/c/status/{c}",
                         "author": CHURN_AUTHOR, "created_at": T0, "source": "link", "ref": f"https://example.com/{c}",
                         "position": p,
                         "text": f"ver{version} churn passage {p} of bookmark {c}: " + " ".join(WORDS[(version + p) % 20:][:25])})
    return rows


def cards(tweet_ids: list[str], synced: datetime) -> list[dict]:
    return [{"tweet_id": t, "url": f"https://x.com/u/status/{t}", "author": "u", "author_name": "U", "created_at": T0,
             "text": f"card of {t}", "lang": "en", "last_sync": synced, "links": [], "media": []} for t in tweet_ids]


def build_index(lancedb_dir: Path, backend: str, n_bookmarks: int, n_churn: int) -> None:
    from kb.index.embedder import Embedder
    from kb.index.client import ChunkIndex

    index = ChunkIndex.from_settings(path=str(lancedb_dir))
    embedder = Embedder.from_settings(backend=backend, cache_dir=str(lancedb_dir))
    rows = stable_rows(n_bookmarks)
    for start in range(0, len(rows), 3000):
        part = rows[start:start + 3000]
        index.replace_chunks(sorted({r["tweet_id"] for r in part}), part, embedder)
    index.replace_chunks([f"c{c}" for c in range(n_churn)], churn_rows(0, n_churn), embedder)
    index.upsert_bookmark_cards(cards([f"s{b}" for b in range(n_bookmarks)], T0))
    index.maintain()


# --- the writer: a sync that rewrites the churn bookmarks -------------------------------------
def write_loop(lancedb_dir: str, backend: str, n_churn: int, stop, commits, errors, maintain_every: int = 5) -> None:
    """Commit new versions until `stop` is set. `commits` is a shared counter
    (multiprocessing.Value or a one-item list); `errors` collects texts."""
    from kb.index.embedder import Embedder
    from kb.index.client import ChunkIndex

    index = ChunkIndex.from_settings(path=lancedb_dir)
    embedder = Embedder.from_settings(backend=backend, cache_dir=lancedb_dir)
    ids = [f"c{c}" for c in range(n_churn)]
    version = 0
    while not stop.is_set():
        version += 1
        try:
            index.replace_chunks(ids, churn_rows(version, n_churn), embedder)
            if version % maintain_every == 0:
                index.upsert_bookmark_cards(cards(ids, datetime.now(timezone.utc)))
                index.maintain()
        except Exception:  # noqa: BLE001 - reported in the result
            errors.append(f"writer, version {version}: {traceback.format_exc(limit=3)}")
            return
        if hasattr(commits, "value"):
            with commits.get_lock():
                commits.value = version
        else:
            commits[0] = version


# --- queries and the check of each answer ------------------------------------------------------
@dataclass(frozen=True)
class Query:
    text: str
    expect_first: str | None = None  # the tweet id that must come first
    author: str | None = None


def queries(n_bookmarks: int, count: int, seed: int) -> list[Query]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            b = rng.randrange(n_bookmarks)
            out.append(Query(f"{rare_key(b)} {rng.choice(WORDS)}", expect_first=f"s{b}"))
        elif kind == 1:
            out.append(Query(" ".join(rng.sample(WORDS, 3))))
        else:
            out.append(Query("churn passage bookmark", author=CHURN_AUTHOR))
    return out


def answer_problem(query: Query, hits: list[dict]) -> str | None:
    """What is wrong with an answer, or None."""
    if not hits:
        return f"{query.text!r}: no hits"
    if query.expect_first and hits[0]["tweet_id"] != query.expect_first:
        return f"{query.text!r}: first hit {hits[0]['tweet_id']}, expected {query.expect_first}"
    for hit in hits:
        text = hit["best_chunk"]
        if hit["tweet_id"].startswith("c") and text.startswith("ver"):
            version = int(text.split()[0].removeprefix("ver"))
            if hit["chunk_count"] != churn_count(version):
                return (f"{query.text!r}: bookmark {hit['tweet_id']} of version {version} has "
                        f"{hit['chunk_count']} passages, not {churn_count(version)}: two versions mixed")
    return None


# --- clients ---------------------------------------------------------------------------------
@dataclass
class ClientResult:
    kind: str
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def cli_client(lancedb_dir: str, backend: str, batch: list[Query], go=None) -> ClientResult:
    """What `kb search` does, in this thread or process: search() on the index."""
    from kb.index.search import search
    from kb.index.embedder import Embedder
    from kb.index.client import ChunkIndex

    result = ClientResult("cli")
    index = ChunkIndex.from_settings(path=lancedb_dir)
    embedder = Embedder.from_settings(backend=backend, cache_dir=lancedb_dir)
    # Warm up as an MCP client does with its first call: the model, the
    # index files and the full-text index are loaded before the clock runs.
    search("warm up", limit=1, index=index, embedder=embedder)
    if go is not None:
        go.wait()
    for query in batch:
        started = time.perf_counter()
        try:
            response = search(query.text, author=query.author, limit=10, index=index, embedder=embedder)
            hits = [h.to_dict() for h in response.hits]
        except Exception as exc:  # noqa: BLE001 - counted
            result.errors.append(f"{query.text!r}: {type(exc).__name__}: {exc}")
            continue
        result.latencies_ms.append((time.perf_counter() - started) * 1000)
        problem = answer_problem(query, hits)
        if problem:
            result.errors.append(problem)
    return result


def cli_process(args: tuple) -> ClientResult:
    """cli_client in a process of its own (multiprocessing)."""
    from kb.index.embed_local import use_cpu_threads

    lancedb_dir, backend, batch, go = args
    use_cpu_threads(1)  # as a serving process does (kb-mcp; `kb search` once wired)
    return cli_client(lancedb_dir, backend, batch, go)


async def mcp_clients(home: Path, env: dict, batches: list[list[Query]], ready: threading.Event,
                      go: threading.Event, timeout_s: float = 120) -> list[ClientResult]:
    """One MCP server process per client, each over its own stdio session."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server.server"], env=env,
                                   cwd=str(home.parent))
    sessions_up = 0
    all_up = asyncio.Event()

    async def one(n: int, batch: list[Query]) -> ClientResult:
        nonlocal sessions_up
        result = ClientResult("mcp")
        with open(home.parent / f"mcp-{n}.stderr", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await session.call_tool("search_bookmarks", {"query": "warm up", "rerank": False})
                    sessions_up += 1
                    if sessions_up == len(batches):
                        all_up.set()
                    await all_up.wait()
                    ready.set()
                    await asyncio.get_running_loop().run_in_executor(None, go.wait)
                    for query in batch:
                        # The fast search: the figures of this benchmark are
                        # of it (the deep search is MCP's default since issue 49).
                        arguments = {"query": query.text, "limit": 10, "rerank": False}
                        if query.author:
                            arguments["author"] = query.author
                        started = time.perf_counter()
                        try:
                            answer = await asyncio.wait_for(session.call_tool("search_bookmarks", arguments), timeout_s)
                        except Exception as exc:  # noqa: BLE001 - counted
                            result.errors.append(f"{query.text!r}: {type(exc).__name__}: {exc}")
                            continue
                        result.latencies_ms.append((time.perf_counter() - started) * 1000)
                        if answer.is_error:
                            result.errors.append(f"{query.text!r}: {answer.content[0].text}")
                            continue
                        problem = answer_problem(query, answer.structured_content["hits"])
                        if problem:
                            result.errors.append(problem)
        return result

    return list(await asyncio.gather(*(one(n, batch) for n, batch in enumerate(batches))))


# --- one run ---------------------------------------------------------------------------------
@dataclass
class LoadReport:
    clients: list[ClientResult]
    writer_commits: int  # while the clients searched
    writer_errors: list[str]
    seconds: float

    @property
    def errors(self) -> list[str]:
        return self.writer_errors + [e for c in self.clients for e in c.errors]

    def latencies(self, kind: str | None = None) -> list[float]:
        return [t for c in self.clients if kind in (None, c.kind) for t in c.latencies_ms]

    def summary(self) -> dict:
        out = {"seconds": round(self.seconds, 1), "writer_commits": self.writer_commits,
               "errors": len(self.errors), "queries": len(self.latencies())}
        for kind in ("cli", "mcp", None):
            times = self.latencies(kind)
            if times:
                out[kind or "all"] = percentiles(times)
        out["p50_ms_per_client"] = [round(statistics.median(c.latencies_ms), 1) for c in self.clients if c.latencies_ms]
        return out


def percentiles(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 1),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
            "max_ms": round(ordered[-1], 1)}


def run_load(home: Path, *, backend: str, n_bookmarks: int, n_churn: int, cli: int, mcp: int, per_client: int,
             cli_in_processes: bool, writer_in_process: bool, seed: int = 1) -> LoadReport:
    """Build the index in home/lancedb, then run the writer and the clients."""
    lancedb_dir = home / "lancedb"
    build_index(lancedb_dir, backend, n_bookmarks, n_churn)
    batches = [queries(n_bookmarks, per_client, seed + n) for n in range(cli + mcp)]
    env = {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
           "KB_HOME": str(home), "KB_EMBED_BACKEND": backend, "KB_CONFIG_FILE": str(home / "none.toml"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager() if (cli_in_processes or writer_in_process) else None
    stop = manager.Event() if writer_in_process else threading.Event()
    writer_errors = manager.list() if writer_in_process else []
    commits = ctx.Value("i", 0) if writer_in_process else [0]
    go = manager.Event() if cli_in_processes else threading.Event()
    mcp_ready = threading.Event()

    mcp_results: list[ClientResult] = []
    mcp_failure: list[BaseException] = []

    def mcp_thread() -> None:
        try:
            mcp_results.extend(asyncio.run(mcp_clients(home, env, batches[cli:], mcp_ready, go)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            mcp_failure.append(exc)
            mcp_ready.set()

    threads = []
    if mcp:
        threads.append(threading.Thread(target=mcp_thread, name="mcp-clients"))
        threads[-1].start()
    cli_results: list[ClientResult] = []
    pool = None
    if cli_in_processes and cli:
        pool = ctx.Pool(cli)
        pending = pool.map_async(cli_process, [(str(lancedb_dir), backend, b, go) for b in batches[:cli]])
    else:
        for batch in batches[:cli]:
            thread = threading.Thread(target=lambda b=batch: cli_results.append(
                cli_client(str(lancedb_dir), backend, b, go)))
            threads.append(thread)
            thread.start()

    def committed() -> int:
        return commits.value if hasattr(commits, "value") else commits[0]

    # The clients get ready first (servers started, models loaded): a start
    # is not a search. Then the writer starts, and once it has committed,
    # every client starts at the same time.
    deadline = time.monotonic() + 300
    while mcp and not mcp_ready.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # cli clients load their embedder before they wait for `go`
    if writer_in_process:
        writer = ctx.Process(target=write_loop, args=(str(lancedb_dir), backend, n_churn, stop, commits, writer_errors))
    else:
        writer = threading.Thread(target=write_loop, args=(str(lancedb_dir), backend, n_churn, stop, commits,
                                                           writer_errors))
    writer.start()
    while committed() < 1 and time.monotonic() < deadline and writer.is_alive() and not writer_errors:
        time.sleep(0.02)
    first_commit = committed()
    started = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    if pool is not None:
        cli_results = pending.get()
        pool.close()
        pool.join()
    seconds = time.perf_counter() - started
    stop.set()
    writer.join(60)
    if mcp_failure:
        raise mcp_failure[0]
    report = LoadReport(cli_results + mcp_results, committed() - first_commit, list(writer_errors), seconds)
    if manager is not None:
        manager.shutdown()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="local", help="embedder: local (all-MiniLM-L6-v2) or hash")
    parser.add_argument("--bookmarks", type=int, default=2000)
    parser.add_argument("--churn", type=int, default=20)
    parser.add_argument("--cli", type=int, default=4, help="client processes that call search()")
    parser.add_argument("--mcp", type=int, default=4, help="MCP clients, each with its own server")
    parser.add_argument("--queries", type=int, default=40, help="queries per client")
    parser.add_argument("--out", type=Path, help="write the summary as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-bench-load-") as folder:
        home = Path(folder) / "kb_home"
        home.mkdir()
        built = time.perf_counter()
        report = run_load(home, backend=args.backend, n_bookmarks=args.bookmarks, n_churn=args.churn,
                          cli=args.cli, mcp=args.mcp, per_client=args.queries, cli_in_processes=True,
                          writer_in_process=True)
        summary = {"backend": args.backend, "bookmarks": args.bookmarks, "churn": args.churn, "cli_clients": args.cli,
                   "mcp_clients": args.mcp, "queries_per_client": args.queries, "cpus": os.cpu_count(),
                   "total_s": round(time.perf_counter() - built, 1), **report.summary()}
    print(json.dumps(summary, indent=2))
    for error in report.errors[:10]:
        print("ERROR:", error)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if report.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
