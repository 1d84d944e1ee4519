"""Modal app: the speech in a video, by faster-whisper large-v3-turbo on a GPU.

kb.enrich.transcriber runs it ephemeral (`with app.run():`), one run
per transcripts run. Each call gets one video URL: the container downloads
the MP4 itself (the byte count is checked against Content-Length) and
answers with the segments and the detected language.

As in caption_app.py: the model loads in the first call and not in
`@modal.enter`, so a start-up error reaches the caller instead of a crash
loop; the weights stay in a Modal Volume between runs.
"""

import tempfile

import modal

from kb.enrich.modal_apps import shared

APP_NAME = "kb-transcripts"
FASTER_WHISPER_VERSION = "1.2.1"
# The GPU type and container cap of the definition. Each run takes the
# values of its Transcriber (KB_TRANSCRIBE_MODAL_GPU and _CONTAINERS) as
# arguments: run_on_modal() calls Function.with_options().
GPU = "L4"
MAX_CONTAINERS = 4
MODEL_CACHE = "/root/.cache/huggingface"
MAX_VIDEO_BYTES = 512 * 1024 * 1024
STARTUP_FAILED = "The transcription model did not start: "

app = modal.App(APP_NAME)
# The CUDA runtime image: CTranslate2 (under faster-whisper) needs cuBLAS and cuDNN.
BASE_IMAGE = "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
# Hard-won fact: faster-whisper 1.2.1 fails to decode with PyAV 19 and
# later, and its own requirement lets them in. pyproject.toml pins it too.
PYAV_PIN = "av<19"
PACKAGES = (f"faster-whisper=={FASTER_WHISPER_VERSION}", PYAV_PIN, "httpx")
image = modal.Image.from_registry(BASE_IMAGE, add_python="3.11").uv_pip_install(*PACKAGES)
model_cache = modal.Volume.from_name("kb-model-cache", create_if_missing=True)


def load_whisper(model: str):
    from faster_whisper import WhisperModel

    return WhisperModel(model, device="cuda", compute_type="float16")


# One model per container, or the error that stopped it from loading.
_models: dict[str, object] = {}


class StartupFailure:
    def __init__(self, message: str):
        self.message = message


def model_for(model: str, load=load_whisper):
    """The loaded model. A load that failed once is not tried again in this
    container: every call raises the same start-up error."""
    if model not in _models:
        try:
            _models[model] = load(model)
        except Exception as exc:  # any load error: no GPU, a wrong model name, no CUDA library
            _models[model] = StartupFailure(f"{model}: {type(exc).__name__}: {exc}")
    loaded = _models[model]
    if isinstance(loaded, StartupFailure):
        raise RuntimeError(STARTUP_FAILED + loaded.message)
    return loaded


def transcribe_url(whisper, url: str) -> dict:
    """The transcription of the video at `url`, or {"url", "reason", "detail"}."""
    try:
        data = shared.fetch_media(url, max_bytes=MAX_VIDEO_BYTES, timeout_s=120.0)
    except shared.FetchError as exc:
        return {"url": url, "reason": exc.reason, "detail": exc.detail}
    with tempfile.NamedTemporaryFile(suffix=".mp4") as handle:
        handle.write(data)
        handle.flush()
        return {"url": url, **shared.transcription(whisper, handle.name)}


@app.function(image=image, gpu=GPU, volumes={MODEL_CACHE: model_cache}, timeout=30 * 60,
              scaledown_window=60, max_containers=MAX_CONTAINERS)
def transcribe_video(url: str, model: str) -> dict:
    return transcribe_url(model_for(model), url)
