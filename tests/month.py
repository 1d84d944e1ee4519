"""A month in minutes (issue 55, part 3): `kb up` through 30 simulated days.

The month drives the real system as the owner uses it: `kb up` (code
server, daemon, webserver, bot), a loopback Telegram Bot API that the real
aiogram bot polls, a loopback web site for the links, and the obedient agent
(tests/month_agent.py) behind the real Claude Code CLI. tests/test_month.py
runs it and checks the end; benchmarks/bench_month.py prints its counts.

Each day:
- an X import: `kb import` of a Bookmarks page built from the real captures
  in ../shared/fixtures/x (a thirtieth of their posts each day);
- the owner's Telegram sources: a link every day, and one more kind in turn
  (a PDF, a text, a voice note of espeak-ng, a link sent again, junk: a
  sticker or a link to a page that is gone); a stranger's message, which the
  bot must ignore;
- the lint of the day, and on Sunday the weekly synthesis of the week: each
  job launched for its day (the partition) through kb up's webserver, as
  the schedule launches it at 02:00 and on Sunday at 09:00.

Events: on OUTAGE_DAY the model endpoint answers 529 overloaded to every
request while the day's sources go in; on TOPIC_DAY the owner asks for a
topic synthesis (/synthesize); on KILL_DAY `kb up` gets SIGKILL while the
day's sources are in the runs, and a new `kb up` goes on; on BACKUP_DAY
`kb backup` writes an archive while kb up runs, and the month goes on in a
fresh home that `kb restore` made from it. So kb up starts three times:
days 1-10, 10-20, 21-30.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import psutil

from tests import fake_telegram as tg
from tests.fake_telegram import FakeTelegram
from tests.loopback import free_port
from tests.loopback_site import LoopbackSite, article_html, page, pdf_bytes
from tests.month_agent import ObedientAgent

TOKEN = "123456:TEST-SECRET-month-bot-token"
AGENT_TOKEN = "sk-TEST-SECRET-month-agent-0001"
OWNER, STRANGER = 111, 999
DAYS = 30
KILL_DAY, BACKUP_DAY, OUTAGE_DAY, TOPIC_DAY = 10, 20, 5, 15
TOPIC = "databases"
EXTRA_KINDS = ("pdf", "text", "voice", "again", "sticker", "gone")
WAIT_S = 600
# What the owner reads at the end of an item: one of these starts a reply to its message.
FINAL_REPLIES = ("Ingested", "Ingest failed", "Skipped (", "Unsupported message type", "Could not download",
                 "Text is too short", "failed: ", "Wiki change refused")
# The stated bound of KB_HOME after the month (du of the last home; benchmarks/month.md).
HOME_BOUND_MB = 120
WIKI_WORKFLOWS = {"ingest": "wiki_pages", "lint": "wiki_lint", "synthesis": "wiki_synthesis",
                  "topic": "wiki_topic_synthesis"}


def month_start(today: date | None = None) -> date:
    """The Monday five weeks ago: the lint's day partitions end tomorrow, so
    every day of the month is a partition that exists."""
    today = today or date.today()
    start = today - timedelta(days=35)
    return start - timedelta(days=start.weekday())


@dataclass
class Item:
    day: int
    message_id: int
    kind: str
    token: str  # a word that only this source holds: search must find it
    expect: str  # "wiki" or "told"


@dataclass
class Month:
    base: Path
    days: int = DAYS
    start: date = field(default_factory=month_start)
    kill_day: int = KILL_DAY
    backup_day: int = BACKUP_DAY
    outage_day: int = OUTAGE_DAY
    topic_day: int = TOPIC_DAY
    log: list[str] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    lint_runs: dict[str, str] = field(default_factory=dict)  # day -> run id
    week_runs: dict[str, str] = field(default_factory=dict)
    segment_seconds: list[float] = field(default_factory=list)
    home_sizes: dict[str, int] = field(default_factory=dict)
    stray: list[str] = field(default_factory=list)  # processes of kb left after a stop
    backup_archive: Path | None = None
    imports: dict[int, int] = field(default_factory=dict)  # day -> exit code of kb import

    def __post_init__(self) -> None:
        self.base = Path(self.base)
        self.homes = [self.base / "home-1", self.base / "home-2"]
        self.home = self.homes[0]
        self.config = self.base / "config"
        self.config.mkdir(parents=True, exist_ok=True)
        (self.config / ".env").write_text("")
        self.agent_home = self.base / "agent-home"
        (self.agent_home / ".claude").mkdir(parents=True, exist_ok=True)
        self.files = self.base / "files"
        self.files.mkdir(exist_ok=True)
        self.up = None

    # --- the world around kb ---------------------------------------------------------------
    def __enter__(self) -> "Month":
        self.telegram = FakeTelegram(TOKEN).start()
        self.site = LoopbackSite({})
        self.site.__enter__()
        self.agent = ObedientAgent(self.home / "wiki")
        self.agent.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.up is not None and self.up.process.poll() is None:
            self._kill_up()
        self.agent.__exit__(*exc)
        self.site.__exit__(*exc)
        self.telegram.stop()

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("KB_", "TELEGRAM_", "ANTHROPIC_", "DAGSTER_", "PYTEST_"))}
        port = self.site.server.server_port
        env.update({
            "KB_HOME": str(self.home), "DAGSTER_HOME": str(self.home / "dagster"),
            "KB_ENV_FILE": str(self.config / ".env"), "KB_CONFIG_FILE": str(self.config / "config.toml"),
            "KB_X_STATE": str(self.config / "state.json"), "KB_EMBED_BACKEND": "hash", "TZ": "UTC",
            "KB_WHISPER_MODEL": "tiny.en", "HF_HUB_OFFLINE": "1",
            "KB_SHARED_DIR": os.environ.get("KB_SHARED_DIR", "/work/shared"),
            "TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_BASE": self.telegram.base_url,
            "ALLOWED_USER_IDS": str(OWNER), "OWNER_CHAT_ID": str(OWNER),
            "ANTHROPIC_BASE_URL": self.agent.base_url, "ANTHROPIC_AUTH_TOKEN": AGENT_TOKEN,
            "HOME": str(self.agent_home), "CLAUDE_CONFIG_DIR": str(self.agent_home / ".claude"),
            "KB_AGENT_TIMEOUT_S": "120", "KB_FETCH_ALLOW_HOSTS": f"127.0.0.1:{port},localhost:{port}",
            # The daemon looks every second or two, not every 15 to 30 s.
            "KB_INBOX_SENSOR_INTERVAL_S": "1", "KB_NOTIFY_SENSOR_INTERVAL_S": "2", "KB_RUN_QUEUE_INTERVAL_S": "1",
            # kb's own retries of a refused or failed wiki change wait 1, 2, 4 s, not 60, 120, 240 s.
            "KB_WIKI_RETRY_DELAY_S": "1", "KB_GATE_RETRY_WAITS_S": "0,0,0",
            "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[1])),
        })
        return env

    def say(self, line: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {line}")
        if os.environ.get("KB_MONTH_VERBOSE"):
            print(self.log[-1], flush=True)

    # --- kb up -----------------------------------------------------------------------------
    def start_up(self) -> None:
        from tests.test_up import Up, wait_until

        self.segment_started = time.monotonic()
        self.up = Up(self.env(), "--dagster-port", str(free_port()), "--no-web")
        wait_until(lambda: any("kb up: running" in line for line in self.up.lines), "kb up: running", self.up)
        from kb.apps.run_paths import answers, kb_up_webserver

        self.webserver = kb_up_webserver(self.home)
        wait_until(lambda: answers(self.webserver), "kb up's webserver", self.up)
        # kb's SQLite storage classes find their folder by DAGSTER_HOME.
        os.environ["DAGSTER_HOME"] = str(self.home / "dagster")
        self.instance = dg.DagsterInstance.from_config(str(self.home / "dagster"))
        self.say(f"kb up runs for {self.home.name} (pid {self.up.process.pid})")

    def _family(self) -> list[int]:
        from tests.test_up import family

        try:
            return family(self.up.pids())
        except psutil.NoSuchProcess:
            return self.up.pids()

    def stop_up(self) -> None:
        """SIGTERM, as the owner's Ctrl-C: every part and child ends."""
        pids = self._family()
        self.up.stop()
        self._after_stop(pids, 15)
        self.segment_seconds.append(time.monotonic() - self.segment_started)

    def _kill_up(self) -> None:
        from tests.test_up import kill_groups

        kill_groups(self.up.pids())
        self.up.process.kill()
        self.up.process.wait()

    def kill_up(self) -> None:
        """SIGKILL of kb up itself: its parts end by themselves (the lifeline)."""
        from tests.test_up import PARTS_END_S

        pids = self._family()
        self.up.process.kill()
        self.up.process.wait()
        self._after_stop(pids, PARTS_END_S)
        self.segment_seconds.append(time.monotonic() - self.segment_started)
        self.say("kb up got SIGKILL")

    def _after_stop(self, pids: list[int], seconds: float) -> None:
        from tests.test_up import still_running_after

        still_running_after(pids, seconds)
        for process in self.kb_processes():
            self.stray.append(f"{process.pid} {' '.join(process.cmdline())[:200]}")
            process.kill()  # the next segment must start clean; the test reports it

    def kb_processes(self) -> list[psutil.Process]:
        """Every process of this month's homes: kb's parts, run workers, the
        agent's CLI, and Dagster's compute-log helpers (`tail -F` of a file in
        the home)."""
        found = []
        homes = [str(home) for home in self.homes]
        for process in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmdline = " ".join(process.info["cmdline"] or [])
                env_home = process.environ().get("KB_HOME", "") if process.pid != os.getpid() else ""
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if process.pid == os.getpid():
                continue
            if env_home in homes or any(home in cmdline for home in homes):
                found.append(process)
        return found

    # --- one day ---------------------------------------------------------------------------
    def day_date(self, day: int) -> date:
        return self.start + timedelta(days=day - 1)

    def send_day(self, day: int) -> list[Item]:
        """The day's Telegram messages: the owner's and a stranger's."""
        base = day * 100
        items = []
        link_token = f"linkday{day}word"
        path = f"/day{day}/article"
        self.site.routes[path] = page(article_html(f"Notes of day {day} on storage", [
            f"On day {day} the engineers studied {link_token} and write-ahead logging for databases.",
            "A database writes the log record before it changes the page, so that a crash loses nothing.",
            "Checkpoints bound the time that a recovery takes after a crash of the database server."]))
        updates = [self._message(base + 1, tg.text_fields(self.site.url(path)))]
        items.append(Item(day, base + 1, "link", link_token, "wiki"))
        kind = EXTRA_KINDS[(day - 1) % len(EXTRA_KINDS)]
        token = f"{kind}day{day}word"
        number = base + 2
        if kind == "pdf":
            data = pdf_bytes(f"Report of day {day} about {token} and databases.\n\n" + "The replica applies the "
                             "log in order, so that it holds the same rows as the leader after each batch. " * 3)
            self.telegram.add_file(f"pdf{day}", f"documents/file_{day}.pdf", data)
            updates.append(self._message(number, tg.document_fields(f"pdf{day}", f"report-{day}.pdf",
                                                                    "application/pdf", len(data))))
            items.append(Item(day, number, kind, token, "wiki"))
        elif kind == "text":
            body = (f"Idea of day {day}: {token}. Keep a log of every schema change of the databases, "
                    "with the reason, so that a rebuild can replay it.")
            updates.append(self._message(number, tg.text_fields(body)))
            items.append(Item(day, number, kind, token, "wiki"))
        elif kind == "voice":
            data = self._speech(day)
            self.telegram.add_file(f"voice{day}", f"voice/file_{day}.oga", data)
            updates.append(self._message(number, tg.voice_fields(f"voice{day}", len(data))))
            # The same words each time: kb's gate calls a later note a duplicate, and says so.
            first = not any(i.kind == "voice" for i in self.items)
            items.append(Item(day, number, kind, "fox", "wiki" if first else "told"))
        elif kind == "again":  # the link of yesterday once more: a duplicate
            updates.append(self._message(number, tg.text_fields(self.site.url(f"/day{day - 1}/article"))))
            items.append(Item(day, number, kind, "", "told"))
        elif kind == "sticker":
            updates.append(self._message(number, tg.sticker_fields(f"sticker{day}")))
            items.append(Item(day, number, kind, "", "told"))
        else:  # a link to a page that is gone
            updates.append(self._message(number, tg.text_fields(self.site.url(f"/day{day}/gone"))))
            items.append(Item(day, number, kind, "", "told"))
        updates.append(tg.message_update(self.telegram.next_update_id(), base + 9, STRANGER,
                                         **tg.text_fields(self.site.url(path) + " please add this")))
        self.telegram.push(*updates)
        self.items += items
        self.say(f"day {day}: sent {', '.join(i.kind for i in items)} and a stranger's link")
        return items

    def _message(self, message_id: int, fields: dict) -> dict:
        return tg.message_update(self.telegram.next_update_id(), message_id, OWNER, **fields)

    def _speech(self, day: int) -> bytes:
        wav = self.files / f"voice-{day}.wav"
        # The sentence of tests/test_parsers.py: tiny.en transcribes it with confidence
        # (a longer one of espeak-ng's voice fell under the confidence limit).
        subprocess.run(["espeak-ng", "-w", str(wav), "The quick brown fox jumps over the lazy dog near the river "
                        "bank."], check=True, capture_output=True)
        return wav.read_bytes()

    def final_reply(self, item: Item) -> str | None:
        return next((r for r in self.telegram.replies_to(item.message_id) if r.startswith(FINAL_REPLIES)), None)

    def wait_for_items(self, items: list[Item]) -> None:
        from tests.test_up import wait_until

        wait_until(lambda: all(self.final_reply(i) for i in items),
                   f"the end of the items {[i.message_id for i in items]}: {self._pending(items)}", self.up)

    def _pending(self, items: list[Item]) -> str:
        return "; ".join(f"{i.message_id}: {self.telegram.replies_to(i.message_id)}" for i in items
                         if not self.final_reply(i))

    def x_import(self, day: int) -> subprocess.Popen:
        """`kb import` of the day's Bookmarks page; its runs go to kb up's daemon."""
        from tests.x_fixtures import all_tweet_entries, paged_bookmarks

        entries = all_tweet_entries()
        share = entries[day - 1::self.days]
        pages = paged_bookmarks(share, page_size=100)
        path = self.files / f"bookmarks-day{day:02d}.json"
        path.write_text(json.dumps(pages[0]))
        return subprocess.Popen([sys.executable, "-m", "kb.apps.cli", "import", str(path), "--no-link",
                                 "--no-image", "--no-video", "--no-article"], env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def launch(self, job: str, partition: str, tags: dict[str, str] | None = None) -> str:
        from kb.apps.run_paths import submit

        return submit(self.webserver, job, run_config={}, tags={"dagster/partition": partition, **(tags or {})})

    def wait_for_run(self, run_id: str) -> dg.DagsterRunStatus:
        """The end of a run, or of the run retry that follows it."""
        from tests.test_up import wait_until

        def ended() -> bool:
            run = self.instance.get_run_by_id(run_id)
            return run is not None and run.is_finished
        wait_until(ended, f"the end of run {run_id}", self.up)
        return self.instance.get_run_by_id(run_id).status

    def lint(self, day: int) -> None:
        key = self.day_date(day).isoformat()
        self.lint_runs[key] = run_id = self.launch("wiki_lint_job", key)
        status = self.wait_for_run(run_id)
        self.say(f"day {day}: lint {key} {status.value}")

    def weekly(self, day: int) -> None:
        from kb.wiki.weeks import iso_week_label

        monday = self.day_date(day) - timedelta(days=6)
        label = iso_week_label(monday)
        self.week_runs[label] = run_id = self.launch("wiki_synthesis_job", monday.isoformat(), {"week": label})
        status = self.wait_for_run(run_id)
        self.say(f"day {day}: synthesis {label} {status.value}")

    def topic(self, day: int) -> None:
        """The owner asks for a topic synthesis through the bot."""
        from tests.test_up import wait_until

        number = day * 100 + 50
        self.telegram.push(self._message(number, tg.command_fields(f"/synthesize {TOPIC}")))
        wait_until(lambda: f"synthesis: topic {TOPIC}" in self.subjects(), "the topic synthesis", self.up)
        self.say(f"day {day}: topic synthesis of {TOPIC}")

    def subjects(self) -> list[str]:
        out = subprocess.run(["git", "log", "--format=%s"], cwd=self.home / "wiki", capture_output=True, text=True)
        return out.stdout.splitlines()

    def run_day(self, day: int, *, sent: list[Item] | None = None) -> None:
        """One day: the X import beside the Telegram items, the lint, and (on
        Sunday) the weekly synthesis. The import may run on into the next day
        (it needs no wiki). `sent`: the items of a day that began under the
        kb up before."""
        started = time.monotonic()
        self.finish_import()
        self.importer = (day, self.x_import(day))
        if day == self.outage_day:
            self.agent.down = True
        items = sent if sent is not None else self.send_day(day)
        self.wait_for_items(items)
        self.agent.down = False
        if day == self.topic_day:
            self.topic(day)
        self.lint(day)
        if self.day_date(day).weekday() == 6:
            self.weekly(day)
        self.say(f"day {day} took {time.monotonic() - started:.0f} s")

    def finish_import(self) -> None:
        """Wait for the X import that runs, and check that it ended well."""
        if getattr(self, "importer", None) is None:
            return
        day, importer = self.importer
        self.importer = None
        out, _ = importer.communicate(timeout=WAIT_S)
        self.say(f"day {day}: kb import exit {importer.returncode}: {out.strip().splitlines()[-1:]}")
        self.imports[day] = importer.returncode
        if importer.returncode != 0:
            raise AssertionError(f"kb import of day {day} failed:\n{out}")

    # --- the month ---------------------------------------------------------------------------
    def run(self) -> None:
        from tests.test_up import wait_until

        started = time.monotonic()
        self.start_up()
        for day in range(1, self.days + 1):
            if day == self.kill_day:
                # SIGKILL while the day's sources are in their runs; a new kb up goes on.
                self.finish_import()
                sent = self.send_day(day)
                wait_until(self._a_source_run_started, "a run of the day's sources", self.up)
                self.kill_up()
                self.home_sizes["after the kill"] = du(self.home)
                self.start_up()
                self.run_day(day, sent=sent)
            else:
                self.run_day(day)
            if day == self.backup_day:
                self.finish_import()
                self.backup_and_move()
        self.finish_import()
        self.stop_up()
        self.home_sizes["at the end"] = du(self.home)
        self.wall_s = time.monotonic() - started

    def _a_source_run_started(self) -> bool:
        runs = self.instance.get_runs(dg.RunsFilter(job_name="source_intake",
                                                    statuses=[dg.DagsterRunStatus.STARTED]))
        return bool(runs)

    def backup_and_move(self) -> None:
        """`kb backup` while kb up runs, then the restore into a fresh home.

        The backup waits until the notice of the day's lint went out, as the
        owner's nightly backup runs on a quiet system. A notice told after
        the archive was made is told again by the restored home, which has
        no record of it (found by the 30-day month of 6 December 2026): the
        archive is the state of its moment."""
        from tests.test_up import wait_until

        lint = f"lint {self.day_date(self.backup_day).isoformat()}:"
        wait_until(lambda: any(m["text"].startswith(lint) for m in self.telegram.sent),
                   f"the notice of the {lint[:-1]}", self.up)
        archive_dir = self.base / "backups"
        archive_dir.mkdir(exist_ok=True)
        backup = subprocess.run([sys.executable, "-m", "kb.apps.cli", "backup", str(archive_dir)], env=self.env(),
                                capture_output=True, text=True, timeout=WAIT_S)
        self.say(f"kb backup exit {backup.returncode}: {backup.stdout.strip()[-300:]} {backup.stderr.strip()[-500:]}")
        if backup.returncode != 0:
            raise AssertionError(f"kb backup failed:\n{backup.stdout}\n{backup.stderr}")
        self.backup_archive = max(archive_dir.iterdir(), key=lambda p: p.stat().st_mtime)
        self.stop_up()
        self.home_sizes["before the backup"] = du(self.home)
        self.home = self.homes[1]
        restore = subprocess.run([sys.executable, "-m", "kb.apps.cli", "restore", str(self.backup_archive)],
                                 env=self.env(), capture_output=True, text=True, timeout=WAIT_S)
        self.say(f"kb restore exit {restore.returncode}: {restore.stdout.strip()[-300:]} {restore.stderr.strip()[-500:]}")
        if restore.returncode != 0:
            raise AssertionError(f"kb restore failed:\n{restore.stdout}\n{restore.stderr}")
        self.agent.wiki_root = self.home / "wiki"
        self.start_up()

    # --- the end -------------------------------------------------------------------------------
    def counts(self) -> dict[str, dict[str, int]]:
        """Per wiki workflow: changes landed, refused and retried, from the
        instance of the last home (the restore carried the earlier runs)."""
        os.environ["DAGSTER_HOME"] = str(self.home / "dagster")
        instance = dg.DagsterInstance.from_config(str(self.home / "dagster"))
        out = {}
        for workflow, asset in WIKI_WORKFLOWS.items():
            key = dg.AssetKey(asset)
            landed = instance.fetch_materializations(key, limit=10_000).records
            states = [r.asset_observation.metadata.get("state") for r in
                      instance.fetch_observations(key, limit=10_000).records]
            states = [getattr(s, "value", s) for s in states]
            out[workflow] = {"landed": len(landed), "refused": states.count("refused"),
                             "retried": states.count("retrying"), "failed": states.count("failed"),
                             "asked": self.agent.tasks[workflow]}
        return out

    def days_keys(self) -> list[str]:
        return [self.day_date(day).isoformat() for day in range(1, self.days + 1)]

    def week_labels(self) -> list[str]:
        from kb.wiki.weeks import iso_week_label

        return [iso_week_label(self.day_date(day) - timedelta(days=6)) for day in range(1, self.days + 1)
                if self.day_date(day).weekday() == 6]

    def search_tokens(self, tokens: list[str]) -> dict[str, list[str]]:
        """The sources that a search for each token finds (one kb process)."""
        script = ("import json, sys\nfrom kb.index.search import search\nout = {}\n"
                  "for token in json.loads(sys.argv[1]):\n"
                  "    hits = search(token, limit=5).hits\n"
                  "    out[token] = [h.best_chunk for h in hits]\n"
                  "print(json.dumps(out))\n")
        done = subprocess.run([sys.executable, "-c", script, json.dumps(tokens)], env=self.env(),
                              capture_output=True, text=True, timeout=WAIT_S)
        if done.returncode != 0:
            raise AssertionError(f"the search failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def du(path: Path) -> int:
    """Bytes of the files under path."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def tell_counts(counts: dict[str, dict[str, int]]) -> str:
    lines = [f"{'workflow':<10} {'asked':>5} {'landed':>6} {'refused':>7} {'retried':>7} {'failed':>6}"]
    for workflow, c in counts.items():
        lines.append(f"{workflow:<10} {c['asked']:>5} {c['landed']:>6} {c['refused']:>7} {c['retried']:>7} "
                     f"{c['failed']:>6}")
    return "\n".join(lines)


def cleanup(month: Month) -> None:
    shutil.rmtree(month.base, ignore_errors=True)


# The kinds of finding that the lint prompt and the playbook's lint ask the agent to fix.
ASKED_TO_FIX = ("dangling_links", "orphans", "index_mismatch", "frontmatter", "schema", "uncited", "duplicates",
                "contradiction_candidates", "unsupported", "stale_claims")


def month_findings(month: Month) -> dict[str, list]:
    """What the end of the month must not show, one list per check of
    issue 55 (empty lists: the check holds)."""
    from kb.wiki.checks import check_wiki

    subjects = month.subjects()
    wiki = month.home / "wiki"
    out: dict[str, list] = {}
    # Every source is in the wiki, or the owner was told why.
    sources = []
    for item in month.items:
        reply = month.final_reply(item)
        if reply is None:
            sources.append(f"day {item.day} {item.kind} (message {item.message_id}): no final reply: "
                           f"{month.telegram.replies_to(item.message_id)}")
        elif reply.startswith("Ingested"):
            sha = reply.split("Commit: ")[-1].strip() if "Commit: " in reply else ""
            known = sha and subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=wiki).returncode == 0
            if not known:
                sources.append(f"day {item.day} {item.kind}: 'Ingested' names no commit of the wiki: {reply!r}")
        elif item.expect == "wiki" and not (item.day == month.outage_day and reply.startswith("Ingest failed")):
            sources.append(f"day {item.day} {item.kind}: not in the wiki: {reply!r}")
    stranger = [m for m in month.telegram.sent if m["chat_id"] == STRANGER]
    sources += [f"the stranger got a reply: {m['text'][:100]!r}" for m in stranger]
    out["sources"] = sources
    # Every day has its lint commit, and every week its synthesis.
    out["lint commits"] = [day for day in month.days_keys() if f"lint: {day}" not in subjects]
    out["weekly syntheses"] = [week for week in month.week_labels() if f"synthesis: weekly {week}" not in subjects]
    # kb wiki check finds nothing that the agent was asked to fix.
    findings = check_wiki(wiki)
    out["wiki check"] = [f"{kind}: {item}" for kind in ASKED_TO_FIX for item in findings.get(kind, [])]
    # Search finds every source (the approved ones: ingested, or failed at the wiki on the outage day).
    searched = [i for i in month.items if i.token and (month.final_reply(i) or "").startswith(("Ingested", "Ingest failed"))]
    hits = month.search_tokens(sorted({i.token for i in searched}))
    out["search"] = [f"day {i.day} {i.kind}: no hit holds {i.token!r}" for i in searched
                     if not any(i.token in chunk.lower() for chunk in hits.get(i.token, []))]
    # Every failure was told once: no text twice to one message, no notice twice.
    seen: dict[tuple, int] = {}
    for message in month.telegram.sent:
        key = (message["chat_id"], message.get("reply_to_message_id"), message["text"])
        seen[key] = seen.get(key, 0) + 1
    out["told twice"] = [f"{n} times to message {key[1]}: {key[2][:160]!r}" for key, n in seen.items() if n > 1]
    failures = [i for i in month.items if (month.final_reply(i) or "").startswith(("Ingest failed", "failed: "))]
    out["told twice"] += [f"message {i.message_id}: {n} failure notices" for i in failures
                          if (n := sum(r.startswith(("Ingest failed", "failed: ")) for r in
                                       month.telegram.replies_to(i.message_id))) != 1]
    # After the stop, no process of kb is left, Dagster's log helpers included.
    out["processes left"] = list(month.stray) + [f"{p.pid} {' '.join(p.cmdline())[:200]}"
                                                 for p in month.kb_processes()]
    # KB_HOME grows within the stated bound.
    end = month.home_sizes.get("at the end", 0)
    out["home size"] = [f"KB_HOME holds {end / 1e6:.0f} MB; the bound is {HOME_BOUND_MB} MB"] \
        if end > HOME_BOUND_MB * 1e6 else []
    return out
