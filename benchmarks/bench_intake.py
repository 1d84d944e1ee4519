"""Intake latency: the time from a note in the inbox to a search hit, with
`kb up` idle and during a `kb import` of many long bookmarks.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_intake.py                 # 1,500 bookmarks, local model
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_intake.py --bookmarks 100 --backend hash   # a quick look

The steps, in a new temporary KB_HOME:
1. `kb up --no-bot --no-web` starts (code server, daemon, UI) and the
   benchmark waits until the UI shows the code location as loaded.
2. Alone: `--alone` Markdown notes, one after the other, are put in
   $KB_HOME/inbox (written under a temp name and renamed, as a whole file).
   For each, the seconds until kb.index.search.search() finds its passage
   (source `telegram`). The inbox sensor, the intake run (parse, gate,
   index) and the daemon's run launcher all count, as the owner sees it.
3. During an import: `kb import` of `--bookmarks` long posts (300 to 700
   words each, in the shape of benchmarks/make_sample_data.py) starts in
   its own process, in the same KB_HOME. `--delay` seconds later, and then
   again after each hit, a new note goes into the inbox, until the import
   ends (or `--during` notes). So the notes meet every stage of the
   import: the capture, normalize, chunks and the long embedding of
   chunk_index. The import's own wall time is measured too.

The gate is a loopback OpenAI-compatible endpoint (tests/fake_openai_chat.py)
that accepts each note at once: the gate's model time is not what this
measures. Links are not fetched (KB_EXCLUDE=link): no network.

`--python` runs `kb up` and `kb import` with another interpreter, to
measure another checkout. PYTHONPATH is not enough: the editable install of
kb puts a finder before sys.path (and `python -m` puts the working folder
first: the benchmark runs both in its temporary folder). For "before", a venv with no packages of
its own and one .pth file that names the other checkout first and then
this venv's site-packages (that directory's .pth files then do not run):

    git -C /work/main archive main | tar -x -C /tmp/main-copy
    python3 -m venv --without-pip /tmp/venv-main
    printf '/tmp/main-copy\n%s\n' $PWD/.venv/lib/python3.11/site-packages \
        > /tmp/venv-main/lib/python3.11/site-packages/zz_main.pth
    cp .venv/bin/dagster .venv/bin/dagster-daemon .venv/bin/dagster-webserver /tmp/venv-main/bin/
    .venv/bin/python benchmarks/bench_intake.py --python /tmp/venv-main/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_sync as corpus  # noqa: E402
import make_sample_data as gen  # noqa: E402
from bench_up import location_loaded  # noqa: E402

READY_LIMIT_S = 600
GATE_KEY = "sk-BENCH-not-a-real-key"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


# --- the corpus ------------------------------------------------------------------

def long_posts(count: int, seed: int = 21) -> list[gen.Post]:
    """Posts of 300 to 700 words: several texts of benchmarks/bench_sync.py in one."""
    rng = random.Random(seed)
    handles = sorted(gen.AUTHORS)
    moment = gen.parse_time(corpus.START)
    posts = []
    for number in range(count):
        parts, words = [], rng.randint(300, 700)
        while sum(len(p.split()) for p in parts) < words:
            text, _ = corpus.post_text(rng, number * 10 + len(parts))
            parts.append(text.split(" More: ")[0])  # no links: nothing to fetch
        moment += timedelta(minutes=rng.randint(30, 600))
        posts.append(gen.Post(f"intake{number:05d}", rng.choice(handles), moment.strftime("%Y-%m-%d %H:%M"),
                              "\n\n".join(parts) + f" (long note {number})"))
    return posts


def write_pages(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    entries = corpus.entries_for(long_posts(count))
    pages = []
    for number, at in enumerate(range(0, len(entries), corpus.PAGE_SIZE), start=1):
        path = folder / gen.page_name(number)
        path.write_bytes(gen.page_bytes(corpus.page_of(entries[at:at + corpus.PAGE_SIZE])))
        pages.append(path)
    return pages


# --- one note --------------------------------------------------------------------

WORDS = ["quartz", "heron", "lantern", "basalt", "fennel", "marlin", "cobalt", "juniper", "saffron", "tundra"]


def note_text(number: int) -> tuple[str, str]:
    """A note with a phrase that no other text holds, and that phrase."""
    rng = random.Random(number)
    phrase = " ".join(rng.sample(WORDS, 4)) + f" zq{number:04d}"
    body = (f"# Field note {number}\n\nThe {phrase} survey counted birds at the lake shore. "
            "Each morning the team walked the same path and wrote down what they saw, "
            "so that the counts of two years can be compared line by line.\n")
    return body, phrase


def drop_note(home: Path, number: int) -> tuple[str, str]:
    """Put a note in the inbox as a whole file. Returns its item id and phrase."""
    from kb.telegram.inbox import dropped_item_id

    body, phrase = note_text(number)
    content = body.encode()
    inbox = home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    temp = inbox / f"note-{number}.md.tmp"
    temp.write_bytes(content)
    os.replace(temp, inbox / f"note-{number}.md")
    return dropped_item_id(content), phrase


def seconds_to_hit(home: Path, number: int, limit_s: float) -> dict:
    from kb.index.search import search

    started = time.monotonic()
    item_id, phrase = drop_note(home, number)
    wanted = f"telegram:{item_id}"
    while time.monotonic() - started < limit_s:
        try:
            if wanted in {hit.tweet_id for hit in search(phrase, limit=5, source="telegram").hits}:
                return {"note": number, "seconds": round(time.monotonic() - started, 1), "load": load()}
        except Exception:
            pass  # no index yet
        time.sleep(0.5)
    return {"note": number, "seconds": None, "limit_s": limit_s, "load": load()}


# --- kb up -------------------------------------------------------------------------

def environment(home: Path, backend: str, gate_url: str) -> dict[str, str]:
    config = home.parent / "config"
    config.mkdir(exist_ok=True)
    (config / ".env").write_text("")
    env = {**os.environ, "KB_HOME": str(home), "KB_EMBED_BACKEND": backend, "KB_EXCLUDE": "link",
           "KB_ENV_FILE": str(config / ".env"), "KB_X_STATE": str(config / "state.json"),
           "KB_CONFIG_FILE": str(config / "config.toml"), "HF_HUB_OFFLINE": "1",
           "DEEPSEEK_API_KEY": GATE_KEY, "KB_GATE_BASE_URL": gate_url}
    for name in ("TELEGRAM_BOT_TOKEN", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "GROQ_API_KEY",
                 "KB_DAGSTER_POSTGRES_URL", "KB_LANCE_URI", "DAGSTER_HOME"):
        env.pop(name, None)
    return env


def stop_tree(process: subprocess.Popen) -> None:
    """Ctrl-C for kb up (it stops its parts), then SIGKILL for what is left, by pid."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bookmarks", type=int, default=1500)
    parser.add_argument("--backend", default="local", choices=["local", "hash"])
    parser.add_argument("--alone", type=int, default=2, help="notes before the import")
    parser.add_argument("--during", type=int, default=0, help="most notes during the import; 0: until it ends")
    parser.add_argument("--delay", type=float, default=20.0, help="seconds from the import's start to the first note")
    parser.add_argument("--limit", type=float, default=900.0, help="longest wait for one hit, in seconds")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of kb up and kb import")
    args = parser.parse_args()

    from tests.fake_openai_chat import FakeOpenAIChat, chat

    root = Path(tempfile.mkdtemp(prefix="bench-intake-"))
    home = root / "kb_home"
    home.mkdir()
    pages = write_pages(root / "pages", args.bookmarks)
    result: dict = {"bookmarks": args.bookmarks, "backend": args.backend, "pages": len(pages),
                    "python": args.python, "load_at_start": load()}
    with FakeOpenAIChat(chat('{"score": 80, "topics": ["birds"], "reason": "field notes"}')) as gate:
        env = environment(home, args.backend, gate.base_url)
        os.environ.update({k: env[k] for k in ("KB_HOME", "KB_EMBED_BACKEND", "KB_ENV_FILE", "KB_X_STATE",
                                                "KB_CONFIG_FILE", "HF_HUB_OFFLINE")})
        port = free_port()
        up_log = open(root / "kb-up.log", "w")
        up = subprocess.Popen([args.python, "-m", "kb.apps.cli", "up", "--no-bot", "--no-web",
                               "--dagster-port", str(port)], env=env, stdout=up_log, stderr=subprocess.STDOUT,
                              cwd=root)  # `python -m` puts its working folder first on sys.path
        importer = None
        try:
            started = time.monotonic()
            while not location_loaded(port):
                if up.poll() is not None or time.monotonic() - started > READY_LIMIT_S:
                    raise SystemExit(f"kb up did not start: see {root / 'kb-up.log'}")
                time.sleep(1)
            result["up_ready_s"] = round(time.monotonic() - started, 1)
            note = 0
            result["alone"] = []
            for _ in range(args.alone):
                note += 1
                result["alone"].append(seconds_to_hit(home, note, args.limit))
                print("alone", result["alone"][-1], flush=True)

            import_log = open(root / "kb-import.log", "w")
            import_started = time.monotonic()
            importer = subprocess.Popen([args.python, "-m", "kb.apps.cli", "import", "--no-link",
                                         *map(str, pages)], env=env, stdout=import_log, stderr=subprocess.STDOUT,
                                        cwd=root)
            time.sleep(args.delay)
            result["during"] = []
            while importer.poll() is None and (not args.during or len(result["during"]) < args.during):
                note += 1
                hit = seconds_to_hit(home, note, args.limit)
                hit["import_still_ran"] = importer.poll() is None
                hit["at_import_s"] = round(time.monotonic() - import_started - (hit["seconds"] or 0), 1)
                result["during"].append(hit)
                print("during", hit, flush=True)
            result["import_exit"] = importer.wait()
            result["import_s"] = round(time.monotonic() - import_started, 1)
            importer = None
            result["load_at_end"] = load()
        finally:
            if importer is not None and importer.poll() is None:
                importer.kill()
            stop_tree(up)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(f"logs: {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
