"""Sync benchmark: a sync with nothing new and a sync with 1% new bookmarks,
each as a ratio of the full build, on a 1,000-bookmark corpus.

The corpus is raw X `Bookmarks` pages, in the envelope and tweet shape of
benchmarks/make_sample_data.py (its helpers build every tweet): 1,000
posts of 30 to 120 words from varied sentences, 20 bookmarks a page, one
end page with cursors only. About one post in four links to example.com.
The benchmark sets KB_EXCLUDE=link, so the documents stage fetches none of
these links (no network).

Every step goes through the real pipeline, `kb.apps.sync.run_sync(files=...)`,
one run of the job x_sync
(the code of `kb import` and `kb sync`), in a temporary KB_HOME:

1. full build: every page into an empty KB_HOME (once);
2. nothing new: the top page again, as an incremental capture gives it
   when no bookmark was added (`--rounds` times);
3. 1% new: one page with 10 new bookmarks on top of the 20 of the top page
   (`--rounds` times, each with 10 other new bookmarks).

The report gives the median run of steps 2 and 3.

Each backend runs in its own process (settings and loaded models are per
process). Before it measures, the process runs the shipped demo pages
through a throw-away KB_HOME, so imports, the model load and Dagster's
first run do not count against the full build.

For each step it reports the wall time and the CPU time of the process
(steadier than the wall time on a shared machine), the seconds of each stage
(StageResult.seconds, from the run's events) and the seconds inside its asset
steps (Dagster's step stats; the rest is Dagster's own work), the texts that were embedded
(new rows in the LanceDB table embedding_cache), the passages that
chunk_index wrote, and the bytes of new files in each LanceDB table (a
whole-table rewrite shows there). At the end it checks the index: every
bookmark once, and a keyword search finds the newest bookmark.

    .venv/bin/python benchmarks/bench_sync.py                    # local and hash, about 7 minutes
    .venv/bin/python benchmarks/bench_sync.py --backends hash --rounds 1 --out /tmp/sync.json

`--dagster-storage dagster` writes a dagster.yaml without storage sections:
Dagster's own SQLite storages, to compare with kb's choice (`kb`, the
default).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import make_sample_data as gen

PAGE_SIZE = 20  # X's page size for Bookmarks
NEW_SHARE = 0.01
START = "2024-01-01 08:00"

# --- the corpus ----------------------------------------------------------------
TOPICS = {
    "databases": (
        ["the query planner", "a columnar scan", "the write-ahead log", "a B-tree index", "the buffer pool",
         "a hash join", "the storage engine", "a vacuum pass", "the replication stream", "a covering index"],
        ["rewrites", "slows down", "speeds up", "skips", "locks", "compresses", "splits", "caches"],
        ["every page of the table", "the hot rows", "long transactions", "wide tuples", "cold partitions",
         "the last checkpoint", "small random reads", "sorted runs on disk"],
    ),
    "retrieval": (
        ["the embedding model", "an HNSW graph", "the BM25 ranker", "a reranker", "the tokenizer",
         "reciprocal rank fusion", "a product quantizer", "the candidate list", "a dense retriever"],
        ["ranks", "misses", "recovers", "boosts", "filters", "merges", "normalizes", "truncates"],
        ["rare keywords", "long queries", "near-duplicate passages", "paraphrased questions",
         "the top hundred hits", "short product names", "multilingual text", "stale vectors"],
    ),
    "baking": (
        ["a sourdough starter", "the rye dough", "a long cold proof", "the bread oven", "a pinch of salt",
         "the autolyse step", "a wet crumb", "the bulk ferment", "a steam tray"],
        ["lifts", "sours", "tightens", "relaxes", "browns", "dries", "feeds", "weakens"],
        ["the gluten network", "the crust at the end", "a dense loaf", "overnight dough", "whole grain flour",
         "the second rise", "the scoring pattern", "a cast iron pot"],
    ),
    "history": (
        ["the Roman road", "a silver denarius", "the frontier legion", "a provincial governor", "the grain fleet",
         "a census record", "the city council", "a merchant guild", "the aqueduct crew"],
        ["funded", "protected", "taxed", "moved", "recorded", "rebuilt", "outlived", "doubled"],
        ["the harbour towns", "ordinary households", "the trade in olive oil", "distant markets",
         "the mountain passes", "the imperial mint", "the river crossings", "local temples"],
    ),
    "operations": (
        ["the on-call engineer", "a nightly backup", "the restore drill", "a disk alert", "the deploy script",
         "a failing health check", "the load balancer", "a config change", "the incident review"],
        ["catches", "hides", "breaks", "repairs", "delays", "pages", "retries", "documents"],
        ["the primary database", "a full disk", "point-in-time recovery", "the staging cluster",
         "a silent data loss", "expired certificates", "the weekend traffic", "the runbook"],
    ),
}
CONNECTORS = ["In practice", "Most of the time", "On a small machine", "After a week of tests", "To be fair",
              "In my notes", "Surprisingly", "As the old paper says", "Without a doubt", "For beginners"]
CLOSERS = ["That is the whole trick.", "Measure before you change it.", "Nobody tells you this early.",
           "It took me years to see it.", "Write it down and check it again.", "Small details decide it."]


def sentence(rng: random.Random, topic: str) -> str:
    subjects, verbs, objects = TOPICS[topic]
    words = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
    if rng.random() < 0.5:
        words = f"{rng.choice(CONNECTORS)}, {words}"
    if rng.random() < 0.4:
        words += f" when {rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
    return words[0].upper() + words[1:] + "."


def post_text(rng: random.Random, number: int) -> tuple[str, str | None]:
    """30 to 120 words on one topic, in one to three paragraphs. Returns the
    text and the example.com address it links to, if any."""
    topic = rng.choice(sorted(TOPICS))
    target = rng.randint(30, 120)
    paragraphs, current, words = [], [], 0
    while words < target:
        line = sentence(rng, topic) if rng.random() > 0.1 else rng.choice(CLOSERS)
        current.append(line)
        words += len(line.split())
        if len(current) >= 3 and rng.random() < 0.35:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    # A number in each post keeps every text unique, so no two posts share a vector.
    text = "\n\n".join(paragraphs) + f" (note {number})"
    if rng.random() < 0.3:
        text += f" #{topic}"
    link = None
    if rng.random() < 0.25:
        link = f"https://example.com/{topic}/{number}"
        text += f" More: {{link:{link}}}"
    return text, link


def make_posts(count: int, *, first: int, start: str, seed: int) -> list[gen.Post]:
    rng = random.Random(seed)
    handles = sorted(gen.AUTHORS)
    moment = gen.parse_time(start)
    posts = []
    for number in range(first, first + count):
        text, link = post_text(rng, number)
        card = None
        if link and rng.random() < 0.5:
            card = gen.Card("summary", f"Notes on {link.split('/')[3]} number {number}",
                            "A longer write-up with figures and the method.")
        moment += timedelta(minutes=rng.randint(30, 600))
        posts.append(gen.Post(f"bench{number:05d}", rng.choice(handles), moment.strftime("%Y-%m-%d %H:%M"),
                              text, card=card))
    return posts


def entries_for(posts: list[gen.Post]) -> list[dict]:
    """Timeline entries, newest bookmark first (as X orders them)."""
    timed = []
    for post in posts:
        tweet_id = gen.tweet_id_of(post)
        timed.append((gen.bookmark_time(post), tweet_id, gen.tweet_object(post, bookmarked=True)))
    timed.sort(key=lambda item: item[0], reverse=True)
    return [gen.tweet_entry(tweet_id, gen.snowflake(moment, "bookmark", tweet_id), result)
            for moment, tweet_id, result in timed]


def page_of(entries: list[dict]) -> dict:
    first, last = int(entries[0]["sortIndex"]), int(entries[-1]["sortIndex"])
    return gen.bookmarks_page(entries, top=first + 1, bottom=last - 1)


def write_corpus(folder: Path, bookmarks: int, rounds: int) -> dict:
    """The page lists of each step: full (once), nothing new and 1% new
    (`rounds` times each)."""
    folder.mkdir(parents=True, exist_ok=True)
    posts = make_posts(bookmarks, first=0, start=START, seed=11)
    entries = entries_for(posts)
    full = []
    for number, at in enumerate(range(0, len(entries), PAGE_SIZE), start=1):
        path = folder / gen.page_name(number)
        path.write_bytes(gen.page_bytes(page_of(entries[at:at + PAGE_SIZE])))
        full.append(path)
    end = int(entries[-1]["sortIndex"]) - 3
    path = folder / gen.page_name(len(full) + 1)
    path.write_bytes(gen.page_bytes(gen.bookmarks_page([], top=end + 1, bottom=end)))
    full.append(path)

    # Nothing new: the top page again, in a file of its own (a new capture).
    again = folder / "again-0001.json"
    again.write_bytes(full[0].read_bytes())

    # 1% new, `rounds` times: each page holds 10 new bookmarks, posted a
    # month after the newest post so far, on top of the 20 of the top page.
    newest = max(gen.parse_time(p.posted) for p in posts)
    top, new_pages, fresh_ids = entries[:PAGE_SIZE], [], []
    for round_number in range(rounds):
        fresh = make_posts(max(1, round(bookmarks * NEW_SHARE)), first=bookmarks + len(fresh_ids),
                           start=(newest + timedelta(days=30)).strftime("%Y-%m-%d %H:%M"), seed=12 + round_number)
        newest = max(gen.parse_time(p.posted) for p in fresh)
        fresh_entries = entries_for(fresh)
        path = folder / f"new-{round_number + 1:04d}.json"
        path.write_bytes(gen.page_bytes(page_of(fresh_entries + top)))
        new_pages.append([path])
        fresh_ids += [gen.tweet_id_of(p) for p in fresh]
        top = (fresh_entries + top)[:PAGE_SIZE]
    return {"full": [full], "nothing_new": [[again]] * rounds, "one_percent_new": new_pages,
            "fresh_ids": fresh_ids}


# --- measuring one step ----------------------------------------------------------
def lance_files(folder: Path) -> dict[str, int]:
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def new_bytes(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Bytes of new files per LanceDB table (chunks.lance, embedding_cache.lance, ...)."""
    out: dict[str, int] = {}
    for path, size in after.items():
        if path not in before:
            table = path.split("/", 1)[0].removesuffix(".lance")
            out[table] = out.get(table, 0) + size
    return dict(sorted(out.items()))


def index_metadata(instance, batch: str) -> dict:
    import dagster as dg

    event = instance.get_latest_materialization_event(dg.AssetKey("chunk_index"))
    if event is None or event.asset_materialization.partition != batch:
        return {}
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def compute_seconds(instance, batch: str) -> dict[str, float]:
    """Seconds inside the steps of each stage's run (the asset and its
    checks). The rest of a stage's wall time is Dagster's own work: the run
    record, its event log, resource set-up."""
    import dagster as dg

    from kb.apps.sync import PARTITION_TAG, SYNC_JOB

    out: dict[str, float] = {}
    for record in instance.get_run_records(filters=dg.RunsFilter(job_name=SYNC_JOB, tags={PARTITION_TAG: batch})):
        for step in instance.get_run_step_stats(record.dagster_run.run_id):
            if step.start_time:
                out[step.step_key] = round(out.get(step.step_key, 0) + (step.end_time or 0) - step.start_time, 2)
    return out


def run_step(name: str, files: list[Path]) -> dict:
    """One run_sync call, with what it embedded and wrote."""
    import dagster as dg

    from kb.apps.sync import run_sync
    from kb.index.embedder import Embedder
    from kb.settings import get_settings

    lancedb_dir = get_settings().lancedb_dir
    embedder = Embedder.from_settings()
    cached_before = embedder.cached_count()
    files_before = lance_files(lancedb_dir)
    started, cpu_started = time.perf_counter(), time.process_time()
    report = run_sync(files=[str(f) for f in files])
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if report.failed:
        errors = {s.stage: s.error for s in report.stages if not s.ok}
        raise SystemExit(f"step {name}: stages failed: {errors}")
    instance = dg.DagsterInstance.get()
    meta = index_metadata(instance, report.batch)
    return {
        "seconds": round(seconds, 2),
        # CPU seconds of this process, all threads: less sensitive than the
        # wall time to other work on a shared machine.
        "cpu_s": round(cpu, 2),
        "stages": {s.stage: round(s.seconds, 2) for s in report.stages},
        "compute": compute_seconds(instance, report.batch),
        "embedded_texts": embedder.cached_count() - cached_before,
        "chunks_written": meta.get("chunks_written"),
        "index_chunks": meta.get("index_chunks"),
        "new_lance_bytes": new_bytes(files_before, lance_files(lancedb_dir)),
    }


def use_home(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    os.environ["KB_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")


def median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (the lower middle for an even count)."""
    return sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]


def worker(backend: str, bookmarks: int, rounds: int, storage: str = "kb") -> dict:
    """One backend in this process. Prints nothing but the JSON result."""
    if storage == "dagster":
        import kb_assets.instance_config as instance_config

        # No storage sections: Dagster's default SQLite storages in DAGSTER_HOME.
        instance_config.dagster_yaml = lambda settings=None: instance_config.DAGSTER_YAML
    with tempfile.TemporaryDirectory(prefix="kb-bench-sync-") as tmp:
        root = Path(tmp)
        os.chdir(root)  # no developer .env
        os.environ.update({
            "KB_EMBED_BACKEND": backend,
            # The corpus links to example.com: never fetch it.
            "KB_EXCLUDE": "link",
            "KB_X_STATE": str(root / "config" / "state.json"),
            "KB_CONFIG_FILE": str(root / "config" / "config.toml"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        })
        for var in ("GROQ_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL",
                    "TELEGRAM_BOT_TOKEN", "KB_CAPTION_BACKEND", "KB_TRANSCRIBE_BACKEND"):
            os.environ.pop(var, None)

        made = time.perf_counter()
        pages = write_corpus(root / "pages", bookmarks, rounds)
        corpus_s = time.perf_counter() - made

        # Warm-up in a throw-away home: imports, model load, Dagster's first run.
        from kb.sample_data import sample_pages
        from kb.apps.sync import run_sync

        use_home(root / "warm")
        warm = time.perf_counter()
        run_sync(files=[str(p) for p in sample_pages()])
        warm_s = time.perf_counter() - warm

        use_home(root / "home")
        runs = {name: [run_step(name, files) for files in pages[name]]
                for name in ("full", "nothing_new", "one_percent_new")}
        checks = check_index(pages["fresh_ids"], bookmarks)

    steps = {name: median_run(found) for name, found in runs.items()}
    full = steps["full"]["seconds"]
    return {
        "backend": backend,
        "dagster_storage": storage,
        "load_average": os.getloadavg(),
        "bookmarks": bookmarks,
        "pages": len(pages["full"][0]),
        "rounds": rounds,
        "corpus_s": round(corpus_s, 2),
        "warm_up_s": round(warm_s, 2),
        "steps": steps,
        "all_seconds": {name: [r["seconds"] for r in found] for name, found in runs.items()},
        "ratio_nothing_new": round(steps["nothing_new"]["seconds"] / full, 3),
        "ratio_one_percent_new": round(steps["one_percent_new"]["seconds"] / full, 3),
        "cpu_ratio_nothing_new": round(steps["nothing_new"]["cpu_s"] / steps["full"]["cpu_s"], 3),
        "cpu_ratio_one_percent_new": round(steps["one_percent_new"]["cpu_s"] / steps["full"]["cpu_s"], 3),
        "checks": checks,
    }


def check_index(fresh_ids: list[str], bookmarks: int) -> dict:
    """The index after every step: each bookmark once, the newest one found."""
    from kb.index.search import search
    from kb.index.client import ChunkIndex

    index = ChunkIndex.from_settings()
    counts = index.counts()
    expected = bookmarks + len(fresh_ids)
    if counts["indexed_bookmarks"] != expected or counts["bookmarks"] != expected:
        raise SystemExit(f"the index holds {counts['indexed_bookmarks']} bookmarks with passages and "
                         f"{counts['bookmarks']} cards, not {expected}")
    # "(note N)" is unique to each post: a keyword search must find the newest post.
    number = bookmarks + len(fresh_ids) - 1
    hits = search(f"note {number}", mode="bm25", limit=3).hits
    if not hits or hits[0].tweet_id != fresh_ids[-1]:
        raise SystemExit(f"a search for 'note {number}' did not find the new bookmark {fresh_ids[-1]}")
    return {"indexed_bookmarks": counts["indexed_bookmarks"], "chunks": counts["chunks"], "new_post_found": True}


# --- the report --------------------------------------------------------------------
def table(results: list[dict]) -> str:
    lines = ["| backend | step | seconds (median) | ratio to full | all runs | CPU s | CPU ratio | "
             "texts embedded | passages written | Dagster share | new bytes in chunks.lance |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        full = result["steps"]["full"]["seconds"]
        for name, step in result["steps"].items():
            overhead = 1 - sum(step["compute"].values()) / step["seconds"]
            runs = " / ".join(f"{s:.1f}" for s in result["all_seconds"][name])
            lines.append(f"| {result['backend']} | {name} | {step['seconds']:.2f} | {step['seconds'] / full:.3f} | "
                         f"{runs} | {step['cpu_s']:.1f} | {step['cpu_s'] / result['steps']['full']['cpu_s']:.3f} | "
                         f"{step['embedded_texts']} | {step['chunks_written']} | {overhead:.0%} | "
                         f"{step['new_lance_bytes'].get('chunks', 0):,} |")
    stages = list(results[0]["steps"]["full"]["stages"])
    lines += ["", "Seconds per stage, wall (inside the asset steps):", "",
              "| backend | step | " + " | ".join(stages) + " |", "|---|---|" + "---|" * len(stages)]
    for result in results:
        for name, step in result["steps"].items():
            lines.append(f"| {result['backend']} | {name} | " + " | ".join(
                f"{step['stages'].get(s, 0):.2f} ({step['compute'].get(s, 0):.2f})" for s in stages) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bookmarks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each incremental step; the report gives the median")
    parser.add_argument("--backends", nargs="+", default=["local", "hash"], choices=["local", "hash"])
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    parser.add_argument("--dagster-storage", choices=["kb", "dagster"], default="kb",
                        help="the storage sections of dagster.yaml: kb's (default) or none (Dagster's own)")
    parser.add_argument("--worker", choices=["local", "hash"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.bookmarks, args.rounds, args.dagster_storage)))
        return
    results = []
    for backend in args.backends:
        # One process per backend: settings, the Dagster instance and the
        # loaded model belong to the process.
        done = subprocess.run([sys.executable, __file__, "--worker", backend, "--bookmarks", str(args.bookmarks),
                               "--rounds", str(args.rounds), "--dagster-storage", args.dagster_storage],
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"the {backend} run failed (exit {done.returncode})")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps(result, indent=2), flush=True)
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
