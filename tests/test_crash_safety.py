"""Crash safety: SIGKILL the run process at chosen points, run the same
command again, and check that nothing is lost, repeated or left half done.

How each kill point is reached (each one is deterministic):
- capture: the fake X (tests/fake_x.py) holds the request for page 3 open;
- gate call: a loopback OpenAI-compatible endpoint holds the request open;
- wiki ingest: the fake Messages API (tests/fake_anthropic.py) holds a turn;
- documents: a loopback site holds the fetch of the last address open,
  after the others were fetched and written in groups;
- normalize, chunks, index: these stages call no outside service. A hook in
  the killed process waits inside the stage's write: after write_batch and
  before COMMIT (normalize), after the insert and before COMMIT (chunks),
  after the LanceDB commit of the passages and before the commit of the
  cards (index). The hook calls the real function unchanged, then waits to
  be killed. It exists only in the killed process; no product code knows it.

The killed process runs the `kb` command line (kb.apps.cli.main) or the job
of an inbox item: a real process with its own pid, which SIGKILL ends with
no cleanup. It comes from multiprocessing's fork server, which imported
the graph once: each kill then costs a fork, not an interpreter start.
Why not a fork of the test process: by then the test process has run other
tests, with LanceDB's and DuckDB's threads. A fork copies their locks, not
their threads, and the child crashed with SIGSEGV in LanceDB (CI, December
2026). The fork server has run nothing, so its children start clean.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import duckdb
import psutil
import pytest

# Imported here, once: each forked process then starts with the whole graph
# loaded, as the `kb` process has it when it reaches the kill point.
import kb.apps.cli  # noqa: F401
import kb_assets.definitions  # noqa: F401
from kb.sample_data import sample_pages
from kb.x.graphql import load_page
from kb.x.post_rows import parse_page
from kb_assets.instance_config import ensure_dagster_home
from kb.index.client import ChunkIndex
from kb.index.store import BOOKMARKS, CHUNKS
from kb.x.raw_store import RawStore
from kb.settings import excluded_sources, get_settings
from tests.fake_anthropic import FakeAnthropic, HeldAnthropic, ingest_turns, write
from tests.fake_openai_chat import FakeOpenAIChat, chat
from tests.fake_x import FakeX
from tests.loopback import LoopbackServer, QuietHandler, allow_fetches
from tests.loopback_site import HeldPdfSite, pdf_bytes

pytestmark = [
    pytest.mark.filterwarnings("ignore:coroutine 'BaseEventLoop.shutdown_asyncgens' was never awaited"),
    pytest.mark.slow,  # slow: kb or a server in another process
]

WAIT_S = 300  # a wait limit, not a speed check: the agent CLI starts slowly on a loaded machine
LOGIN = "TEST-SECRET-auth-token-crash-0001"
GATE_KEY = "sk-TEST-SECRET-GATE-KEY-crash-0003"
AGENT_TOKEN = "sk-TEST-SECRET-agent-crash-0004"


# --- the killed process ------------------------------------------------------------------


def install_pause(point: str, flag: Path) -> None:
    """In the killed process only: wait for ever at `point`, after writing `flag`."""

    def hold() -> None:
        flag.write_text(point)
        while True:
            time.sleep(3600)

    if point == "normalize":
        import kb.x.bookmark_tables as module

        real_write_batch = module.write_batch

        def write_batch(conn, rows, *, now):
            real_write_batch(conn, rows, now=now)
            hold()  # every row is written; the transaction is open, not committed

        module.write_batch = write_batch
    elif point == "chunks":
        import kb.index.chunk_sources as module

        real_insert_rows = module.insert_rows

        def insert_rows(conn, table, rows):
            real_insert_rows(conn, table, rows)
            hold()  # the old chunks are deleted and the new ones inserted; no COMMIT yet

        module.insert_rows = insert_rows
    elif point == "documents-groups-of-2":
        import kb.documents.document_store as module

        module.WRITE_EVERY = 2  # small groups, so that a few addresses make several writes
        flag.write_text(point)  # no hold here: the held fetch is the site's
    elif point == "index":
        def upsert_bookmark_cards(self, rows):
            hold()  # replace_chunks has committed the passages; the cards are not written

        ChunkIndex.upsert_bookmark_cards = upsert_bookmark_cards
    else:
        raise ValueError(point)


@dataclass
class KilledProcess:
    process: multiprocessing.Process
    log: Path
    flag: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> int | None:
        """The exit code once the process has ended (-9 for SIGKILL), else None."""
        code = self.process.exitcode
        if code is not None and self.process in FORKED:
            FORKED.remove(self.process)
        return code

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ready():
            code = self.exited()
            if code is not None:
                pytest.fail(f"the process ended (exit {code}) before {what}:\n{self.log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"no {what} within {WAIT_S} s:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.05)

    def wait_paused(self) -> None:
        self.wait_for(self.flag.exists, f"pause at {self.flag.read_text() if self.flag.exists() else self.flag.name}")

    def kill(self, *, keep_children: bool = False) -> list[int]:
        """SIGKILL the process, collect it, and return the pids of its children."""
        try:
            children = [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            children = []
        self.process.kill()
        self.process.join()
        if self.process in FORKED:
            FORKED.remove(self.process)
        if not keep_children:
            end_processes(children, wait_s=0)  # Chromium, its driver, Dagster's log tails
        return children


def end_processes(pids: list[int], wait_s: float) -> None:
    """Give orphans `wait_s` to end on their own, then end the ones left, by pid."""
    deadline = time.monotonic() + wait_s
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


FORKED: list[multiprocessing.Process] = []  # every process that fork_process made, for the clean-up below


@pytest.fixture(autouse=True)
def no_process_left():
    """A test that fails before its kill must not leave a paused process (and
    its Chromium or agent CLI) behind: it would hold files and pipes for ever."""
    yield
    while FORKED:
        process = FORKED.pop()
        try:
            children = [c.pid for c in psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            children = []
        process.kill()
        process.join()
        end_processes(children, wait_s=0)


def fork_server() -> multiprocessing.context.BaseContext:
    """multiprocessing's fork server, with this module (and through it the
    whole graph) imported once, before it forks anything."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def fork_process(tmp: Path, name: str, *, argv: list[str] | None = None, target: Callable[[], None] | None = None,
                 pause: str | None = None) -> KilledProcess:
    """Start a process that runs `kb <argv>` (or `target`, a picklable
    callable), with an optional pause point. It gets this process's
    environment and working folder of this moment (the test's KB_HOME)."""
    log, flag = tmp / f"{name}.log", tmp / f"{name}.paused"
    process = fork_server().Process(target=_child_main, name=name,
                                    args=(dict(os.environ), os.getcwd(), log, flag, pause, argv, target))
    process.start()
    FORKED.append(process)
    return KilledProcess(process, log, flag if pause else None)


def _child_main(environ: dict[str, str], cwd: str, log: Path, flag: Path, pause: str | None,
                argv: list[str] | None, target: Callable[[], None] | None) -> None:
    """The killed process: it never returns into multiprocessing."""
    code = 70
    try:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        out = open(log, "w", buffering=1)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        sys.stdout = sys.stderr = out
        if pause:
            install_pause(pause, flag)
        if target is not None:
            target()
        else:
            from kb.apps.cli import main

            main(argv, prog_name="kb", standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 71
    finally:
        os._exit(code)


# --- reading the stores ------------------------------------------------------------------


def duck(sql: str, params=()) -> list[tuple]:
    """Read DuckDB while no writer runs. The connection closes at once: the
    next forked process must find the file free."""
    conn = duckdb.connect(str(get_settings().duckdb_path), read_only=True)
    try:
        return conn.execute(sql, list(params)).fetchall()
    finally:
        conn.close()


def lance_rows(name: str, columns: list[str]) -> list[dict]:
    table = ChunkIndex.from_settings().table(name)
    return [] if table is None else table.to_arrow().select(columns).to_pylist()


def dagster_instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(ensure_dagster_home()))


def sync_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """The runs of the job x_sync, oldest first."""
    records = instance.get_run_records(filters=dg.RunsFilter(job_name="x_sync"))
    return [r.dagster_run for r in sorted(records, key=lambda r: r.storage_id)]


def steps_started(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.dagster_event.step_key for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)]


GONE = "is gone: it was killed or it crashed"  # the run launcher's health check


def claimed_slots(instance: dg.DagsterInstance) -> dict[str, list[str]]:
    storage = instance.event_log_storage
    return {pool: [s.run_id for s in storage.get_concurrency_info(pool).claimed_slots]
            for pool in ("duckdb", "wiki")}


def failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    [entry] = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return entry.dagster_event.message or ""


def sample_entries() -> list[dict]:
    """The tweet entries of the sample capture that `kb demo` ships."""
    entries = []
    for page in sample_pages():
        timeline = json.loads(page.read_bytes())["data"]["bookmark_timeline_v2"]["timeline"]
        for instruction in timeline["instructions"]:
            entries += [e for e in instruction.get("entries", []) if e["entryId"].startswith("tweet-")]
    return entries


def bookmarks_in(pages: list[bytes]) -> set[str]:
    """The bookmarks that a clean normalize makes of these pages."""
    now = datetime.now(timezone.utc)
    ids: set[str] = set()
    for n, body in enumerate(pages):
        parsed = parse_page(load_page(body, name=f"p{n}"), raw_file=f"p{n}", batch="b", captured_at=now)
        ids |= {b["tweet_id"] for b in parsed.bookmarks}
    return ids


def assert_store_consistent(live: set[str], removed: set[str]) -> None:
    """No bookmark lost or repeated; DuckDB and LanceDB agree: every chunk of a
    live bookmark is indexed once, nothing of a removed bookmark is."""
    rows = duck("SELECT tweet_id, removed_at FROM bookmarks")
    assert len(rows) == len({r[0] for r in rows}), "a bookmark is repeated"
    assert {t for t, r in rows if r is None} == live
    assert {t for t, r in rows if r is not None} == removed
    skip = excluded_sources()
    chunks = duck("SELECT chunk_id, tweet_id, source FROM chunks")
    assert {t for _, t, _ in chunks} <= live, "DuckDB holds chunks of a bookmark that is not live"
    expected = {c: t for c, t, s in chunks if s not in skip}
    with_text = {r[0] for r in duck("SELECT tweet_id FROM bookmarks WHERE removed_at IS NULL AND text <> ''")}
    assert with_text - set(expected.values()) == set(), "a live bookmark with text has no chunk"
    indexed = lance_rows(CHUNKS, ["chunk_id", "tweet_id"])
    assert len(indexed) == len({r["chunk_id"] for r in indexed}), "a chunk is indexed twice"
    assert {r["chunk_id"]: r["tweet_id"] for r in indexed} == expected
    cards = [r["tweet_id"] for r in lance_rows(BOOKMARKS, ["tweet_id"])]
    assert sorted(cards) == sorted(live)


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    # The deterministic embedder (no model load) and no fetch of the sample's links.
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    monkeypatch.setenv("KB_EXCLUDE", "link")


@pytest.fixture
def fake_x(monkeypatch):
    server = FakeX("127.0.0.1")
    monkeypatch.setenv("KB_X_BASE_URL", server.url)
    monkeypatch.setenv("KB_CHROMIUM_PATH", "/usr/bin/chromium")
    monkeypatch.setenv("KB_CAPTURE_SCROLL_WAIT_S", "0.5")
    monkeypatch.setenv("KB_CAPTURE_MAX_IDLE_SCROLLS", "3")
    monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "60")  # longer than any hold: the kill comes first
    state = {"cookies": [{"name": "auth_token", "value": LOGIN, "domain": "127.0.0.1", "path": "/",
                          "expires": -1, "httpOnly": True, "secure": False, "sameSite": "Lax"}], "origins": []}
    get_settings().x_state_path.write_text(json.dumps(state))
    yield server
    server.stop()


# --- the X path --------------------------------------------------------------------------


@pytest.mark.browser
def test_a_sync_killed_in_each_stage_is_finished_by_the_next_sync(fake_x, tmp_path):
    """Each sync first asks the run launcher about the started runs: the
    run of the killed sync is marked failed, its pool slot is freed, and
    the sync re-executes it from failure (Dagster's re-execution)."""
    from kb.apps.sync import run_sync

    entries = sample_entries()
    served = fake_x.serve_entries(entries, page_size=10)  # 4 pages of 10, then the end page
    fake_x.state.fail_after, fake_x.state.fail_mode, fake_x.state.hang_s = 2, "hang", WAIT_S
    instance = dagster_instance()
    raw = RawStore.from_settings()

    # 1. Capture: X holds the request for page 3; the kill comes while it waits.
    kb = fork_process(tmp_path, "sync-1", argv=["sync"])
    bookmarks_requests = lambda: sum(1 for s in fake_x.state.seen if s.path.endswith("/Bookmarks"))
    kb.wait_for(lambda: bookmarks_requests() >= 3 and len(raw.batches()) == 1 and len(raw.pages(raw.batches()[0])) == 2,
                "the request for Bookmarks page 3")
    kb.kill()
    [batch1] = raw.batches()
    assert [p.read_bytes() for p in raw.pages(batch1)] == served[:2]  # the pages kept, byte for byte
    manifest = raw.manifest(batch1)
    assert manifest.complete is False and manifest.error == "the capture started and did not finish"
    assert raw.watermark() is None  # no complete capture: the watermark did not move
    [capture_run] = sync_runs(instance)
    assert capture_run.status == dg.DagsterRunStatus.STARTED  # the run record outlives its process
    assert capture_run.tags["dagster/partition"] == batch1

    # 2. X answers again. The next sync re-executes batch 1 from failure: the
    # capture again, then normalize, killed inside its transaction.
    fake_x.state.fail_after = None
    kb = fork_process(tmp_path, "sync-2", argv=["sync"], pause="normalize")
    kb.wait_paused()
    # The new sync asked the run launcher: the worker was gone, the run is failed.
    capture_run = instance.get_run_by_id(capture_run.run_id)
    assert capture_run.status == dg.DagsterRunStatus.FAILURE
    assert GONE in failure_message(instance, capture_run.run_id)
    normalize_run = sync_runs(instance)[-1]
    assert normalize_run.parent_run_id == capture_run.run_id and normalize_run.tags["dagster/partition"] == batch1
    assert steps_started(instance, normalize_run.run_id)[:2] == ["x_raw_pages", "normalized_bookmarks"]
    kb.kill()
    assert claimed_slots(instance)["duckdb"] == []  # no pool for DuckDB: the writer lock died with the process
    assert duck("SELECT count(*) FROM bookmarks") == [(0,)]  # the open transaction rolled back
    assert [p.read_bytes() for p in raw.pages(batch1)] == served  # the capture of batch 1 is whole now

    # 3. Chunks, killed inside its transaction. The kernel freed the dead
    # writer's lock of the DuckDB file: the next sync writes at once.
    kb = fork_process(tmp_path, "sync-3", argv=["sync"], pause="chunks")
    kb.wait_paused()
    kb.kill()
    chunks_run = sync_runs(instance)[-1]
    assert chunks_run.parent_run_id == normalize_run.run_id
    assert steps_started(instance, chunks_run.run_id)[0] == "normalized_bookmarks"  # the capture is not redone
    assert instance.get_run_by_id(normalize_run.run_id).status == dg.DagsterRunStatus.FAILURE
    assert {r[0] for r in duck("SELECT tweet_id FROM bookmarks WHERE batch = ?", [batch1])} == bookmarks_in(served)
    assert duck("SELECT count(*) FROM chunks") == [(0,)]

    # 4. Index, killed between the LanceDB commit of the passages and that of the cards.
    kb = fork_process(tmp_path, "sync-4", argv=["sync"], pause="index")
    kb.wait_paused()
    kb.kill()
    index_run = sync_runs(instance)[-1]
    assert index_run.parent_run_id == chunks_run.run_id
    chunk_ids = {r[0] for r in duck("SELECT chunk_id FROM chunks WHERE source <> 'link'")}
    assert chunk_ids and {r["chunk_id"] for r in lance_rows(CHUNKS, ["chunk_id"])} == chunk_ids
    assert lance_rows(BOOKMARKS, ["tweet_id"]) == []  # half an index: passages, no cards
    assert raw.batches() == [batch1]  # the killed syncs added no batch: each died in the recovery

    # 5. The owner removed one bookmark meanwhile. `kb sync --full` finishes
    # batch 1 first, then captures everything in a new batch.
    removed = entries[3]["entryId"].removeprefix("tweet-")
    now_served = fake_x.serve_entries([e for e in entries if e is not entries[3]], page_size=10)
    report = run_sync(full=True)

    assert report.failed == [], report.stages
    assert report.gone_runs == [index_run.run_id]
    assert report.resumed == [batch1]
    assert [s.stage for s in report.stages if s.batch == batch1] == ["chunk_index"]  # only what was left
    assert raw.pages(report.batch) and [p.read_bytes() for p in raw.pages(report.batch)] == now_served
    # The full capture is complete: the watermark moved, to its first bookmark.
    assert raw.watermark() == {"tweet_id": entries[0]["entryId"].removeprefix("tweet-"),
                               "sort_index": entries[0]["sortIndex"], "batch": report.batch}
    assert_store_consistent(live=bookmarks_in(served) - {removed}, removed={removed})

    # Every run ended; the four killed ones are failed by the health check; no pool slot is held.
    runs = sync_runs(instance)
    assert all(r.is_finished for r in runs) and len(runs) == 6
    killed = [capture_run, normalize_run, chunks_run, index_run]
    assert [r.run_id for r in runs if GONE in failure_message_or_empty(instance, r)] == [r.run_id for r in killed]
    assert [r.status for r in runs[-2:]] == [dg.DagsterRunStatus.SUCCESS] * 2
    assert claimed_slots(instance) == {"duckdb": [], "wiki": []}


def failure_message_or_empty(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    return failure_message(instance, run.run_id) if run.status == dg.DagsterRunStatus.FAILURE else ""


@pytest.mark.slow  # the demo always loads the local embedding model
def test_kb_demo_killed_in_chunks_finishes_when_run_again(tmp_path, monkeypatch):
    """`kb demo` on its sample: killed once, then run again, it exits 0 and
    every demo search finds its post. It loads the local model."""
    from kb.apps.demo import run_demo

    home = tmp_path / "demo-home"
    # run_demo sets these in os.environ; monkeypatch puts them back after the test.
    for name, value in (("KB_HOME", str(home)), ("DAGSTER_HOME", str(home / "dagster")),
                        ("KB_EMBED_BACKEND", "local")):
        monkeypatch.setenv(name, value)

    kb = fork_process(tmp_path, "demo-1", argv=["demo", "--home", str(home)], pause="chunks")
    kb.wait_paused()
    kb.kill()
    instance = dagster_instance()
    [killed] = sync_runs(instance)
    assert killed.status == dg.DagsterRunStatus.STARTED

    assert run_demo(home) == 0
    first, resumed, second = sync_runs(instance)
    assert first.run_id == killed.run_id and first.status == dg.DagsterRunStatus.FAILURE
    # The killed batch was re-executed from failure: its chunks and index.
    assert resumed.parent_run_id == killed.run_id and resumed.status == dg.DagsterRunStatus.SUCCESS
    assert steps_started(instance, resumed.run_id)[0] == "chunks"
    # A new batch imported the sample again.
    assert second.status == dg.DagsterRunStatus.SUCCESS and second.tags["kb/exclude"] == "link"
    assert_store_consistent(live=bookmarks_in([p.read_bytes() for p in sample_pages()]), removed=set())


def test_which_earlier_batches_a_sync_finishes():
    """The rules of unfinished_batches, on run records of x_sync."""
    from kb.apps.sync import MAX_FAILED_RUNS, unfinished_batches

    instance = dagster_instance()
    ok, failed = dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE
    history = {
        "b1-done": [ok],
        "b2-failed": [failed],
        "b3-finished-by-re-execution": [failed, ok],
        "b4-fails-each-time": [failed] * MAX_FAILED_RUNS,
        "b5-in-progress": [dg.DagsterRunStatus.STARTED],
        "b6-canceled-by-the-owner": [dg.DagsterRunStatus.CANCELED],
        "b7-no-run": [],  # a batch of a backfill that is not launched yet
    }
    last = {}
    for batch, statuses in history.items():
        instance.add_dynamic_partitions("sync_batches", [batch])
        for status in statuses:
            last[batch] = dg.DagsterRun(job_name="x_sync", status=status, tags={"dagster/partition": batch})
            instance.add_run(last[batch])

    found = {u.batch: (u.last_run.run_id if u.last_run else None, u.note) for u in unfinished_batches(instance)}

    assert set(found) == {"b2-failed", "b4-fails-each-time"}
    assert found["b2-failed"] == (last["b2-failed"].run_id, "")
    assert found["b4-fails-each-time"][0] is None
    assert found["b4-fails-each-time"][1].startswith(f"its runs failed {MAX_FAILED_RUNS} times at the same step")


# --- documents: a long fetch ------------------------------------------------------------


def documents_rows() -> list[tuple]:
    """(url, status) of every document, through kb's store: it waits for
    the writer lock while the killed process writes a group."""
    from kb.store.duckdb_store import DuckDBStore

    with DuckDBStore.from_settings().connect() as conn:
        return conn.execute("SELECT url, status FROM documents ORDER BY url").fetchall()


def test_documents_killed_in_a_long_fetch_keeps_each_written_group_and_the_next_run_goes_on(tmp_path, monkeypatch):
    """`documents` writes its results in groups as they come: a kill in a
    long fetch loses at most one group, and the next run fetches only the
    addresses with no result."""
    from kb.store.duckdb_store import DuckDBStore, insert_rows
    from kb.urls import normalize_url
    from tests.enrich_rows import add_batches, bookmark, write
    from tests.test_sync import kb as kb_command

    paths, held = [f"/doc-{n}.pdf" for n in range(6)], "/zz-held.pdf"
    body = pdf_bytes("Glaciers in the northern valleys lost a third of their ice in two decades. " * 12)
    with HeldPdfSite(body, wait_s=WAIT_S, paths=paths, held=held) as site:
        allow_fetches(monkeypatch, site.base_url)
        monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", str(WAIT_S))  # the held fetch waits for the kill
        monkeypatch.delenv("KB_EXCLUDE")  # this test fetches links
        batch = "20261101T000000000Z"
        urls = [site.base_url + path for path in [*paths, held]]
        write([bookmark("1", batch, text="reports on glaciers")])
        with DuckDBStore.from_settings().transaction() as conn:
            insert_rows(conn, "links", [{"tweet_id": "1", "url_norm": normalize_url(url), "position": n,
                                         "expanded_url": url, "host": "127.0.0.1", "kind": "link",
                                         "from_quote": False, "batch": batch} for n, url in enumerate(urls)])
        add_batches(dagster_instance(), batch)

        run = fork_process(tmp_path, "extract-1", argv=["extract"], pause="documents-groups-of-2")
        run.wait_for(lambda: site.arrived.is_set() and len(documents_rows()) == len(paths),
                     "the written groups and the held fetch")
        run.kill()
        # Three groups of two landed before the kill; the held address has no row.
        assert documents_rows() == [(url, "ok") for url in urls[:-1]]
        fetched_before = dict(site.hits)

        site.release.set()
        assert kb_command("extract") == 0
    assert documents_rows() == [(url, "ok") for url in urls]
    # The next run fetched the held address only: the written ones were not fetched again.
    assert {path: site.hits[path] for path in paths} == {path: fetched_before[path] for path in paths}
    assert site.hits[held] > fetched_before[held]


# --- the Telegram inflow: gate call and wiki ingest --------------------------------------


class HeldEndpoint(LoopbackServer):
    """An OpenAI-compatible endpoint that takes each request and does not
    answer it: the gate call is in flight when the test kills the run. The
    end of its `with` block releases it."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        endpoint = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                endpoint.arrived.set()
                endpoint.release.wait(WAIT_S)
                self.close_connection = True

        self.bind(Handler)

    def __exit__(self, *exc) -> None:
        self.release.set()
        super().__exit__(*exc)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def processes_in(root: Path) -> list[int]:
    """Processes whose working folder is `root` (the agent's CLI runs in the wiki)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.cwd() == str(root) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def run_intake_job(item_id: str) -> None:
    """What a run worker of the daemon does for an inbox item. The job is
    built here, in the worker: its resources take the settings of this
    moment (the test points the gate or the agent at another loopback server)."""
    from tests import source_helpers as h

    h.intake_job().execute_in_process(partition_key=item_id, instance=dg.DagsterInstance.get(), raise_on_error=False)


def test_inbox_item_killed_in_the_gate_call_and_in_the_ingest_is_done_once(tmp_path, monkeypatch):
    from kb_assets.run_launcher import fail_runs_of_dead_workers
    from kb_assets.source_states import read_item_state
    from tests import source_helpers as h

    home = tmp_path / "agent-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # the agent's CLI writes nothing in the real HOME
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", AGENT_TOKEN)
    monkeypatch.setenv("DEEPSEEK_API_KEY", GATE_KEY)
    monkeypatch.setenv("KB_AGENT_TIMEOUT_S", "60")
    instance = h.instance()
    item = h.add_item("text", 7, text="Write-ahead logging makes a database crash safe: the log comes first.")
    instance.add_dynamic_partitions("sources", [item.id])
    run_item = partial(run_intake_job, item.id)

    def check_workers() -> int:
        """What the daemon's run monitoring does: ask kb's run launcher."""
        return len(fail_runs_of_dead_workers(instance))

    # 1. The gate call is in flight.
    with HeldEndpoint() as held_gate:
        monkeypatch.setenv("KB_GATE_BASE_URL", held_gate.base_url)
        run = fork_process(tmp_path, "intake-1", target=run_item)
        run.wait_for(held_gate.arrived.is_set, "the gate call")
        run.kill()
    [first] = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": item.id}))
    assert first.status == dg.DagsterRunStatus.STARTED
    assert claimed_slots(instance)["duckdb"] == []  # the gate call holds no slot and no writer lock
    assert read_item_state(instance, item.id).state == "processing"  # what /status says before the check
    [(status, parsed_path)] = duck("SELECT status, parsed_path FROM sources")
    assert status == "parsed" and duck("SELECT count(*) FROM gate_results") == [(0,)]

    assert check_workers() == 1
    first = instance.get_run_by_id(first.run_id)
    assert first.status == dg.DagsterRunStatus.FAILURE
    assert first.tags["dagster/will_retry"] == "true"  # Dagster's run retries take it from here
    assert read_item_state(instance, item.id).state == "retrying"
    assert claimed_slots(instance)["duckdb"] == []
    assert check_workers() == 0

    # 2. The retry: the gate answers; the agent has written its pages and its report turn is held.
    slug = Path(parsed_path).stem
    wiki_root = get_settings().wiki_dir
    with FakeOpenAIChat(chat('{"score": 80, "topics": ["databases"], "reason": "solid"}')) as gate, \
            HeldAnthropic(ingest_turns(slug), hold_turn=2) as agent:
        monkeypatch.setenv("KB_GATE_BASE_URL", gate.base_url)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", agent.base_url)
        # What the agent does when its process outlives the run: a change of its own.
        agent.turns[2] = [write("wiki/entities/Orphan.md", "# orphan\n")]
        run = fork_process(tmp_path, "intake-2", target=run_item)
        run.wait_for(agent.arrived.is_set, "the agent's report turn")
        init = git(wiki_root, "rev-list", "--max-parents=0", "HEAD")
        # kb commits only after the report: the pages are written, not committed.
        assert git(wiki_root, "log", "--format=%s") == "init: wiki"
        assert f"wiki/sources/{slug}.md" in git(wiki_root, "status", "--porcelain", "--untracked-files=all")
        cli = run.kill(keep_children=True)
        assert cli, "the agent's CLI ran as a child of the run"
        agent.release.set()  # the orphaned CLI gets its turn: a write
        deadline = time.monotonic() + 20
        while processes_in(wiki_root) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_in(wiki_root)
        end_processes(cli, wait_s=0)
        assert left == [], "the agent's CLI outlived its run"
    # With its run gone, the CLI's tool calls are denied: it changed nothing.
    assert git(wiki_root, "rev-parse", "HEAD") == init
    assert not (wiki_root / "wiki/entities/Orphan.md").exists()
    assert (wiki_root / ".git/kb-change-in-progress").exists()  # the next change rolls this one back

    assert check_workers() == 1
    assert claimed_slots(instance)["wiki"] == []

    # 3. The next retry rolls the unfinished change back and ingests once.
    with FakeAnthropic(turns=ingest_turns(slug)) as agent:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", agent.base_url)
        with FakeOpenAIChat(chat('{"score": 80, "topics": ["databases"], "reason": "solid"}')) as gate:
            monkeypatch.setenv("KB_GATE_BASE_URL", gate.base_url)
            result = h.intake_job().execute_in_process(partition_key=item.id, instance=instance, raise_on_error=False)
    assert result.success
    assert git(wiki_root, "log", "--format=%s") == f"ingest: {slug}\ninit: wiki"  # one clean commit further
    assert git(wiki_root, "rev-list", "--max-parents=0", "HEAD") == init
    assert git(wiki_root, "rev-parse", "HEAD^") == init
    assert git(wiki_root, "status", "--porcelain") == ""
    assert not (wiki_root / ".git/kb-change-in-progress").exists()
    assert (wiki_root / parsed_path).is_file()  # the parsed source is kept
    assert duck("SELECT status FROM sources") == [("accepted",)]
    assert duck("SELECT count(*), min(decision) FROM gate_results") == [(1, "accepted")]
    state = read_item_state(instance, item.id)
    assert state.state == "done" and state.commit == git(wiki_root, "rev-parse", "HEAD")
    assert claimed_slots(instance) == {"duckdb": [], "wiki": []}
