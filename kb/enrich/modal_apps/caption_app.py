"""Modal app: a caption and the OCR text of each photo, by a vision model
under vLLM on a GPU.

kb.enrich.vision runs it ephemeral (`with app.run():`), one run per
caption run, so no GPU waits between runs. Each call gets one batch of at
most `max_num_seqs` photo URLs: one call fills the vLLM engine exactly.

Rules, and why:
- The model loads in the first call of a container, not in `@modal.enter`.
  An exception in `@modal.enter` makes Modal start the container again and
  again (a crash loop) while the caller waits. Here a start-up error is kept
  and raised by every call, so the caller sees it on its first result.
- One container (max_containers=1): the model loads once per run.
- The weights stay in a Modal Volume: an ephemeral app would else download
  them again on every run.
- Each photo fails alone: a URL that is gone or not an image gives a
  result with a reason, and the other photos of the batch still get
  captions.
"""

from concurrent.futures import ThreadPoolExecutor

import modal

from kb.enrich.modal_apps import shared

APP_NAME = "kb-captions"
VLLM_VERSION = "0.33.0"
# The GPU type of the definition. Each run takes the GPU of its Captioner
# (KB_CAPTION_MODAL_GPU) as an argument: run_on_modal() calls
# Function.with_options(gpu=...), so a second value in one process counts.
GPU = "L40S"
MODEL_CACHE = "/root/.cache/huggingface"
MAX_IMAGE_BYTES = 20 * 1024 * 1024
FETCH_THREADS = 16
# The start of the message of every start-up error. The caller finds a
# start-up error by it, also after Modal sent the exception back.
STARTUP_FAILED = "The caption model did not start: "

# The CUDA development image, not debian_slim or a runtime image. Hard-won
# fact: an FP8 model under vLLM compiles DeepGEMM kernels at start, which
# needs nvcc and the CUDA headers; without them the engine stops at the
# DeepGEMM assert. The default (BF16) model starts on this image too.
BASE_IMAGE = "nvidia/cuda:12.8.1-devel-ubuntu22.04"
PACKAGES = (f"vllm=={VLLM_VERSION}", "httpx")

app = modal.App(APP_NAME)
image = modal.Image.from_registry(BASE_IMAGE, add_python="3.11").uv_pip_install(*PACKAGES)
model_cache = modal.Volume.from_name("kb-model-cache", create_if_missing=True)


class VllmEngine:
    """A vLLM engine that answers chat conversations, one answer each."""

    def __init__(self, model: str, max_num_seqs: int):
        from vllm import LLM

        self.llm = LLM(model=model, max_num_seqs=max_num_seqs, max_model_len=8192,
                       limit_mm_per_prompt={"image": 1})

    def answer(self, conversations: list[list[dict]], max_tokens: int) -> list[str]:
        from vllm import SamplingParams

        outputs = self.llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        return [output.outputs[0].text for output in outputs]


# One engine per container, or the error that stopped it from loading.
_engines: dict[tuple[str, int], object] = {}


class StartupFailure:
    def __init__(self, message: str):
        self.message = message


def engine_for(model: str, max_num_seqs: int, load=VllmEngine):
    """The loaded engine. A load that failed once is not tried again in this
    container: every call raises the same start-up error."""
    key = (model, max_num_seqs)
    if key not in _engines:
        try:
            _engines[key] = load(model, max_num_seqs)
        except Exception as exc:  # any load error: a missing package, no GPU, a wrong model name
            _engines[key] = StartupFailure(f"{model}: {type(exc).__name__}: {exc}")
    engine = _engines[key]
    if isinstance(engine, StartupFailure):
        raise RuntimeError(STARTUP_FAILED + engine.message)
    return engine


def caption_photos(engine, urls: list[str], *, max_tokens: int = 512) -> list[dict]:
    """One result per URL, in order: {"url", "caption", "ocr_text"} or
    {"url", "reason", "detail"}."""
    results: list[dict | None] = [None] * len(urls)

    def data_url(url: str) -> str | shared.FetchError:
        try:
            return shared.image_data_url(shared.fetch_media(url, max_bytes=MAX_IMAGE_BYTES), url)
        except shared.FetchError as exc:
            return exc

    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        fetched = list(pool.map(data_url, urls))
    conversations, slots = [], []
    for slot, (url, item) in enumerate(zip(urls, fetched)):
        if isinstance(item, shared.FetchError):
            results[slot] = {"url": url, "reason": item.reason, "detail": item.detail}
        else:
            conversations.append(shared.caption_messages(item))
            slots.append(slot)
    answers = engine.answer(conversations, max_tokens) if conversations else []
    if len(answers) != len(conversations):
        raise RuntimeError(f"the engine gave {len(answers)} answers for {len(conversations)} photos")
    for slot, answer in zip(slots, answers):
        url = urls[slot]
        try:
            caption, ocr_text = shared.parse_caption_answer(answer)
            results[slot] = {"url": url, "caption": caption, "ocr_text": ocr_text}
        except shared.CaptionAnswerError as exc:
            results[slot] = {"url": url, "reason": "bad_answer", "detail": str(exc)}
    return results


@app.function(image=image, gpu=GPU, volumes={MODEL_CACHE: model_cache}, timeout=30 * 60,
              scaledown_window=60, max_containers=1)
def caption_batch(urls: list[str], model: str, max_num_seqs: int, max_tokens: int = 512) -> list[dict]:
    """Caption one batch of photos (at most max_num_seqs)."""
    if len(urls) > max_num_seqs:
        raise ValueError(f"a batch has {len(urls)} photos; max_num_seqs is {max_num_seqs}")
    return caption_photos(engine_for(model, max_num_seqs), urls, max_tokens=max_tokens)
