"""The owner's days with one `kb sync` each (issue 48): every sync carries
the work that waits in any batch, a failed capture does not keep that work
waiting, and a `--no-<source>` flag is for one run only.

Each sync runs in this process against a temp KB_HOME, as the owner types
it. Groq is a loopback server that speaks its API (tests/fake_groq.py); a
service that is down is a closed port.
"""

from __future__ import annotations

import socket

import dagster as dg
import pytest

from kb.index.client import ChunkIndex
from kb.sample_data import sample_pages
from tests.fake_groq import FakeGroq
from tests.test_sync import duck, instance, kb


@pytest.fixture(autouse=True)
def offline_stages(monkeypatch):
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")  # no model load


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/openai/v1"


def waiting_translations() -> int:
    from kb.store.duckdb_store import DuckDBStore
    from kb.enrich.foreign_text import waiting_by_batch

    with DuckDBStore.from_settings().connect() as conn:
        return sum(waiting_by_batch(conn, set()).values())


def last_metadata(asset: str) -> dict:
    [record] = instance().fetch_materializations(dg.AssetKey(asset), limit=1).records
    return {key: value.value for key, value in record.asset_materialization.metadata.items()}


def translated_passages() -> set[str]:
    rows = ChunkIndex.from_settings().table("chunks").search().where("source_text <> ''").select(
        ["tweet_id"]).limit(None).to_list()
    return {row["tweet_id"] for row in rows}


def indexed(source: str) -> int:
    return ChunkIndex.from_settings().table("chunks").count_rows(f"source = '{source}'")


def test_an_owners_week_a_service_down_an_expired_login_and_a_flag_for_one_run(monkeypatch, capsys):
    page1, page2, page3, _ = (str(p) for p in sample_pages())
    monkeypatch.setenv("GROQ_API_KEY", "gsk-TEST-SECRET-catch-up-0001")
    # No retries of a refused connection: the port stays closed.
    monkeypatch.setenv("KB_TRANSLATE_MAX_RETRIES", "0")

    # Day 1: Groq is down. The foreign texts of the batch wait.
    monkeypatch.setenv("GROQ_BASE_URL", closed_port_url())
    assert kb("import", "--no-link", page1, page2) == 1
    err = capsys.readouterr().err
    [(day1,)] = duck("SELECT max(batch) FROM bookmarks")
    waiting = waiting_translations()
    assert waiting > 0 and duck("SELECT count(*) FROM translations") == [(0,)]
    # The end report and `kb status` name the service and how many items wait for it.
    assert f"Note: {waiting} foreign passages wait for Groq (translations): Translation stopped" in err
    assert kb("status") == 0
    assert f"{waiting} waiting for Groq (translations)" in capsys.readouterr().out
    assert translated_passages() == set()
    assert indexed("quote") == 2

    # Day 2: Groq is back, but the X login expired (no login state at all),
    # and the owner skips the quotes in this run. The capture fails its own
    # step. The waiting work still moves: a second run translates day 1's
    # texts and puts the English in the index.
    with FakeGroq() as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert kb("sync", "--no-link", "--no-quote") == 1
    captured = capsys.readouterr()
    # Told once: on the capture's line, with no stack trace.
    assert (captured.out + captured.err).count("kb login") == 1, captured
    assert "Traceback" not in captured.err and "Stack Trace" not in captured.err
    assert "these stages failed: x_raw_pages." in captured.err
    assert "it did not run" not in captured.out  # the catch-up run did the work of those stages
    assert waiting_translations() == 0 and len(groq.requests) == waiting
    runs = instance().get_runs()
    assert [r.job_name for r in reversed(runs)] == ["x_sync", "x_sync", "x_catch_up"]
    assert runs[0].status == dg.DagsterRunStatus.SUCCESS and runs[0].tags["kb/exclude"] == "quote,link"
    # The Dagster UI shows where the work came from: day 1's batch.
    assert last_metadata("translations")["from_batches"] == {day1: waiting}
    assert last_metadata("chunk_index")["from_batches"].get(day1, 0) > 0
    day1_bookmarks = {row[0] for row in duck(f"SELECT tweet_id FROM bookmarks WHERE batch = '{day1}'")}
    assert translated_passages() and translated_passages() <= day1_bookmarks
    # --no-quote: the quotes left the index in this run; the chunks keep them.
    assert indexed("quote") == 0
    assert duck("SELECT count(*) FROM chunks WHERE source = 'quote'") == [(2,)]

    # Day 3: no flag, and no Groq key. Day 1's quotes come back from the
    # chunks, with the new one. The sync tries day 2's capture again: the
    # login is still missing, and it says so once more.
    monkeypatch.delenv("GROQ_API_KEY")
    assert kb("import", "--no-link", page3) == 1
    assert indexed("quote") == 3
    captured = capsys.readouterr()
    assert captured.err.endswith(f"these stages failed: x_raw_pages (batch {runs[1].tags['dagster/partition']}).\n")
    assert (captured.out + captured.err).count("kb login") == 1
    assert "gsk-TEST-SECRET" not in "".join(capsys.readouterr())


def test_a_model_that_comes_back_is_named_and_the_rebuild_keeps_search_working(monkeypatch, capsys):
    """The first index is made while Ollama is down (`auto` takes the local
    model). Ollama comes back: kb says so, and `kb index --rebuild` builds
    the new index beside the old one while searches go on."""
    import threading

    from kb.index import model_choice
    from kb.index.search import search
    from tests.fake_ollama import FakeOllama

    page1, page2, *_ = (str(p) for p in sample_pages())
    monkeypatch.setenv("KB_EMBED_BACKEND", "auto")
    monkeypatch.setenv("OLLAMA_URL", closed_port_url().removesuffix("/openai/v1"))
    assert kb("import", "--no-link", page1) == 0
    index = ChunkIndex.from_settings()
    local = index.model_info()[0]
    assert local.startswith("local:")
    assert f"Note: Index model: {local}." in capsys.readouterr().err

    with FakeOllama() as ollama:
        monkeypatch.setenv("OLLAMA_URL", ollama.url)
        # The next sync keeps the model of the index, and says that the configured one is ready.
        assert kb("import", "--no-link", page2) == 0
        err = capsys.readouterr().err
        assert f"Note: Index model: {local}." in err
        assert "the configured model ollama:embeddinggemma is ready" in err and "kb index --rebuild" in err
        assert kb("status") == 0
        assert "the configured model ollama:embeddinggemma is ready" in capsys.readouterr().out

        # The rebuild embeds in small parts; searches run all the time.
        monkeypatch.setattr(model_choice, "REBUILD_PART", 8)
        codes: list[int] = []
        rebuild = threading.Thread(target=lambda: codes.append(kb("index", "--rebuild")))
        rebuild.start()
        during = 0
        while rebuild.is_alive():
            response = search("bookmarks about programming", limit=3)
            assert response.hits and not response.note, response.note
            during += 1
        rebuild.join()
        assert codes == [0] and during > 0
        assert index.model_info()[0] == "ollama:embeddinggemma"
        assert search("bookmarks about programming", limit=3).hits
        out = capsys.readouterr()
        assert "now holds vectors of ollama:embeddinggemma" in out.err


def test_the_daemon_catches_up_each_earlier_batch_by_a_run_of_its_partition(tmp_path):
    """Runs that the daemon's sensor or the UI started: after a sync that
    succeeded (x_sync_catch_up_sensor) or whose capture failed
    (x_catch_up_sensor), one x_catch_up run is asked for each earlier batch
    with work that waits, with the run's kb/exclude. A `kb sync` run catches
    up itself: the sensors leave it."""
    from kb.apps.sync import CATCH_UP_TAG, SYNC_JOB, Runs, sync_run_config
    from kb_assets.partitions import sync_batches
    from sensors.capture_failed import x_catch_up_sensor, x_sync_catch_up_sensor

    page1, page2, *_ = (str(p) for p in sample_pages())
    missing = str(tmp_path / "not-there.json")
    inst = instance()
    first, daemon_ok, daemon_failed, command = (f"2026120{n}T000000000Z" for n in range(1, 5))
    inst.add_dynamic_partitions(sync_batches.name, [first, daemon_ok, daemon_failed, command])
    runs = Runs(inst)

    def sync(batch: str, files: list[str], tags: dict[str, str]) -> dg.DagsterRun:
        run_id, _ = runs.run(SYNC_JOB, run_config=sync_run_config(files=files),
                             tags={"dagster/partition": batch, **tags})
        return inst.get_run_by_id(run_id)

    # The first batch's posts stay out of the index: they wait for a run of that batch.
    sync(first, [page1], {CATCH_UP_TAG: "kb sync", "kb/exclude": "link,post"})
    ok_run = sync(daemon_ok, [page2], {"kb/exclude": "link"})
    failed_run = sync(daemon_failed, [missing], {"kb/exclude": "link,video"})
    command_run = sync(command, [missing], {CATCH_UP_TAG: "kb sync"})
    assert ok_run.status == dg.DagsterRunStatus.SUCCESS and failed_run.status == dg.DagsterRunStatus.FAILURE

    def evaluate(sensor, run: dg.DagsterRun, event_type: dg.DagsterEventType):
        [event] = [r.event_log_entry.dagster_event for r in
                   inst.get_records_for_run(run.run_id, of_type=event_type).records]
        context = dg.build_run_status_sensor_context(
            sensor_name=sensor.name, dagster_instance=inst, dagster_run=run, dagster_event=event)
        return sensor(context.for_run_failure() if event_type == dg.DagsterEventType.RUN_FAILURE else context)

    [request] = evaluate(x_sync_catch_up_sensor, ok_run, dg.DagsterEventType.RUN_SUCCESS)
    assert request.partition_key == first and request.tags == {"kb/exclude": "link"}
    [request] = evaluate(x_catch_up_sensor, failed_run, dg.DagsterEventType.RUN_FAILURE)
    assert request.partition_key == first and request.tags == {"kb/exclude": "link,video"}
    assert isinstance(evaluate(x_catch_up_sensor, command_run, dg.DagsterEventType.RUN_FAILURE), dg.SkipReason)


def test_an_embedder_that_is_down_is_named_with_the_bookmarks_that_wait(monkeypatch, capsys):
    """Ollama down (a closed port): the index stage stops and names how many
    bookmarks wait for it; a later run with the embedder back indexes them."""
    page1 = str(sample_pages()[0])
    monkeypatch.setenv("KB_EMBED_BACKEND", "ollama")
    monkeypatch.setenv("OLLAMA_URL", closed_port_url().removesuffix("/openai/v1"))
    assert kb("import", page1) == 1
    out = capsys.readouterr().out
    [(bookmarks,)] = duck("SELECT count(*) FROM bookmarks")
    line = next(line for line in out.splitlines() if line.strip().startswith("chunk_index"))
    assert "FAILED" in line and f"{bookmarks} bookmarks wait for the index: the first 3 failed alike" in line
    assert "Ollama at http://127.0.0.1:" in line

    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")  # the embedder is back
    assert kb("index") == 0
    assert ChunkIndex.from_settings().table("chunks").count_rows() > 0


def test_links_whose_sites_fail_are_counted_by_reason_with_the_command_that_fetches_them_again():
    from types import SimpleNamespace

    from kb.apps.run_report import waiting_for_services

    stages = [SimpleNamespace(batch=batch, metadata={"documents": {"failed": failed, "fetched": 9}})
              for batch, failed in (("b1", {"timeout": 2, "http_404": 1}), ("b2", {"timeout": 1}))]
    assert waiting_for_services(SimpleNamespace(stages=stages)) == [
        "4 links wait for their sites (http_404 1, timeout 3): `kb extract --retry` fetches them again."]
