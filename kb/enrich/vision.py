"""Captions: a vision model describes each photo and reads the text in it.

Backends (settings.kb_caption_backend):
- `openai`: any OpenAI-compatible vision endpoint (KB_CAPTION_BASE_URL,
  KB_CAPTION_MODEL, KB_CAPTION_API_KEY) through the `openai` client. A local
  server works too. The photo is downloaded here and sent as a data URL:
  a local server cannot always reach the photo's host, and every server
  reads a data URL.
- `modal`: the vision model under vLLM on a Modal GPU
  (modal_apps/caption_app.py), ephemeral, in batches of max_num_seqs.
- `off` (default): no captions.

The model answers JSON: {"caption": "...", "ocr_text": "..."}.

A photo that is gone, is not an image or gets an answer that is not the
JSON asked for fails alone, with a reason. An endpoint that does not answer
(a connection error, a 5xx, a bad key) stops the run instead: marking every
photo failed would hide them until `kb caption --retry`.
"""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kb.guards.fetch_guard import FetchGuard, FetchRefused
from kb.guards.tls import tls_context
from kb.enrich.modal_apps import shared
from pydantic import SecretStr

from kb.enrich.model_backend import ModelBackendClient
from kb.settings import Settings, get_settings, redact_secrets

BACKENDS = ("off", "openai", "modal")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Status codes with which an endpoint refuses one image (too large, a type it
# does not read) and not the whole run.
PHOTO_REJECTED = (400, 413, 415, 422)


@dataclass(frozen=True)
class CaptionResult:
    url: str
    caption: str | None = None
    ocr_text: str | None = None
    reason: str | None = None  # set on failure
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @classmethod
    def from_dict(cls, data: dict) -> "CaptionResult":
        return cls(data["url"], data.get("caption"), data.get("ocr_text"), data.get("reason"), data.get("detail"))


class CaptionBackendError(RuntimeError):
    """The caption backend does not answer. The photos wait for the next run."""


class Captioner(ModelBackendClient):
    """Captions and OCR text of photos."""

    BACKEND_SETTING = "kb_caption_backend"
    BACKENDS = BACKENDS

    base_url: str = ""
    api_key: SecretStr | None = None
    model: str = ""  # on the openai backend
    modal_model: str = ""
    modal_gpu: str = "L40S"
    max_num_seqs: int = 64
    workers: int = 4
    timeout_s: float = 120.0
    max_retries: int = 2  # the openai client's retries of a connection error or a 5xx
    max_tokens: int = 512

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> "Captioner":
        s = settings or get_settings()
        return cls(**{"backend": s.kb_caption_backend, "base_url": s.kb_caption_base_url, "api_key": s.kb_caption_api_key,
                      "model": s.kb_caption_model, "modal_model": s.kb_caption_modal_model,
                      "modal_gpu": s.kb_caption_modal_gpu, "max_num_seqs": s.kb_caption_max_num_seqs,
                      "workers": s.kb_caption_workers, **overrides})

    # --- configuration ------------------------------------------------------
    def _base_url(self) -> str:
        return self.base_url

    def model_name(self) -> str:
        if self.backend_name() == "modal":
            return self.modal_model
        return self.model

    def off_reason(self) -> str | None:
        """Why captions are off, or None when they are on."""
        if self.backend_name() == "openai" and not (self._base_url() and self.model_name()):
            return "the openai caption backend needs KB_CAPTION_BASE_URL and KB_CAPTION_MODEL"
        return super().off_reason()

    def ready_detail(self) -> str:
        where = self._base_url() if self.backend_name() == "openai" else "Modal"
        return f"{self.model_name()} at {where}"

    # --- work -----------------------------------------------------------------
    def caption(self, urls: list[str]) -> Iterator[CaptionResult]:
        """One result per photo URL that was worked on. Raises
        CaptionBackendError when the backend stops answering; the results
        before it were already given."""
        reason = self.off_reason()
        if reason:
            raise CaptionBackendError(f"captions are off: {reason}")
        if not urls:
            return
        if self.backend_name() == "modal":
            yield from self._caption_on_modal(urls)
        else:
            yield from self._caption_with_openai(urls)

    def openai_client(self):
        """The client of an OpenAI-compatible vision endpoint."""
        # openai is imported here, not at the top: every Dagster process
        # imports this module when it loads the graph (about 1 s each start).
        import openai

        key = self.api_key
        return openai.OpenAI(
            base_url=self._base_url(),
            # Local servers need no key, but the client needs a value.
            api_key=key.get_secret_value() if key and key.get_secret_value() else "no-key",
            timeout=self.timeout_s,
            max_retries=self.max_retries,
            http_client=openai.DefaultHttpxClient(verify=tls_context()),  # kb/guards/tls.py
        )

    def _caption_with_openai(self, urls: list[str]) -> Iterator[CaptionResult]:
        import openai  # for its errors; not at the top, as in openai_client()

        client = self.openai_client()
        model = self.model_name()
        # Photo addresses come from X's answers; the guard keeps them (and
        # their redirects) on public addresses all the same.
        guard = FetchGuard.from_settings()
        with guard.httpx_client(timeout=60.0, follow_redirects=True, headers={"User-Agent": shared.USER_AGENT}) as http:

            def one(url: str) -> CaptionResult:
                try:
                    guard.check_url(url)
                    data_url = shared.image_data_url(shared.fetch_media(url, max_bytes=MAX_IMAGE_BYTES, client=http), url)
                except shared.FetchError as exc:
                    return CaptionResult(url, reason=exc.reason, detail=exc.detail)
                except FetchRefused as exc:
                    return CaptionResult(url, reason=exc.reason, detail=str(exc))
                try:
                    response = client.chat.completions.create(
                        model=model, messages=shared.caption_messages(data_url),
                        temperature=0, max_tokens=self.max_tokens)
                except openai.APIStatusError as exc:
                    if exc.status_code in PHOTO_REJECTED:
                        return CaptionResult(url, reason=f"http_{exc.status_code}", detail=redact_secrets(str(exc))[:300])
                    # The endpoint's error text can quote the key: redact it before it reaches a log.
                    raise CaptionBackendError(
                        redact_secrets(f"the caption endpoint {self._base_url()} failed: {exc}")[:500]) from None
                except openai.APIError as exc:
                    raise CaptionBackendError(redact_secrets(
                        f"the caption endpoint {self._base_url()} does not answer: {type(exc).__name__}: {exc}")[:500]
                    ) from None
                content = response.choices[0].message.content if response.choices else None
                try:
                    caption, ocr_text = shared.parse_caption_answer(content)
                except shared.CaptionAnswerError as exc:
                    return CaptionResult(url, reason="bad_answer", detail=str(exc))
                return CaptionResult(url, caption, ocr_text)

            with ThreadPoolExecutor(max(1, self.workers)) as pool:
                yield from pool.map(one, urls)

    def _caption_on_modal(self, urls: list[str]) -> Iterator[CaptionResult]:
        from kb.enrich.modal_runner import ModalRunError, run_on_modal

        from kb.enrich.modal_apps import caption_app

        size = max(1, self.max_num_seqs)
        kwargs = {"model": self.model_name(), "max_num_seqs": size, "max_tokens": self.max_tokens}
        try:
            for _batch, results in run_on_modal(caption_app.app, caption_app.caption_batch, photo_batches(urls, size),
                                                kwargs=kwargs, startup_marker=caption_app.STARTUP_FAILED,
                                                options={"gpu": self.modal_gpu}):
                for result in results:
                    yield CaptionResult.from_dict(result)
        except ModalRunError as exc:
            raise CaptionBackendError(str(exc)) from None


def photo_batches(urls: list[str], size: int) -> list[list[str]]:
    """Batches of `size` photos: one Modal call fills the vLLM engine
    (max_num_seqs sequences at a time) and no more."""
    return [urls[start:start + size] for start in range(0, len(urls), size)]
