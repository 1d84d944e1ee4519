"""Index benchmark: kb's LanceDB index against SQLite FTS5 + sqlite-vec.

For each corpus size (default 10k and 100k passages) it builds a synthetic
corpus: texts drawn from a Zipf-distributed pseudo-word list, 384-dimension
random unit vectors (the size of all-MiniLM-L6-v2), about 3 passages per
bookmark. Then it measures:

- kb: index build time (replace_chunks in batches, then maintain(): the
  full-text index, the scalar indexes and, above kb_vector_index_min_rows,
  the IVF vector index); the time to fold 1% new bookmarks into a built
  index, and the bytes of data files that it wrote (a full rewrite writes
  the whole table again); and the query time of kb.index.search.search() in
  hybrid, bm25 and dense modes (the whole function: retrieval, fusion,
  grouping by bookmark, chunk counts and bookmark cards), as wall time and
  as CPU time of the process (steadier on a shared machine).
- The same hits as a saved run: with --same-hits-as FILE, the top 10 of each
  hybrid query from search() against the top 10 that an earlier run wrote
  with --hits FILE (the corpus of a size is the same in each run: its
  generator has a fixed seed). And the recall of the vector index: its top
  100 against an exact (flat) search.
- SQLite, the stack of the tool that kb replaces: the same rows in an FTS5
  table and a sqlite-vec vec0 table (apsw loads the extension; Python's
  sqlite3 module cannot), queried with the same depth, fused by reciprocal
  rank fusion and grouped by bookmark.

Query vectors are given, so no time goes to embedding. Results are printed
as JSON and written to --out. Each size's figures name the commit of the code
and the load average of the machine before and after the size's run.

    .venv/bin/python benchmarks/bench_index.py --sizes 10000 100000 --hits HITS --out FILE
    .venv/bin/python benchmarks/bench_index.py --sizes 10000 100000 --same-hits-as HITS --out FILE
    .venv/bin/python benchmarks/bench_index.py --sizes 1000000 --out FILE

--light: see --help. --sqlite-sizes: the sizes at which the SQLite stack runs too (default: the
sizes up to 100,000; its build at 1,000,000 takes more than an hour; with no value: none).

Why a saved run and not old code: the benchmark once loaded the search code
of an old commit from git. That file moved (kb/search.py to
kb/index/search.py) and its imports moved with it, so the old code no longer
ran, and the benchmark stopped after its searches (issue 49). Saved hits
compare any two versions of the code, and need no old file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from kb.index.exact_words import wait_for_word_counts
from kb.index.search import search, warm_up
from kb.index.client import ChunkIndex
from kb.index.maintenance import vector_index_stats
from kb.index.store import CHUNKS, _lancedb
from run_facts import run_facts

# kb imports lancedb on first use (3 to 8 s here): load it now, so that the
# build time of the first corpus does not hold it.
_lancedb()

DIM = 384
# The SQLite stack builds row by row: about 100,000 rows a minute here.
SQLITE_MAX_DEFAULT = 100_000
DEPTH = 100  # passages per retriever, as kb's search fetches for limit <= 25
RRF_K = 60
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "po", "qu", "ba", "de", "fi", "go", "hu"]


class PrecomputedEmbedder:
    """Gives the corpus's synthetic vectors: the benchmark measures the index,
    not an embedding model."""

    model_name = "bench:random-384"
    dim = DIM
    stats = {"embedded": 0, "cached": 0}

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors

    def embed_documents(self, texts):
        return np.stack([self.vectors[t] for t in texts])

    def keeping_to(self, recorded_model):
        # ChunkIndex.embedder_for() asks every embedder for the one that
        # keeps to the recorded model: this one has one model only.
        return self


def vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES, rng.integers(2, 5))))
    return sorted(words)


def make_corpus(n: int, seed: int = 7) -> tuple[list[dict], dict[str, np.ndarray], list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = vocabulary(30_000, rng)
    ranks = np.arange(1, len(vocab) + 1)
    weights = ranks ** -1.07
    weights /= weights.sum()
    start = datetime(2020, 1, 1, tzinfo=timezone.utc)
    rows, vectors = [], {}
    all_vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    all_vectors /= np.linalg.norm(all_vectors, axis=1, keepdims=True)
    # rng.choice(len(vocab), size, p=weights) without its checks and its
    # cumulative sum in each call: the same draws (numpy's Generator.choice
    # does exactly this), 10 times faster at 1,000,000 passages.
    cdf = weights.cumsum()
    cdf /= cdf[-1]
    for i in range(n):
        words = cdf.searchsorted(rng.random(int(rng.integers(40, 200))), side="right")
        text = f"p{i} " + " ".join(vocab[w] for w in words)  # the id keeps every text unique
        tweet_id = str(i // 3)
        rows.append({"chunk_id": f"c{i}", "tweet_id": tweet_id, "url": f"https://x.com/u/status/{tweet_id}",
                     "author": f"user{int(tweet_id) % 200}", "created_at": start + timedelta(hours=int(tweet_id)),
                     "source": ("post", "link", "article", "video")[i % 4], "ref": f"https://example.com/{tweet_id}",
                     "position": i % 3, "text": text, "word_count": len(words) + 1, "lang": "en"})
        vectors[text] = all_vectors[i]
    queries = [" ".join(vocab[w] for w in rng.integers(50, 5000, size=int(rng.integers(2, 6)))) for _ in range(200)]
    picks = rng.integers(0, n, size=len(queries))
    noise = rng.standard_normal((len(queries), DIM)).astype(np.float32) * 0.05
    query_vectors = all_vectors[picks] + noise
    query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)
    return rows, vectors, queries, query_vectors


def corpus_queries(count: int, seed: int = 11) -> list[str]:
    """Query texts of the words of make_corpus() (the same vocabulary: it is
    the first draw of make_corpus's generator), drawn as its queries are,
    without making a corpus."""
    vocab = vocabulary(30_000, np.random.default_rng(7))
    rng = np.random.default_rng(seed)
    return [" ".join(vocab[w] for w in rng.integers(50, 5000, size=int(rng.integers(2, 6)))) for _ in range(count)]


def percentiles(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"p50_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2)}


@contextmanager
def peak_memory(out: dict, key: str):
    """Sets out[key] to the peak resident memory of this process during the
    block, in MB above its memory before the block."""
    import psutil

    process = psutil.Process()
    before = process.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        peak[0] = max(peak[0], process.memory_info().rss)
        out[key] = round((peak[0] - before) / 1e6, 1)


# Filtered searches: (name, search() arguments for query number i).
# The corpus's posts are one hour apart (make_corpus()): a window of 30
# days holds 720 bookmarks, about 2,160 passages.
FILTERS = (("hybrid_author", lambda i: {"author": f"user{i % 200}"}),
           ("hybrid_author_other_case", lambda i: {"author": f"@User{i % 200}"}),
           ("hybrid_3_sources", lambda i: {"source": ["post", "link", "article"]}),
           ("hybrid_1_source", lambda i: {"source": "video"}),
           ("hybrid_folder_50", lambda i: {"folder": "fifty"}),
           ("hybrid_folder_2000", lambda i: {"folder": "two thousand"}),
           ("hybrid_30_days", lambda i: {"after": datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(days=i % 30),
                                         "before": datetime(2020, 1, 31, tzinfo=timezone.utc) + timedelta(days=i % 30)}))


# --- kb (LanceDB) --------------------------------------------------------------
def data_bytes(folder: Path) -> dict[str, int]:
    data = folder / "lancedb" / "chunks.lance" / "data"
    return {f.name: f.stat().st_size for f in data.iterdir()} if data.is_dir() else {}


def bench_kb(rows, vectors, queries, query_vectors, folder: Path, light: bool = False,
             saved_hits: list | None = None) -> dict:
    # rows_dir: the passage rows and their stored vectors in mapped files, as
    # the search service of `kb web` (and kb-mcp through it) reads them.
    index = ChunkIndex.from_settings(path=str(folder / "lancedb"), rows_dir=str(folder / "rows"))
    if index.exists():  # --keep with an index built before: the searches only
        out = {"built_before": str(folder)}
    else:
        out = build_kb(rows, vectors, folder, index)
    return {**out, **search_kb(index, len(rows), queries, query_vectors, light, saved_hits)}


def build_kb(rows, vectors, folder: Path, index: ChunkIndex) -> dict:
    embedder = PrecomputedEmbedder(vectors)
    new_share = max(1, len(rows) // 100)
    base, fresh = rows[:-new_share], rows[-new_share:]
    memory: dict = {}
    started = time.perf_counter()
    cpu_started = time.process_time()
    batch = 20_000
    with peak_memory(memory, "build_peak_mb"):
        for at in range(0, len(base), batch):
            part = base[at:at + batch]
            index.replace_chunks(sorted({r["tweet_id"] for r in part}), [dict(r) for r in part], embedder)
        written = time.perf_counter()
        # skip_if_current=True: as the chunk_index asset calls it when no
        # passage was deleted.
        index.maintain(skip_if_current=True)
    built = time.perf_counter()
    build_cpu = time.process_time() - cpu_started
    built_partitions = vector_segments(index)
    print(f"{len(rows)} passages: built in {built - started:.1f} s", file=sys.stderr, flush=True)
    before_update = data_bytes(folder)
    # 1% new bookmarks (their tweet ids are new), as one sync batch does.
    update_started = time.perf_counter()
    update_cpu = time.process_time()
    with peak_memory(memory, "update_1pct_peak_mb"):
        index.replace_chunks(sorted({r["tweet_id"] for r in fresh}), [dict(r) for r in fresh], embedder)
        report = index.maintain(skip_if_current=True)
    updated = time.perf_counter()
    update_cpu = time.process_time() - update_cpu
    after_update = data_bytes(folder)
    out = {"write_s": round(written - started, 2), "maintain_s": round(built - written, 2),
           "build_s": round(built - started, 2), "update_1pct_s": round(updated - update_started, 2),
           "build_cpu_s": round(build_cpu, 1), "update_1pct_cpu_s": round(update_cpu, 1),
           "update_report": report, **memory,
           "table_data_bytes": sum(before_update.values()),
           "update_new_data_bytes": sum(v for k, v in after_update.items() if k not in before_update),
           "vector_index": index.counts()["vector_index"],
           "vector_partitions_built": built_partitions, "vector_partitions_after_update": vector_segments(index)}
    print(f"{len(rows)} passages: " + json.dumps(out), file=sys.stderr, flush=True)
    return out


def vector_segments(index: ChunkIndex) -> list[int]:
    """The partitions of each segment of the vector index (none: no index).
    A merge of segments can join partitions (kb.index.maintenance, ChunkIndex._compact)."""
    stats = vector_index_stats(index.dataset(CHUNKS))
    return [s["num_partitions"] for s in stats["indices"]] if stats else []


def search_kb(index: ChunkIndex, size: int, queries, query_vectors, light: bool,
              saved_hits: list | None = None) -> dict:
    out: dict = {}
    pairs = list(zip(queries, query_vectors))
    # As kb-mcp and kb web do before they say that they are ready. bm25: the
    # benchmark has no query embedder (its vectors are given).
    warm_up(index, mode="bm25")
    # The word counts end on a thread of their own after the warm-up: the
    # figures are those of a server that runs. (At 1,000,000 passages on a
    # loaded machine they took more than 300 s.)
    counting = time.perf_counter()
    assert wait_for_word_counts(index, timeout=3600), "the word counts did not end in 3600 s"
    out["word_counts_s"] = round(time.perf_counter() - counting, 1)
    for mode in ("hybrid",) if light else ("hybrid", "bm25", "dense"):
        for query, vector in pairs[:5]:  # warm the caches
            search(query, mode=mode, index=index, query_vector=vector)
        times = []
        cpu = time.process_time()
        for query, vector in pairs:
            t = time.perf_counter()
            response = search(query, mode=mode, index=index, query_vector=vector)
            times.append((time.perf_counter() - t) * 1000)
            assert response.hits or mode == "bm25", (mode, query)
        out[mode] = {**percentiles(times), "cpu_ms_per_query": round((time.process_time() - cpu) * 1000 / len(pairs), 2)}
        print(f"{size} passages: {mode} {json.dumps(out[mode])}", file=sys.stderr, flush=True)
    add_folders(index, size)
    for name, arguments in FILTERS:
        for i, (query, vector) in enumerate(pairs[:5]):
            search(query, index=index, query_vector=vector, **arguments(i))
        times = []
        cpu = time.process_time()
        for i, (query, vector) in enumerate(pairs):
            t = time.perf_counter()
            search(query, index=index, query_vector=vector, **arguments(i))
            times.append((time.perf_counter() - t) * 1000)
        out[name] = {**percentiles(times), "cpu_ms_per_query": round((time.process_time() - cpu) * 1000 / len(pairs), 2)}
        print(f"{size} passages: {name} {json.dumps(out[name])}", file=sys.stderr, flush=True)
    print(f"{size} passages: searches timed", file=sys.stderr, flush=True)
    out["top10"] = top10(index, pairs)
    if saved_hits is not None:
        out["same_hits_as_saved"] = compare_hits(out["top10"], saved_hits)
    out["vector_recall_at_100"] = vector_recall(index, query_vectors[:20] if light else query_vectors)
    return out


def add_folders(index: ChunkIndex, size: int) -> None:
    """Two bookmark folders for the folder filters: "fifty" (50 bookmarks,
    about 150 passages) and "two thousand" (about 6,000 passages), drawn
    from every bookmark of the corpus with a fixed seed."""
    from kb.index.folders import folder_rows, replace_folders

    rng = np.random.default_rng(5)
    bookmarks = max(1, size // 3)
    members = [("f50", str(t)) for t in rng.choice(bookmarks, size=min(50, bookmarks), replace=False)]
    members += [("f2000", str(t)) for t in rng.choice(bookmarks, size=min(2000, bookmarks), replace=False)]
    replace_folders(index, folder_rows([("f50", "fifty"), ("f2000", "two thousand")], members))


def top10(index: ChunkIndex, pairs) -> list[list[str]]:
    """The bookmarks of the top 10 of each hybrid query, in order."""
    return [[h.tweet_id for h in search(query, index=index, query_vector=vector).hits] for query, vector in pairs]


def compare_hits(now: list[list[str]], saved: list[list[str]]) -> dict:
    """Top 10 of each hybrid query: this run against a saved run."""
    if len(now) != len(saved):
        raise SystemExit(f"the saved hits hold {len(saved)} queries, this run {len(now)}: "
                         "give hits of a run with the same queries")
    identical = sum(a == b for a, b in zip(now, saved))
    overlap = sum(len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(now, saved))
    return {"queries": len(now), "identical_top10": identical, "mean_top10_overlap": round(overlap / len(now), 4)}


def saved_hits_of(path: Path | None, size: int) -> list | None:
    """The top 10 lists that --hits wrote for this size; None without a file."""
    if path is None:
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--same-hits-as {path}: cannot read it as JSON ({exc})") from exc
    if str(size) not in saved:
        raise SystemExit(f"--same-hits-as {path}: it holds no hits for {size} passages "
                         f"(sizes in it: {', '.join(saved) or 'none'})")
    return saved[str(size)]


def corpus_size(text: str) -> int:
    """A --sizes value: a whole number of passages, 1,000 or more (the
    corpus needs rows for its 200 queries and its 1% fold-in)."""
    try:
        size = int(text.replace(",", ""))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of passages") from exc
    if size < 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1000 passages or more")
    return size


def vector_recall(index: ChunkIndex, query_vectors) -> float | None:
    """Share of the exact 100 nearest passages that the index query finds."""
    from kb.index.maintenance import vector_probes

    table = index.table("chunks")
    if not index.counts()["vector_index"]:
        return None
    found = 0
    query_vectors = query_vectors[:50]
    for vector in query_vectors:
        def top(exact: bool) -> set:
            q = table.search(vector, vector_column_name="vector").distance_type("dot").select(["_rowid"]).limit(100)
            q = q.bypass_vector_index() if exact else q.nprobes(vector_probes(table.count_rows()))
            return set(q.to_arrow().column("_rowid").to_pylist())
        found += len(top(True) & top(False))
    return round(found / (100 * len(query_vectors)), 4)


# --- SQLite FTS5 + sqlite-vec --------------------------------------------------
def sqlite_connect(path: Path):
    import apsw
    import sqlite_vec

    conn = apsw.Connection(str(path))
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    return conn


def bench_sqlite(rows, vectors, queries, query_vectors, folder: Path) -> dict:
    conn = sqlite_connect(folder / "bench.sqlite")
    started = time.perf_counter()
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("""CREATE TABLE chunks (id INTEGER PRIMARY KEY, chunk_id TEXT UNIQUE, tweet_id TEXT, url TEXT,
                    author TEXT, created_at TEXT, source TEXT, ref TEXT, position INT, text TEXT, word_count INT)""")
    conn.execute("CREATE INDEX chunks_tweet ON chunks(tweet_id)")
    conn.execute("CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='id')")
    conn.execute(f"CREATE VIRTUAL TABLE chunks_vec USING vec0(embedding float[{DIM}] distance_metric=cosine)")
    with conn:
        for i, r in enumerate(rows, 1):
            conn.execute("INSERT INTO chunks VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                         (i, r["chunk_id"], r["tweet_id"], r["url"], r["author"], r["created_at"].isoformat(),
                          r["source"], r["ref"], r["position"], r["text"], r["word_count"]))
            conn.execute("INSERT INTO chunks_fts(rowid, text) VALUES (?, ?)", (i, r["text"]))
            conn.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES (?, ?)",
                         (i, vectors[r["text"]].astype(np.float32).tobytes()))
    build_s = time.perf_counter() - started

    def query_sqlite(text: str, vector: np.ndarray, limit: int = 10) -> list[dict]:
        match = " OR ".join('"' + word.replace('"', '""') + '"' for word in text.split())
        lexical = [r[0] for r in conn.execute(
            "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?", (match, DEPTH))]
        dense = [r[0] for r in conn.execute(
            "SELECT rowid FROM chunks_vec WHERE embedding MATCH ? AND k = ?", (vector.tobytes(), DEPTH))]
        fused: dict[int, float] = {}
        for ranked in (lexical, dense):
            for rank, rowid in enumerate(ranked):
                fused[rowid] = fused.get(rowid, 0.0) + 1.0 / (RRF_K + rank + 1)
        order = sorted(fused, key=fused.get, reverse=True)
        marks = ",".join("?" * len(order))
        found = {r[0]: r for r in conn.execute(
            f"SELECT id, tweet_id, url, author, created_at, source, ref, text FROM chunks WHERE id IN ({marks})", order)}
        hits, seen = [], set()
        for rowid in order:
            row = found[rowid]
            if row[1] in seen:
                continue
            seen.add(row[1])
            hits.append({"tweet_id": row[1], "score": fused[rowid], "text": row[7]})
            if len(hits) == limit:
                break
        return hits

    for query, vector in list(zip(queries, query_vectors))[:5]:
        query_sqlite(query, vector)
    times = []
    cpu = time.process_time()
    for query, vector in zip(queries, query_vectors):
        t = time.perf_counter()
        hits = query_sqlite(query, vector)
        times.append((time.perf_counter() - t) * 1000)
        assert hits
    cpu_ms = (time.process_time() - cpu) * 1000 / len(queries)
    conn.close()
    return {"build_s": round(build_s, 2), "hybrid": {**percentiles(times), "cpu_ms_per_query": round(cpu_ms, 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=corpus_size, nargs="+", default=[10_000, 100_000],
                        help="corpus sizes in passages, 1000 or more (1000000 and 1,000,000 are the same)")
    parser.add_argument("--sqlite-sizes", type=corpus_size, nargs="*", default=None,
                        help=f"the sizes at which the SQLite stack runs too (default: the sizes up to "
                             f"{SQLITE_MAX_DEFAULT}; with no value: none)")
    parser.add_argument("--light", action="store_true",
                        help="time hybrid and the filtered searches only (no bm25, no dense), "
                             "vector recall on 20 queries: for 1,000,000 passages on a loaded machine")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    parser.add_argument("--hits", type=Path, default=None,
                        help="write the top 10 of each hybrid query here as JSON, for --same-hits-as")
    parser.add_argument("--same-hits-as", type=Path, default=None,
                        help="compare the top 10 of each hybrid query with the hits that --hits wrote")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the kb index of each size in KEEP/SIZE; an index there already is searched, "
                             "not built again (to time the searches of new code on a large index)")
    args = parser.parse_args()
    results, hits = {}, {}
    for size in args.sizes:
        saved = saved_hits_of(args.same_hits_as, size)  # a bad file stops the run before the build
        before = run_facts()
        started = time.perf_counter()
        rows, vectors, queries, query_vectors = make_corpus(size)
        print(f"{size} passages: corpus made in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        with_sqlite = size <= SQLITE_MAX_DEFAULT if args.sqlite_sizes is None else size in args.sqlite_sizes
        with tempfile.TemporaryDirectory(prefix="kb-bench-") as tmp:
            folder = args.keep / str(size) if args.keep else Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            kb = bench_kb(rows, vectors, queries, query_vectors, folder, args.light, saved)
            sqlite = bench_sqlite(rows, vectors, queries, query_vectors, Path(tmp)) if with_sqlite else None
        hits[size] = kb.pop("top10")
        after = run_facts()
        results[size] = {"commit": before["commit"], "load_average_before": before["load_average"],
                         "load_average_after": after["load_average"], "kb_lancedb": kb, "sqlite_fts5_vec": sqlite}
        if sqlite:
            results[size]["ratio_kb_over_sqlite"] = {
                "build": round(kb["build_s"] / sqlite["build_s"], 2),
                "hybrid_p50": round(kb["hybrid"]["p50_ms"] / sqlite["hybrid"]["p50_ms"], 2),
                "hybrid_p95": round(kb["hybrid"]["p95_ms"] / sqlite["hybrid"]["p95_ms"], 2),
            }
        print(json.dumps({size: results[size]}, indent=2), flush=True)
        # Written after each size: a long run that stops keeps the sizes done.
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        if args.hits:
            args.hits.write_text(json.dumps(hits) + "\n")


if __name__ == "__main__":
    main()
