"""Captions: the `captions` asset with the openai backend, through the real
`openai` client against a loopback OpenAI-compatible vision server, with
the photos served on loopback; the caption sensor; `kb caption`
(run_captions); the image chunk source; and the `image` exclusion, from
DuckDB to the LanceDB index."""

from __future__ import annotations

import hashlib

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from kb.apps.caption_run import run_captions
from kb_assets.enrich.photo_captions import captions
from kb.index.chunk_sources import image_texts
from kb_assets.index.chunks import chunks
from kb.settings import excluded_sources
from kb_assets.index.chunk_index import chunk_index
from kb.apps.status import _duckdb_counts
from kb.store.duckdb_store import DuckDBStore
from kb.index.client import ChunkIndex
from kb.settings import get_settings
from sensors.waiting_photos import captions_job, captions_sensor, captions_to_index_sensor
from tests.enrich_rows import add_batches, bookmark, media, rows, write
from tests.fake_media import FakeVisionServer, MediaServer, png
from tests.stage_checks import coverage, stage_failure
from tests.shared_data import REPO
from kb_resources.services import CaptionerResource, EmbedderResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource

# The loopback sites stand in for the web: let the fetch guard reach them.
pytestmark = pytest.mark.usefixtures("loopback_fetches")

B1, B2 = "20261101T000000000Z", "20261102T000000000Z"
KEY = "sk-TEST-SECRET-vision-0000"
RED, BLUE = png(40, 20, (220, 20, 20)), png(30, 30, (20, 20, 220))


@pytest.fixture
def photos():
    with MediaServer({"/media/red.png": (RED, "image/png"), "/media/blue.png": (BLUE, "image/png"),
                      "/media/page.jpg": (b"<html>not an image</html>", "text/html")}) as server:
        yield server


@pytest.fixture
def vision(monkeypatch):
    with FakeVisionServer() as server:
        server.ocr_by_sha[hashlib.sha256(RED).hexdigest()] = "SALE 50%"
        monkeypatch.setenv("KB_CAPTION_BACKEND", "openai")
        monkeypatch.setenv("KB_CAPTION_BASE_URL", server.base_url + "/v1")
        monkeypatch.setenv("KB_CAPTION_MODEL", "test-vl")
        monkeypatch.setenv("KB_CAPTION_API_KEY", KEY)
        yield server


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        add_batches(inst, B1, B2)
        yield inst


def _write_bookmarks(photos: MediaServer) -> None:
    write([bookmark("1", B1, handle="alice"), bookmark("2", B1, handle="bob"), bookmark("3", B2, handle="carol")],
          [media("1", "3_1", 0, "photo", photos.url("/media/red.png"), B1),
           media("1", "3_2", 1, "photo", photos.url("/media/blue.png"), B1),
           media("2", "3_3", 0, "photo", photos.url("/media/gone.png"), B1),
           media("2", "7_4", 1, "video", photos.url("/media/poster.jpg"), B1, smallest_mp4=photos.url("/v.mp4")),
           media("3", "3_5", 0, "photo", photos.url("/media/page.jpg"), B2)])


def _materialize(instance, assets, batch=B1, config=None, **resources):
    return dg.materialize(
        assets, partition_key=batch, instance=instance, raise_on_error=False,
        resources={"duckdb": DuckDBResource.from_settings(), "captioner": CaptionerResource.from_settings(), **resources},
        run_config={"ops": {"captions": {"config": config}}} if config else None)


def _caption_rows() -> dict[str, tuple]:
    return {url.rsplit("/", 1)[-1]: tuple(rest) for url, *rest in
            rows("SELECT url, status, reason, caption, ocr_text, model, attempts FROM captions")}


@pytest.mark.slow
def test_photos_wait_below_the_threshold_then_get_captions(vision, photos, instance):
    _write_bookmarks(photos)
    waiting = _materialize(instance, [captions])
    assert waiting.success
    metadata = waiting.asset_materializations_for_node("captions")[0].metadata
    # The threshold counts the photos that wait in every batch, not the run's batch alone;
    # the metadata of the partition counts what waits in it.
    assert metadata["waiting"].value == 3 and metadata["skipped"].value.startswith("4 photo(s) wait")
    assert "a caption run starts at 20" in metadata["skipped"].value
    assert vision.requests == [] and rows("SELECT count(*) FROM captions") == [(0,)]

    # A run of B1 (as a backfill of B1 in the UI) takes B1's photos only.
    result = _materialize(instance, [captions], config={"min_photos": 0})
    assert result.success
    found = _caption_rows()
    assert found["red.png"] == ("ok", None, "A plain picture of 40 by 20 pixels.", "SALE 50%", "test-vl", 1)
    assert found["blue.png"] == ("ok", None, "A plain picture of 30 by 30 pixels.", "", "test-vl", 1)
    assert found["gone.png"][:2] == ("failed", "http_404")
    assert "poster.jpg" not in found  # a video poster is not a photo
    # The endpoint got the exact bytes of each photo, as a data URL, from the real client.
    assert sorted(vision.images) == sorted([RED, BLUE])
    assert set(vision.paths) == {"/v1/chat/completions"}
    assert vision.requests[0]["model"] == "test-vl"
    # The check is B1's: each of its photos has a result (B2's photo waits in B2).
    check = coverage(result, "captions")
    assert check.passed and check.partition == B1
    assert (check.metadata["photos"].value, check.metadata["captioned"].value,
            check.metadata["failed"].value, check.metadata["waiting"].value) == (3, 2, 1, 0)
    # `kb status` shows the numbers of every batch.
    assert _duckdb_counts(get_settings())["captions"] == {"photos": 4, "captioned": 2, "failed": 1, "waiting": 1}

    # A failure is tried again only on request.
    assert _materialize(instance, [captions], config={"min_photos": 0}).success
    assert len(vision.requests) == 2
    assert _materialize(instance, [captions], config={"min_photos": 0, "retry": True}).success
    assert _caption_rows()["gone.png"][:2] == ("failed", "http_404") and _caption_rows()["gone.png"][-1] == 2
    assert photos.hits["/media/gone.png"] == 2

    with DuckDBStore.from_settings().connect() as conn:
        texts = list(image_texts(conn, ["1", "2"]))
    assert [(t.tweet_id, t.source, t.ref) for t in texts] == [
        ("1", "image", photos.url("/media/red.png")), ("1", "image", photos.url("/media/blue.png"))]
    assert texts[0].text == "A plain picture of 40 by 20 pixels.\n\nSALE 50%"


@pytest.mark.slow
def test_kb_caption_runs_every_waiting_batch_in_one_run(vision, photos, monkeypatch):
    """`kb caption`: one run of captions_job over both batches, in the
    instance under KB_HOME, then the index of each batch."""
    from kb_assets.instance_config import ensure_dagster_home

    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    instance = dg.DagsterInstance.from_config(str(ensure_dagster_home()))
    add_batches(instance, B1, B2)
    _write_bookmarks(photos)
    vision.prose_for.add(hashlib.sha256(BLUE).hexdigest())
    summary = run_captions(limit=0, retry=False)
    assert summary["ok"] and summary["batches"] == 2 and summary["waiting_before"] == 4
    assert summary["captioned"] == 1 and summary["failed"] == {"bad_answer": 1, "http_404": 1, "not_image": 1}
    caption_runs = instance.get_runs(filters=dg.RunsFilter(job_name="captions_job"))
    assert len(caption_runs) == 1  # one run, so one GPU start, for both batches
    assert (caption_runs[0].tags[ASSET_PARTITION_RANGE_START_TAG],
            caption_runs[0].tags[ASSET_PARTITION_RANGE_END_TAG]) == (B1, B2)
    # A caption run never starts a GPU again by itself: only --retry tries again.
    assert caption_runs[0].tags["dagster/max_retries"] == "0"
    assert instance.get_materialized_partitions(dg.AssetKey("captions")) == {B1, B2}
    # Then the new caption went on to the index, batch by batch.
    assert summary["indexed_batches"] == 2 and summary["index_errors"] == []
    image = [p for p in ChunkIndex.from_settings().passages(tweet_id="1") if p["source"] == "image"]
    assert [p["ref"] for p in image] == [photos.url("/media/red.png")]
    found = _caption_rows()
    assert found["page.jpg"][:2] == ("failed", "not_image")
    assert found["blue.png"][:2] == ("failed", "bad_answer")
    assert len(vision.requests) == 2  # the page and the 404 never reached the model

    assert run_captions(limit=0, retry=False)["message"] == "No photo waits for a caption."
    limited = run_captions(limit=1, retry=True)
    assert limited["ok"] and limited["waiting"] == 2  # 3 failed photos: one tried, two left


def test_a_failing_endpoint_stops_the_stage_and_the_photos_wait(photos, instance, monkeypatch):
    _write_bookmarks(photos)
    with FakeVisionServer(status_code=503) as down:
        monkeypatch.setenv("KB_CAPTION_BACKEND", "openai")
        monkeypatch.setenv("KB_CAPTION_BASE_URL", down.base_url + "/v1")
        monkeypatch.setenv("KB_CAPTION_MODEL", "test-vl")
        result = _materialize(instance, [captions], config={"min_photos": 0}, captioner=CaptionerResource.from_settings(timeout_s=5, max_retries=0))
    assert result.success  # the stages after it in x_sync still run
    stopped = stage_failure(result, "captions")
    assert "The caption backend stopped" in stopped and down.base_url in stopped
    # The photos that reached the endpoint are not marked failed: they wait for the next run.
    found = _caption_rows()
    assert "red.png" not in found and "blue.png" not in found
    assert all(row[:2] == ("failed", "http_404") for row in found.values())  # at most the photo's own 404


# The UI's own question: the checks of the asset, with the status of each
# for the latest materialization.
CHECKS_QUERY = """{ assetNodes(assetKeys: [{path: ["captions"]}]) { assetChecksOrError {
  ... on AssetChecks { checks { name executionForLatestMaterialization { status
    evaluation { severity description } } } } } } }"""


def test_a_stopped_stage_is_red_in_the_uis_graphql(photos, monkeypatch):
    """The run goes on to the index, but the UI shows the stage as failed:
    its stage check failed with severity ERROR (issue 57: a failure is red)."""
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    _write_bookmarks(photos)
    monkeypatch.setenv("KB_CAPTION_BACKEND", "openai")
    monkeypatch.setenv("KB_CAPTION_MODEL", "test-vl")
    # The UI reads a stored instance; its code server loads kb's definitions.
    with dg.instance_for_test() as instance, FakeVisionServer(status_code=503) as down:
        add_batches(instance, B1, B2)
        monkeypatch.setenv("KB_CAPTION_BASE_URL", down.base_url + "/v1")
        result = _materialize(instance, [captions], config={"min_photos": 0},
                              captioner=CaptionerResource.from_settings(timeout_s=5, max_retries=0))
        assert result.success  # the stages after it still run
        with define_out_of_process_context(str(REPO / "kb_assets" / "definitions.py"), "defs", instance) as context:
            answer = execute_dagster_graphql(context, CHECKS_QUERY)
    assert not answer.errors, answer.errors
    [node] = answer.data["assetNodes"]
    checks = {check["name"]: check["executionForLatestMaterialization"]
              for check in node["assetChecksOrError"]["checks"]}
    assert checks["captions_stage"]["status"] == "FAILED"
    assert checks["captions_stage"]["evaluation"]["severity"] == "ERROR"
    assert "The caption backend stopped" in checks["captions_stage"]["evaluation"]["description"]
    assert checks["captions_coverage"]["evaluation"]["severity"] == "WARN"


def test_the_sensor_starts_one_run_when_enough_photos_wait(vision, photos, instance, monkeypatch):
    _write_bookmarks(photos)
    monkeypatch.setenv("KB_CAPTION_MIN_PHOTOS", "5")
    skipped = captions_sensor(dg.build_sensor_context(instance=instance, resources={"captioner": CaptionerResource.from_settings()}))
    assert isinstance(skipped, dg.SkipReason) and "4 photo(s) wait" in skipped.skip_message

    monkeypatch.setenv("KB_CAPTION_MIN_PHOTOS", "4")
    request = captions_sensor(dg.build_sensor_context(instance=instance, resources={"captioner": CaptionerResource.from_settings()}))
    assert isinstance(request, dg.RunRequest)
    assert (request.tags[ASSET_PARTITION_RANGE_START_TAG], request.tags[ASSET_PARTITION_RANGE_END_TAG]) == (B1, B2)
    assert request.run_config["ops"]["captions"]["config"]["min_photos"] == 0

    instance.add_run(DagsterRun(job_name=captions_job.name, run_id="a-caption-run",
                                status=dg.DagsterRunStatus.STARTED))
    busy = captions_sensor(dg.build_sensor_context(instance=instance, resources={"captioner": CaptionerResource.from_settings()}))
    assert isinstance(busy, dg.SkipReason) and "a-caption-run" in busy.skip_message

    monkeypatch.setenv("KB_CAPTION_BACKEND", "off")
    off = captions_sensor(dg.build_sensor_context(instance=instance, resources={"captioner": CaptionerResource.from_settings()}))
    assert isinstance(off, dg.SkipReason) and "off" in off.skip_message


def test_the_sync_and_the_sensor_count_every_waiting_photo_alike(vision, photos, instance, monkeypatch):
    """Day 1 left 3 photos (B1), day 2 brings 1 (B2). The run of day 2's
    batch, as `kb sync` makes it, counts all 4, as the sensor does: a daily
    sync of a few photos adds up to a caption run."""
    _write_bookmarks(photos)
    sensor = dg.build_sensor_context(instance=instance, resources={"captioner": CaptionerResource.from_settings()})
    monkeypatch.setenv("KB_CAPTION_MIN_PHOTOS", "5")
    skipped = captions_sensor(sensor)
    waiting = _materialize(instance, [captions], batch=B2)
    reason = waiting.asset_materializations_for_node("captions")[0].metadata["skipped"].value
    assert skipped.skip_message == reason and reason.startswith("4 photo(s) wait; a caption run starts at 5")
    assert rows("SELECT count(*) FROM captions") == [(0,)]

    monkeypatch.setenv("KB_CAPTION_MIN_PHOTOS", "4")
    assert isinstance(captions_sensor(sensor), dg.RunRequest)
    result = _materialize(instance, [captions], batch=B2)
    # Enough photos wait over every batch: the run of B2 captions B2's photo, and B1's wait for a run of B1.
    assert result.success and rows("SELECT count(*) FROM captions") == [(1,)]
    # The Dagster UI shows the batch that each photo came from: the partition's own.
    assert result.asset_materializations_for_node("captions")[0].metadata["from_batches"].value == {B2: 1}
    # B1's 3 photos are below the threshold of 4 now: they wait (each run counts every batch).
    assert "3 photo(s) wait" in _materialize(instance, [captions], batch=B1).asset_materializations_for_node(
        "captions")[0].metadata["skipped"].value
    monkeypatch.setenv("KB_CAPTION_MIN_PHOTOS", "3")
    assert _materialize(instance, [captions], batch=B1).success
    assert rows("SELECT count(*) FROM captions") == [(4,)]


def test_after_a_caption_run_each_batch_goes_on_to_the_index(vision, photos, instance):
    _write_bookmarks(photos)
    defs = dg.Definitions(assets=[captions], jobs=[captions_job],
                          resources={"duckdb": DuckDBResource.from_settings(), "captioner": CaptionerResource.from_settings()})
    result = defs.resolve_job_def(captions_job.name).execute_in_process(
        instance=instance, run_config={"ops": {"captions": {"config": {"min_photos": 0}}}},
        tags={ASSET_PARTITION_RANGE_START_TAG: B1, ASSET_PARTITION_RANGE_END_TAG: B2})
    assert result.success and rows("SELECT count(*) FROM captions") == [(4,)]
    run = instance.get_run_by_id(result.run_id)
    success = instance.get_records_for_run(result.run_id, of_type=DagsterEventType.RUN_SUCCESS).records[0]
    context = dg.build_run_status_sensor_context(
        sensor_name=captions_to_index_sensor.name, dagster_instance=instance, dagster_run=run,
        dagster_event=success.event_log_entry.dagster_event)
    requests = captions_to_index_sensor(context)
    assert [(r.partition_key, r.run_key) for r in requests] == [(B1, f"{run.run_id}:{B1}"), (B2, f"{run.run_id}:{B2}")]


@pytest.mark.slow
def test_excluded_images_leave_the_index_but_stay_in_duckdb(vision, photos, instance, monkeypatch, kb_home):
    _write_bookmarks(photos)
    index_resources = {"embedder": EmbedderResource.from_settings(backend="hash"), "lance": ChunkIndexResource.from_settings()}
    assert _materialize(instance, [captions], config={"min_photos": 0}).success
    assert _materialize(instance, [chunks, chunk_index], **index_resources).success
    assert {p["source"] for p in ChunkIndex.from_settings().passages(tweet_id="1")} == {"post", "image"}

    monkeypatch.setenv("KB_EXCLUDE", "image")
    requests_before = len(vision.requests)
    skipped = _materialize(instance, [captions], config={"min_photos": 0, "retry": True})
    assert skipped.success and len(vision.requests) == requests_before
    assert "excluded" in skipped.asset_materializations_for_node("captions")[0].metadata["skipped"].value
    assert _materialize(instance, [chunks, chunk_index], **index_resources).success
    assert {p["source"] for p in ChunkIndex.from_settings().passages(tweet_id="1")} == {"post"}
    assert rows("SELECT count(*) FROM captions WHERE status = 'ok'") == [(2,)]  # kept for a later run
    # The chunks keep them too: the index takes them from there when the exclusion ends.
    assert rows("SELECT count(*) FROM chunks WHERE source = 'image'") == [(2,)]

    monkeypatch.delenv("KB_EXCLUDE")
    assert _materialize(instance, [chunks, chunk_index], **index_resources).success
    assert {p["source"] for p in ChunkIndex.from_settings().passages(tweet_id="1")} == {"post", "image"}  # back, with no new caption
    assert len(vision.requests) == requests_before


def test_excluded_sources_join_the_config_file_and_the_run(monkeypatch, kb_home):
    (kb_home.parent / "config" / "config.toml").write_text('exclude = ["video", "Link"]\ntranslate = true\n')
    assert excluded_sources() == {"video", "link"}
    monkeypatch.setenv("KB_EXCLUDE", "image, quote")
    assert excluded_sources() == {"video", "link", "image", "quote"}
