"""The Modal apps build, and their function bodies run here.

The GPU part cannot run on this machine: vLLM is not installed and there is
no CUDA device. So the tests run what can run for real:
- the Modal App and Function objects are built (nothing goes to Modal);
- `caption_batch.local(...)` runs the real function body; with no vLLM its
  model load fails, which is the start-up error path, for real;
- the caption body with a small stand-in engine (it reads the image that it
  gets and answers like a vision model), on photos served on loopback;
- the transcription body with faster-whisper on the CPU (tiny.en), on a
  spoken MP4 served on loopback;
- run_on_modal with a stand-in for Modal's service (an app that starts and
  stops, a map that runs each input here), to test that the map is read to
  its end, that a start-up error is raised once, and the container check.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
from pathlib import Path

import modal
import pymupdf
import pytest

from kb.enrich.modal_apps import caption_app, shared, transcribe_app
from kb.enrich.modal_runner import ModalRunError, mapped_results, modal_ready, run_on_modal, wait_for_zero
from kb.enrich.transcriber import cpu_whisper, default_whisper_model
from kb.enrich.vision import Captioner, photo_batches
from tests.fake_media import MediaServer, png
from tests.speech_media import videos  # noqa: F401  (a fixture)

pytestmark = pytest.mark.filterwarnings("ignore:The .* function is executing locally:UserWarning")

RED = png(40, 20, (220, 20, 20))
needs_no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                   reason="vLLM is installed: its real load would start here")


class StandInEngine:
    """Answers like a vision model under vLLM: one answer per conversation,
    made from the image it got."""

    def __init__(self, answer: str | None = None):
        self.calls: list[int] = []
        self.answer_text = answer

    def answer(self, conversations, max_tokens):
        self.calls.append(len(conversations))
        answers = []
        for conversation in conversations:
            url = conversation[0]["content"][1]["image_url"]["url"]
            pixmap = pymupdf.Pixmap(base64.b64decode(url.partition(",")[2]))
            answers.append(self.answer_text or json.dumps(
                {"caption": f"A {pixmap.width}x{pixmap.height} picture.", "ocr_text": "OPEN 9-5"}))
        return answers


@pytest.fixture
def photos():
    with MediaServer({"/red.png": (RED, "image/png"), "/page.jpg": (b"<html></html>", "text/html")}) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_containers():
    """Each test is a new container: no model loaded, no start-up error kept."""
    caption_app._engines.clear()
    transcribe_app._models.clear()
    yield
    caption_app._engines.clear()
    transcribe_app._models.clear()


def test_the_apps_build():
    assert isinstance(caption_app.app, modal.App) and caption_app.app.name == "kb-captions"
    assert isinstance(caption_app.caption_batch, modal.Function)
    assert isinstance(transcribe_app.app, modal.App) and transcribe_app.app.name == "kb-transcripts"
    assert isinstance(transcribe_app.transcribe_video, modal.Function)
    # Modal keeps the definition in a private spec; the GPU and the weight cache are what cost money.
    spec = caption_app.caption_batch._spec_
    assert spec.gpus == caption_app.GPU and caption_app.MODEL_CACHE in spec.volumes
    assert transcribe_app.transcribe_video._spec_.gpus == transcribe_app.GPU


def _layers(image: modal.Image) -> tuple[list[str], list[str]]:
    """(Dockerfile commands, base image names) of an image definition, read
    from Modal's own objects: no build and no Modal network."""
    from modal._utils.async_utils import synchronizer

    commands, bases, todo = [], [], [synchronizer._translate_in(image)]
    while todo:
        layer = todo.pop()
        cells = dict(zip(layer._load.__code__.co_freevars, (c.cell_contents for c in layer._load.__closure__ or ())))
        if "dockerfile_function" in cells and cells["dockerfile_function"] is not None:
            commands += cells["dockerfile_function"]("2025.06").commands
        for base in (cells.get("base_images") or {}).values():
            bases.append(repr(base))
            todo.append(synchronizer._translate_in(base))
    return commands, bases


def test_the_images_carry_their_pins():
    import tomllib

    commands, bases = _layers(caption_app.image)
    # FP8 under vLLM needs the CUDA development image (nvcc for DeepGEMM).
    assert any(caption_app.BASE_IMAGE in base for base in bases) and "-devel-" in caption_app.BASE_IMAGE
    assert any(f"vllm=={caption_app.VLLM_VERSION}" in c for c in commands)

    commands, bases = _layers(transcribe_app.image)
    assert any(transcribe_app.BASE_IMAGE in base for base in bases)
    [install] = [c for c in commands if "pip install" in c]
    assert f"faster-whisper=={transcribe_app.FASTER_WHISPER_VERSION}" in install
    assert "'av<19'" in install or " av<19" in install
    # The same PyAV pin where kb itself installs faster-whisper.
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "av<19" in project["project"]["dependencies"]


@needs_no_vllm
def test_a_startup_error_surfaces_on_the_first_call(photos):
    with pytest.raises(RuntimeError) as first:
        caption_app.caption_batch.local([photos.url("/red.png")], model="org/vl-model", max_num_seqs=4)
    assert str(first.value).startswith(caption_app.STARTUP_FAILED)
    assert "vllm" in str(first.value) and "org/vl-model" in str(first.value)
    with pytest.raises(RuntimeError) as second:
        caption_app.caption_batch.local([photos.url("/red.png")], model="org/vl-model", max_num_seqs=4)
    assert str(second.value) == str(first.value)
    assert photos.hits["/red.png"] == 0  # no photo is fetched for a model that is not there


def test_a_failed_load_is_not_tried_again_in_the_container():
    loads = []

    def failing_load(model, max_num_seqs):
        loads.append(model)
        raise OSError("CUDA error: no device")

    for _ in range(3):
        with pytest.raises(RuntimeError, match="no device"):
            caption_app.engine_for("m", 8, load=failing_load)
    assert loads == ["m"]


def test_the_caption_body_with_a_stand_in_engine(photos):
    engine = StandInEngine()
    caption_app._engines[("org/vl-model", 4)] = engine  # the container already loaded its engine
    urls = [photos.url("/red.png"), photos.url("/gone.png"), photos.url("/page.jpg")]
    results = caption_app.caption_batch.local(urls, model="org/vl-model", max_num_seqs=4)
    assert [r["url"] for r in results] == urls
    assert results[0] == {"url": urls[0], "caption": "A 40x20 picture.", "ocr_text": "OPEN 9-5"}
    assert (results[1]["reason"], results[2]["reason"]) == ("http_404", "not_image")
    assert engine.calls == [1]  # one engine call for the batch, with the one good image

    with pytest.raises(ValueError, match="max_num_seqs is 2"):
        caption_app.caption_batch.local(urls, model="org/vl-model", max_num_seqs=2)
    caption_app._engines[("other", 4)] = StandInEngine(answer="A red picture, no JSON.")
    bad = caption_app.caption_batch.local(urls[:1], model="other", max_num_seqs=4)
    assert bad[0]["reason"] == "bad_answer"


def test_batches_are_max_num_seqs_photos():
    urls = [f"https://pbs.example/{n}.jpg" for n in range(150)]
    assert [len(b) for b in photo_batches(urls, 64)] == [64, 64, 22]
    assert sum(photo_batches(urls, 64), []) == urls


class StandInModal:
    """Stands in for Modal's service: the app runs while its `run()` block
    is open, and `map` runs each input here with Modal's
    return_exceptions contract. It records what happened, in order."""

    app_id = "ap-test"
    object_id = "fu-test"

    def __init__(self, function, containers_left: int = 0):
        self.function = function
        self.events: list[str] = []
        self.left = containers_left

    @contextlib.contextmanager
    def run(self):
        self.events.append("start")
        try:
            yield self
        finally:
            self.events.append("stop")

    def with_options(self, **options):
        self.events.append(f"options {sorted(options.items())}")
        return self

    def hydrate(self):
        return self

    def map(self, inputs, *, kwargs, return_exceptions, wrap_returned_exceptions):
        assert return_exceptions and wrap_returned_exceptions is False
        for item in inputs:
            try:
                yield self.function.local(item, **kwargs)
            except Exception as exc:
                yield exc
            self.events.append("output")
        self.events.append("map finished")

    def count_containers(self, function_id):
        self.events.append(f"count {function_id}")
        return self.left


def _run(modal_stand_in, batches, model="org/vl-model"):
    return list(run_on_modal(modal_stand_in, modal_stand_in, batches,
                             kwargs={"model": model, "max_num_seqs": 2, "max_tokens": 64},
                             startup_marker=caption_app.STARTUP_FAILED,
                             count_containers=modal_stand_in.count_containers))


def test_run_on_modal_reads_the_map_to_the_end_then_checks_containers(photos):
    caption_app._engines[("org/vl-model", 2)] = StandInEngine()
    stand_in = StandInModal(caption_app.caption_batch)
    batches = [[photos.url("/red.png")] * 2, [photos.url("/red.png"), photos.url("/page.jpg")], [photos.url("/red.png")]]
    results = _run(stand_in, batches)
    assert [batch for batch, _ in results] == batches
    assert [r.get("reason") for _, out in results for r in out] == [None, None, None, "not_image", None]
    assert stand_in.events == ["start", "output", "output", "output", "map finished", "stop", "count fu-test"]


@needs_no_vllm
def test_run_on_modal_raises_a_startup_error_once_after_the_whole_map(photos):
    stand_in = StandInModal(caption_app.caption_batch)
    batches = [[photos.url("/red.png")]] * 3
    with pytest.raises(ModalRunError, match="The caption model did not start") as info:
        _run(stand_in, batches)
    assert "Nothing was marked failed" in str(info.value)
    assert stand_in.events[-3:] == ["map finished", "stop", "count fu-test"]
    assert stand_in.events.count("output") == 3


def test_run_on_modal_reports_failed_calls_and_a_container_left(photos):
    caption_app._engines[("org/vl-model", 2)] = StandInEngine()
    stand_in = StandInModal(caption_app.caption_batch, containers_left=1)
    too_big = [photos.url("/red.png")] * 3  # more than max_num_seqs: that call fails
    with pytest.raises(ModalRunError, match=r"1 container\(s\) of Modal app ap-test still run.*modal app stop ap-test"):
        _run(stand_in, [[photos.url("/red.png")], too_big])

    stand_in = StandInModal(caption_app.caption_batch)
    outputs = iter([])
    with pytest.raises(ModalRunError, match="1 of 2 Modal calls failed. First: ValueError"):
        for batch, output in run_on_modal(stand_in, stand_in, [[photos.url("/red.png")], too_big],
                                          kwargs={"model": "org/vl-model", "max_num_seqs": 2},
                                          startup_marker=caption_app.STARTUP_FAILED,
                                          count_containers=stand_in.count_containers):
            outputs = iter([*outputs, output])
    assert len(list(outputs)) == 1  # the good batch came through before the error


def test_the_gpu_is_an_argument_of_each_run_not_of_the_import(photos, monkeypatch):
    """Two GPU types in one process: each run gets its own (issue 57). Before,
    the value went through os.environ into a decorator at import, and the
    second value was ignored."""
    from kb.enrich import modal_runner
    from kb.enrich.transcriber import Transcriber

    caption_app._engines[("org/vl-model", 1)] = StandInEngine()
    stand_in = StandInModal(caption_app.caption_batch)
    list(run_on_modal(stand_in, stand_in, [[photos.url("/red.png")]], options={"gpu": "H100"},
                      kwargs={"model": "org/vl-model", "max_num_seqs": 1}, startup_marker=caption_app.STARTUP_FAILED,
                      count_containers=stand_in.count_containers))
    assert stand_in.events[:2] == ["start", "options [('gpu', 'H100')]"]

    seen = []

    def run(app, function, inputs, *, options, **_):
        seen.append((app.name, options))
        return iter([])

    monkeypatch.setattr(modal_runner, "run_on_modal", run)
    for gpu in ("A100", "L40S"):
        list(Captioner(backend="modal", modal_gpu=gpu)._caption_on_modal(["https://pbs.example/1.jpg"]))
    for gpu, containers in (("T4", 2), ("H100", 0)):
        list(Transcriber(backend="modal", modal_gpu=gpu, modal_containers=containers)
             ._transcribe_on_modal(["https://video.example/1.mp4"]))
    assert seen == [("kb-captions", {"gpu": "A100"}), ("kb-captions", {"gpu": "L40S"}),
                    ("kb-transcripts", {"gpu": "T4", "max_containers": 2}),
                    ("kb-transcripts", {"gpu": "H100", "max_containers": 1})]
    # Modal's own objects take these options (no network: the variant loads when a run hydrates it).
    assert isinstance(transcribe_app.transcribe_video.with_options(gpu="T4", max_containers=2), modal.Function)
    assert "KB_CAPTION_MODAL_GPU" not in os.environ and "KB_TRANSCRIBE_MODAL_GPU" not in os.environ


def test_mapped_results_notices_missing_outputs():
    with pytest.raises(ModalRunError, match="Modal gave 1 results for 2 inputs"):
        list(mapped_results(iter([["ok"]]), ["a", "b"], startup_marker="x"))


def test_wait_for_zero_polls_until_the_containers_are_gone():
    counts = iter([2, 1, 0, 5])
    assert wait_for_zero(lambda: next(counts), wait_s=5, poll_s=0.01) == 0
    assert wait_for_zero(lambda: 3, wait_s=0.05, poll_s=0.01) == 3


@pytest.mark.slow
def test_the_transcription_body_runs_on_the_cpu(videos):  # noqa: F811
    speech = videos["speech"]
    with MediaServer({"/speech.mp4": (speech, "video/mp4"),
                      "/cut.mp4": (speech[:1000], "video/mp4", len(speech))}) as server:
        heard = transcribe_app.transcribe_url(cpu_whisper(default_whisper_model()), server.url("/speech.mp4"))
        cut = transcribe_app.transcribe_url(cpu_whisper(default_whisper_model()), server.url("/cut.mp4"))
    assert heard["language"] == "en" and heard["audio"] is True
    assert "quick brown fox" in " ".join(text for _, _, text in heard["segments"]).lower()
    assert cut["reason"] == "truncated" and "/cut.mp4" in cut["detail"]


def test_the_transcription_model_needs_a_gpu_and_says_so(videos):  # noqa: F811
    with MediaServer({"/speech.mp4": (videos["speech"], "video/mp4")}) as server:
        for _ in range(2):
            with pytest.raises(RuntimeError) as info:
                transcribe_app.transcribe_video.local(server.url("/speech.mp4"), model=default_whisper_model())
            assert str(info.value).startswith(transcribe_app.STARTUP_FAILED)
        assert server.hits["/speech.mp4"] == 0


def test_modal_backends_need_a_token(monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    if modal_ready()[0]:
        pytest.skip("this machine has a Modal token in ~/.modal.toml")
    reason = Captioner.from_settings(backend="modal").off_reason()
    assert reason and "modal token new" in reason


def test_image_checks_and_answer_parsing():
    assert shared.image_type(RED) == "image/png"
    with pytest.raises(shared.FetchError) as info:
        shared.image_data_url(b"%PDF-1.7", "https://x/a.pdf")
    assert info.value.reason == "not_image" and "https://x/a.pdf" in info.value.detail
    assert shared.parse_caption_answer('Sure! {"caption": " Two  cats. ", "ocr_text": ["A", "B"]}') == ("Two cats.", "A\nB")
    with pytest.raises(shared.CaptionAnswerError, match="no caption"):
        shared.parse_caption_answer('{"ocr_text": "x"}')
