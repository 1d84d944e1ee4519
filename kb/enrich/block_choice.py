"""Which blocks of a page are its main text: a learned model, block by block.

A choice of one extraction for the whole page (trafilatura's settings, the
series of posts or items) cannot be better than the best of those
extractions: on the WCXB development split that best gives 0.873 word F1.
A choice per block can reach 0.951 there (the blocks that the hand-made
main text holds). So kb cuts the page into blocks
(kb.enrich.page_blocks) and a model of boosted decision trees scores each
block: its words, links and tag, the names of its classes, where it
stands, and how much of it trafilatura's runs and kb's article rule kept.
A second model reads the same numbers of all blocks of the page in
order (a recurrent network, SEQUENCE): it sees the whole page, where a
tree sees one block. A block's score is the mean of both.
Which of the scored blocks make the text is a rule per page type
(SELECTION_RULES): the blocks at or above a threshold, or the blocks that
give the best expected F-score on this page.

benchmarks/train_block_choice.py trains the trees (LightGBM) on both
development sets and the network (PyTorch) beside them, and checks both by
5-fold cross-validation; kb ships only the plain numbers (MODEL_FILE) and
walks the trees and runs the network here with numpy: no LightGBM and no
PyTorch at run time.
"""

from __future__ import annotations

import html
import json
import re
from urllib.parse import urljoin, urlsplit
from functools import cache
from pathlib import Path

import lxml.html
import numpy as np

from kb.enrich.page_blocks import HEADINGS, Block, feature_names
from kb.enrich.page_types import PageType

MODEL_FILE = Path(__file__).with_name("block_choice_model.json")
_LEAF = -1  # the feature of a leaf in the flat arrays
# How the blocks of a page are chosen from their scores; the model file
# gives each page type one rule and its value.
# - "at_least": the blocks scored at or above the value.
# - "best_f1": the blocks that give the best expected F-score, with the
#   value as beta (below 1: precision counts more). The cut adapts to the
#   page: where the model is sure, it keeps less doubtful text. Under
#   nested 5-fold CV (3 December 2026) a rule per type from both gave news
#   0.9439 and WCXB 0.8554, against 0.9380 and 0.8532 with thresholds only;
#   "best_f1" for every type lost 0.023 on products.
SELECTION_RULES = ("at_least", "best_f1")


@cache
def load_model(path: Path = MODEL_FILE) -> dict:
    """The trees as flat numpy arrays, and the selection per page type.
    Raises ValueError naming the file when it is not such a model, or when
    its features are not those of page_blocks.feature_names(): a model of
    other features would keep the wrong blocks without a sign."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        features = raw["features"]
        selection = {str(kind): (str(rule), float(value)) for kind, (rule, value) in raw["selection"].items()}
        trees = raw["trees"]
        model = {
            "feature": np.array([tree["feature"] for tree in trees], dtype=np.int32),
            # float64, as LightGBM compares: a threshold rounded to float32
            # can fall on a feature's value and send it the other way.
            "threshold": np.array([tree["threshold"] for tree in trees], dtype=np.float64),
            "left": np.array([tree["left"] for tree in trees], dtype=np.int32),
            "right": np.array([tree["right"] for tree in trees], dtype=np.int32),
            "value": np.array([tree["value"] for tree in trees], dtype=np.float64),
            "depth": int(raw["depth"]),
            "selection": selection,
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a block-choice model ({type(exc).__name__}: {exc})") from exc
    missing = [str(kind) for kind in PageType if str(kind) not in selection]
    if missing:
        raise ValueError(f"{path}: no selection for the page types {', '.join(missing)}; train it again")
    unknown = sorted({rule for rule, _ in selection.values()} - set(SELECTION_RULES))
    if unknown:
        raise ValueError(f"{path}: unknown selection rules {', '.join(unknown)} (known: {', '.join(SELECTION_RULES)})")
    leaves = model["feature"] == _LEAF
    own = np.broadcast_to(np.arange(model["feature"].shape[-1], dtype=np.int32), leaves.shape)
    if not ((model["left"] == own) & (model["right"] == own))[leaves].all():
        # _walk() relies on it: a walk that reaches a leaf must stay there.
        raise ValueError(f"{path}: a leaf does not point to itself; train it again")
    if features != feature_names():
        raise ValueError(f"{path}: the model's features are not those of kb.enrich.page_blocks "
                         f"({len(features)} against {len(feature_names())}); train it again")
    try:
        model["sequence"] = _sequence_arrays(raw["sequence"])
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a block-choice model ({type(exc).__name__}: {exc})") from exc
    return model


# The network's arrays in the model file (benchmarks/train_block_choice.py
# writes PyTorch's names): the numbers are scaled, one layer (ReLU) makes
# each block's input, a bidirectional GRU reads them in page order, and two
# layers (ReLU, then one output) give the block's logit from its input and
# both GRU states.
SEQUENCE = ("mean", "scale", "input.weight", "input.bias", "gru.weight_ih_l0", "gru.weight_hh_l0",
            "gru.bias_ih_l0", "gru.bias_hh_l0", "gru.weight_ih_l0_reverse", "gru.weight_hh_l0_reverse",
            "gru.bias_ih_l0_reverse", "gru.bias_hh_l0_reverse", "head.weight", "head.bias", "output.weight",
            "output.bias")


# A number of block_features() whose scale in the model file is below this
# did not change on the training pages (type_service: kb.enrich.page_types
# gives no page that type now). The network learned nothing of it, so it
# gets 0; (value - mean) / 1e-6 would give it a million.
CONSTANT_SCALE = 1e-4


def _sequence_arrays(raw: dict) -> dict[str, np.ndarray]:
    """The network's arrays (float32), with their shapes checked against
    each other: a wrong shape would give numpy's error deep in a page, or
    wrong scores without an error where numpy broadcasts it. The
    block-diagonal matrix of both directions is made here, once."""
    arrays = {name: np.array(raw[name], dtype=np.float32) for name in SEQUENCE}
    features, width = len(feature_names()), arrays["input.weight"].shape[0]
    hidden, head = arrays["gru.weight_hh_l0"].shape[-1], arrays["head.weight"].shape[0]
    gru = {"gru.weight_ih_l0": (3 * hidden, width), "gru.weight_hh_l0": (3 * hidden, hidden),
           "gru.bias_ih_l0": (3 * hidden,), "gru.bias_hh_l0": (3 * hidden,)}
    expected = {"mean": (features,), "scale": (features,), "input.weight": (width, features), "input.bias": (width,),
                **gru, **{f"{name}_reverse": shape for name, shape in gru.items()},
                "head.weight": (head, width + 2 * hidden), "head.bias": (head,),
                "output.weight": (1, head), "output.bias": (1,)}
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            raise ValueError(f"the network's {name} has the shape {arrays[name].shape}, not {shape}")
        if not np.isfinite(arrays[name]).all():
            raise ValueError(f"the network's {name} holds a value that is not a finite number")
    arrays["scale"] = np.where(arrays["scale"] < CONSTANT_SCALE, np.inf, arrays["scale"]).astype(np.float32)
    # _gru_states() takes one product a step for both directions.
    arrays["recurrent"] = np.zeros((2 * hidden, 6 * hidden), dtype=np.float32)
    arrays["recurrent"][:hidden, :3 * hidden] = arrays["gru.weight_hh_l0"].T
    arrays["recurrent"][hidden:, 3 * hidden:] = arrays["gru.weight_hh_l0_reverse"].T
    arrays["recurrent.bias"] = np.concatenate([arrays["gru.bias_hh_l0"], arrays["gru.bias_hh_l0_reverse"]])
    return arrays


# Blocks scored at once. The walk holds a few numbers per block and tree;
# a page of a million tiny blocks must not take gigabytes.
ROWS_AT_ONCE = 2048


# The most blocks that the network reads. It takes about 20 microseconds a
# block, one block after the other, and holds about 3 kB a block; a hostile
# page of a million tiny blocks gets the trees' scores alone. The largest
# page of both development sets has 2,734 blocks.
SEQUENCE_MOST_BLOCKS = 20_000


def block_scores(model: dict, rows: np.ndarray) -> np.ndarray:
    """The probability that each block (the rows of block_features() of
    one page, in page order) is main text: the mean of the trees' score
    (ROWS_AT_ONCE blocks at a time) and the network's score. Under nested
    5-fold CV (4 December 2026) the mean gave WCXB 0.8624 and news 0.9469,
    against 0.8595 and 0.9457 for the trees alone (WCXB higher in 4 of 5
    folds)."""
    if not len(rows):
        return np.zeros(0)
    trees = np.concatenate([_walk(model, rows[start:start + ROWS_AT_ONCE])
                            for start in range(0, len(rows), ROWS_AT_ONCE)])
    if len(rows) > SEQUENCE_MOST_BLOCKS:
        return trees
    network = sequence_scores(model["sequence"], rows)
    # The GRU carries a number that is not finite to every block of the
    # page; block_features() gives none, but the page is hostile input.
    return mean_score(trees, network) if np.isfinite(network).all() else trees


def mean_score(trees: np.ndarray, network: np.ndarray) -> np.ndarray:
    """A block's score from the scores of both models (the training's
    cross-validation scores the same)."""
    return (trees + network) / 2


def sequence_scores(network: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The network's probability for each block of one page (SEQUENCE).
    Every product is np.einsum, not "@": "@" hands a product of this size
    to OpenBLAS's threads, which then wait in a busy loop. The process took
    twice the CPU time of the wall time, and trafilatura's runs in the same
    process took 46 ms CPU p50 in place of 23 (4 December 2026)."""
    inputs = np.maximum(_product(((rows - network["mean"]) / network["scale"]).astype(np.float32),
                                 network["input.weight"]) + network["input.bias"], 0)
    states = _gru_states(network, inputs)
    hidden = np.maximum(_product(np.concatenate([inputs, states], axis=1), network["head.weight"])
                        + network["head.bias"], 0)
    return _sigmoid((_product(hidden, network["output.weight"]) + network["output.bias"])[:, 0].astype(np.float64))


def _product(rows: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """rows @ weight.T (PyTorch's Linear) in numpy's own loop, one thread."""
    return np.einsum("bi,oi->bo", rows, weight)


def _gru_states(network: dict[str, np.ndarray], inputs: np.ndarray) -> np.ndarray:
    """The states of both directions of PyTorch's GRU for each block, as one
    (blocks, 2 * hidden) array. Both directions go in one loop: step i
    reads block i forwards and block n - 1 - i backwards, so Python steps
    once per block, not twice. Gates in PyTorch's order: reset, update, new."""
    count, hidden = len(inputs), network["gru.weight_hh_l0"].shape[-1]
    ahead = _product(inputs, network["gru.weight_ih_l0"]) + network["gru.bias_ih_l0"]
    back = _product(inputs, network["gru.weight_ih_l0_reverse"]) + network["gru.bias_ih_l0_reverse"]
    steps = np.stack([ahead, back[::-1]], axis=1).reshape(count, 2, 3, hidden)
    recurrent, recurrent_bias = network["recurrent"], network["recurrent.bias"]  # block-diagonal, both directions
    state = np.zeros((2, hidden), dtype=np.float32)
    states = np.empty((count, 2, hidden), dtype=np.float32)
    for index in range(count):
        from_state = (np.einsum("i,ij->j", state.ravel(), recurrent) + recurrent_bias).reshape(2, 3, hidden)
        step = steps[index]
        reset_update = _sigmoid(step[:, :2] + from_state[:, :2])
        new = np.tanh(step[:, 2] + reset_update[:, 0] * from_state[:, 2])
        state = new + reset_update[:, 1] * (state - new)
        states[index] = state
    return np.concatenate([states[:, 0], states[::-1, 1]], axis=1)


def _walk(model: dict, rows: np.ndarray) -> np.ndarray:
    """All trees are walked at once, one level per step, on flat arrays
    (node number + tree * width): np.take on flat arrays is several times
    faster than indexing 2-D arrays. A leaf points to itself (left = right),
    so a walk that reaches it stays there: no test for leaves is needed.
    int32 numbers (ROWS_AT_ONCE * features and trees * width stay far
    below 2**31) and no np.where: 22.1 s in place of 33.0 s for the 1,888
    pages of both development sets, with the same scores (4 December
    2026)."""
    trees, width = model["feature"].shape
    feature, threshold = model["feature"].ravel(), model["threshold"].ravel()
    right = model["right"].ravel()
    back = (model["left"] - model["right"]).ravel()  # from the right child to the left one
    flat_rows = np.ascontiguousarray(rows, dtype=np.float32).ravel()
    offsets = np.tile(np.arange(trees, dtype=np.int32) * np.int32(width), len(rows))
    row_starts = np.repeat(np.arange(len(rows), dtype=np.int32) * np.int32(rows.shape[1]), trees)
    node = offsets.copy()
    for _ in range(model["depth"]):
        value = np.take(flat_rows, row_starts + np.maximum(np.take(feature, node), 0))
        # "value <= threshold" goes left, as LightGBM's "<=" splits.
        node = offsets + np.take(right, node) + (value <= np.take(threshold, node)) * np.take(back, node)
    # No start score: LightGBM puts it into the leaves of the first tree.
    return _sigmoid(np.take(model["value"].ravel(), node).reshape(len(rows), trees).sum(axis=1))


def _sigmoid(values: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-values))


_LOG_WORDS = feature_names().index("log_words")
_LINK_SHARE = feature_names().index("link_share")


def block_words(rows: np.ndarray) -> np.ndarray:
    """The words of each block, from its row of block_features()."""
    return np.rint(np.expm1(rows[:, _LOG_WORDS].astype(np.float64)))


def main_text(model: dict, rows: np.ndarray, kind: str) -> np.ndarray:
    """Which blocks of a page (its rows of block_features()) are main text:
    the model's scores, cut by the selection of the page's type, without
    the far runs of doubtful blocks (without_far_runs()): on an article
    page all of them, on a forum page none, on the other pages the runs of
    link titles (link_titles())."""
    scores, words = block_scores(model, rows), block_words(rows)
    kept = kept_blocks(scores, words, model["selection"][kind])
    if kind == PageType.ARTICLE:
        return without_far_runs(kept, scores, words)
    if kind == PageType.FORUM:
        return kept
    return without_far_runs(kept, scores, words, link_titles(rows, words))


# The main text of an article is one run of blocks. After it, news sites
# put lists of other stories (teasers with a title and a lead, a gallery),
# which the model scores near its cut. A run of kept blocks that comes
# after the run of the most words, FAR_BLOCKS or more dropped blocks after
# the kept block before it, is dropped when its mean score is below
# FAR_RUN_SCORE. The values: the best of a grid (gap 5, 10, 15 or 40
# blocks; score 0.7, 0.8 or 0.9) on the news development set, of those
# that lowered no WCXB page type and not the snippet set (issue 58,
# benchmarks/extraction.md).
FAR_BLOCKS = 10
FAR_RUN_SCORE = 0.7
# On the other page types a far run can be the page's text, and a rule
# for it needs a sign of what the run is. A list of other pages is a run
# of link titles: the titles of other stories beside a story that kb calls
# a listing (buzzfeed-1: 25 titles in a sidebar, scored 0.43 to 0.58). A
# far run goes there only when its link titles (link_titles(): fewer than
# TITLE_WORDS words, at least half link text) hold FAR_RUN_TITLE_SHARE or
# more of its words. Measured (issue 58, benchmarks/extraction.md): any
# link text in place of titles lost a marketing page whose far run is a
# row of cards, each card one long link (service -0.0009); forum pages lost
# 0.0003 (the later posts of a thread, whose user names are links), so the
# rule does not act there; far runs before the main run (a menu) lowered
# WCXB's listing pages by 0.0014. News development set 0.9673 to 0.9699
# (precision 0.9700 to 0.9753), WCXB 0.90354 to 0.90370, the snippet set
# the same, no WCXB type lower.
TITLE_WORDS = 20
TITLE_LINK_SHARE = 0.5
FAR_RUN_TITLE_SHARE = 0.3


def link_titles(rows: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Which blocks (rows of block_features(), their words) are link
    titles: fewer than TITLE_WORDS words, at least TITLE_LINK_SHARE link
    text."""
    return (rows[:, _LINK_SHARE] >= TITLE_LINK_SHARE) & (words < TITLE_WORDS)


def without_far_runs(kept: np.ndarray, scores: np.ndarray, words: np.ndarray,
                     titles: np.ndarray | None = None) -> np.ndarray:
    """The mask `kept` without the far runs of doubtful blocks (above).
    With `titles` (link_titles()) a run goes only when it is a run of link
    titles (FAR_RUN_TITLE_SHARE)."""
    index = np.flatnonzero(kept)
    runs = np.split(index, np.flatnonzero(np.diff(index) > FAR_BLOCKS) + 1) if len(index) else []
    if len(runs) < 2:
        return kept
    main = int(np.argmax([words[run].sum() for run in runs]))
    result = kept.copy()
    for run in runs[main + 1:]:
        if scores[run].mean() >= FAR_RUN_SCORE:
            continue
        if titles is None or words[run][titles[run]].sum() >= FAR_RUN_TITLE_SHARE * words[run].sum():
            result[run] = False
    return result


# --- rules after the model ---------------------------------------------------------
# Kinds of block that the model keeps on news pages and that are never
# main text. Each rule raised the news development set
# (benchmarks/data/news_dev.jsonl.xz, word-shingle F1) and lowered neither
# WCXB (no page type) nor the snippet set (benchmarks/extraction.md, issue
# 58).
# A block whose text starts with an HTML tag is markup that the page shows
# as code or not at all: a tracking pixel in <noscript>, the code of an
# advertisement. Code samples in <pre> stay.
_MARKUP_START = re.compile(r"\s*<(?:div|img|a|span|iframe|script|noscript|ins|link|meta|style)\b", re.IGNORECASE)
# A list item of at most MENU_ITEM_WORDS words, nearly all link text
# (MENU_ITEM_LINK_SHARE), inside <nav> or <header>: an item of the site's
# menu ("News", "UK", "World"), not a list in the text.
MENU_ITEM_WORDS = 3
MENU_ITEM_LINK_SHARE = 0.9
# A figure caption of at most CAPTION_WORDS words is a photo credit or a
# label ("Dig a hole in the oasis. (Lucy Akins)", "Scatter plot"). Longer
# captions stay: the snippet set counts some of them as main text, and
# dropping every caption lowered it.
CAPTION_WORDS = 8


def is_boilerplate(block: Block) -> bool:
    """True for a block that the development sets do not count as main
    text (the rules above)."""
    if "pre" not in block.areas and _MARKUP_START.match(block.text):
        return True
    if block.element.tag == "figcaption" and len(block.text.split()) <= CAPTION_WORDS:
        return True
    return block.element.tag == "li" and bool(block.areas & {"nav", "header"}) and is_link_label(block)


def is_link_label(block: Block) -> bool:
    """A block of at most MENU_ITEM_WORDS words, nearly all link text
    (MENU_ITEM_LINK_SHARE): the label of a menu, a section or a crumb."""
    return (len(block.text.split()) <= MENU_ITEM_WORDS
            and block.link_chars >= MENU_ITEM_LINK_SHARE * max(1, len(block.text)))


def without_boilerplate(blocks: list[Block], kept: np.ndarray, kind: str | None = None) -> np.ndarray:
    """The mask `kept` without the blocks that is_boilerplate() names and
    the controls of a video player (in_player()), and on an article page
    (`kind`) without the blocks of a gallery (in_gallery()), the links
    above the story (labels_above()), the dek (is_dek()) and the boxes of
    related stories and newsletters (in_box())."""
    result = np.array([keep and not is_boilerplate(block) for block, keep in zip(blocks, kept)], dtype=bool)
    result &= ~in_player(blocks, result)
    if kind == PageType.ARTICLE:
        result &= ~unless_the_text(blocks, result, in_gallery(blocks, result))
        result &= ~labels_above(blocks, result)
        result &= ~np.array([keep and is_dek(block) for block, keep in zip(blocks, result)], dtype=bool)
        result &= ~unless_the_text(blocks, result, in_box(blocks, result))
    return result


# A part of an article page that a rule drops (a gallery, a box) can hold
# nearly all the kept text: then it is the page's text, not an insert. The
# rule needs LEAVES_WORDS kept words outside it (the words of a page that
# is not thin).
LEAVES_WORDS = 60


def unless_the_text(blocks: list[Block], kept: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """`inside` (a mask of kept blocks that a rule drops), or no block when
    the kept blocks outside it hold fewer than LEAVES_WORDS words."""
    outside = sum(len(block.text.split()) for block, keep, part in zip(blocks, kept, inside) if keep and not part)
    return inside if outside >= LEAVES_WORDS else np.zeros(len(blocks), dtype=bool)


# A news site puts a gallery of photos into the article: often other
# stories ("Business news in pictures", 50 photos with a title and a lead
# each), which the model scores as text (0.99). The site names the part:
# an element whose class or id holds one of these words, inside the
# page's <article>, on an article page. "carousel", "slider" and "swiper"
# are not here: marketing and product pages put their main text into
# carousels, and those names cut 0.01 of WCXB's listing and service pages.
# Outside <article>, product pages (Apple's) name their feature lists
# "gallery". A gallery that holds nearly all the kept text is the page's
# text (unless_the_text()). Issue 58, benchmarks/extraction.md.
_GALLERY_NAME = re.compile(r"gallery|slideshow", re.IGNORECASE)


def in_gallery(blocks: list[Block], kept: np.ndarray) -> np.ndarray:
    """Which of the kept blocks stand in an element named as a gallery
    (_GALLERY_NAME), up to <body>, and inside <article>."""
    return _in_named(blocks, kept, _GALLERY_NAME) & np.array(["article" in block.areas for block in blocks], dtype=bool)


# The controls of a video player inside the story: video.js (the "vjs-"
# names of its elements) writes its menus and its caption settings as
# text ("Chapters", "Subtitles", "descriptions off, selected",
# "Background", "Window", "Close"), and the model keeps them (0.67 to
# 0.83). They are never main text. News development set 0.96993 to
# 0.97006 (one page of 1,972 changes: bug-1255978); WCXB and the snippet
# set the same (issue 58, benchmarks/extraction.md). The walk up from the
# kept blocks costs 0.42 ms CPU p50, 1.35 ms p95 a page.
_PLAYER_NAME = re.compile(r"(?:^|\s)vjs-")


def in_player(blocks: list[Block], kept: np.ndarray) -> np.ndarray:
    """Which of the kept blocks stand in an element of a video player
    (_PLAYER_NAME), up to <body>."""
    return _in_named(blocks, kept, _PLAYER_NAME)


# The dek (in Britain the standfirst): the summary of a news story under
# its headline, and the lead of a teaser of another story. Sites name it
# with the trade's word ("article-dek", "p-dek", "styles_articleDek__Icz5H",
# "standfirst"); "dek" is not a part of a longer word ("Dekor"). The news
# development set does not count it as main text (Readability's text
# leaves it out), and neither do WCXB's texts on the pages where kb keeps
# one. On an article page a kept block goes when its own class or id holds
# the name. The development sets (issue 58, benchmarks/extraction.md): news
# 0.97006 to 0.97179 (6 pages of 5 sites change: 5 gain, citylab-1 loses
# a dek that Readability kept), WCXB 0.90370 to 0.90371 (4 article pages
# of 4 other sites gain, none loses), the snippet set the same. The names of the ancestors
# too (4 levels up) gave the same news figure and WCXB 0.90372, for three
# times the cost; on every page type, WCXB's collection and listing pages
# lost 0.004 and 0.003 (shops name their subtitles "...dek..."). The rule
# costs 0.24 ms CPU p50 a page (article pages).
_DEK_NAME = re.compile(r"dek(?![a-z])|standfirst", re.IGNORECASE)


def is_dek(block: Block) -> bool:
    """True when the block's own class or id names it a dek (_DEK_NAME)."""
    return bool(_DEK_NAME.search(_names(block.element)))


# Boxes of related stories and of a newsletter's sign-up inside the story:
# an element whose class names it "related", "newsletter", "signup",
# "sign-up" or "subscribe". On an article page its kept blocks go, unless
# the box holds nearly all the kept text (unless_the_text(): a page that
# wraps its main text in a "related-product" section or a newsletter's
# issue in "newsletter-email" keeps it). The class, not the id: ids are
# often made from a heading's words ("which-is-the-best-audiobook-
# subscription-service"). The development sets (issue 58,
# benchmarks/extraction.md): news 0.97179 to 0.97205 (one page: pixnet's
# bar of related posts), WCXB 0.90371 to 0.90375 (9 pages change, 8 gain;
# article, listing, product and service pages), the snippet set the same, no WCXB
# type lower. Without the guard of unless_the_text() two WCXB pages lost
# most of their text (listing 0.8184 to 0.8106); with ids too, an article
# page lost 0.12 (a box of related articles that its text holds); with
# "subscri" in place of "subscribe", the collection pages lost 0.00001. The
# rule's walk costs 0.50 ms CPU p50, 1.79 ms p95 a page (article pages).
_BOX_NAME = re.compile(r"related|newsletter|signup|sign-up|subscribe", re.IGNORECASE)


def in_box(blocks: list[Block], kept: np.ndarray) -> np.ndarray:
    """Which of the kept blocks stand in an element whose class names a box
    of related stories or of a newsletter (_BOX_NAME), up to <body>."""
    return _in_named(blocks, kept, _BOX_NAME, ids=False)


def _in_named(blocks: list[Block], kept: np.ndarray, name: re.Pattern, ids: bool = True) -> np.ndarray:
    """Which of the kept blocks stand in an element whose class (or id,
    when `ids`) `name` finds, up to <body>. Each element is judged once:
    the walk up stops at an element judged before."""
    inside: dict[lxml.html.HtmlElement, bool] = {}  # holds the elements, so that lxml keeps their proxies
    result = np.zeros(len(blocks), dtype=bool)
    for index, (block, keep) in enumerate(zip(blocks, kept)):
        if not keep:
            continue
        chain, element, found = [], block.element, False
        while element is not None and element.tag not in ("body", "html"):
            if element in inside:
                found = inside[element]
                break
            chain.append(element)
            element = element.getparent()
        for element in reversed(chain):
            found = found or bool(name.search(_names(element, ids)))
            inside[element] = found
        result[index] = found
    return result


def _names(element: lxml.html.HtmlElement, ids: bool = True) -> str:
    """The class names of an element, and its id when `ids`: what the rules
    that go by a site's names (_in_named(), is_dek()) read."""
    names = element.get("class") or ""
    return f"{names} {element.get('id') or ''}" if ids else names


# Above the story, news sites put the site's menu, its sections and a
# breadcrumb ("News", "Local", "Opinion", "Videos"), often outside <nav>
# and <header> (a div of class "navigation-module", a table of links): the
# menu-item rule of is_boilerplate() does not see them, and the model keeps
# them. On an article page, a kept link label (is_link_label()) before the
# first kept block of prose (PROSE_WORDS words or more, less than half link
# text) goes. Only above
# the story: below it the same blocks are the names of a grid's items on
# a shop's page that kb calls an article (WCXB's collection and listing
# pages lost 0.0017 and 0.0013 when the rule acted below the story too).
# Prices ("$ 2,099.99") and counts are the links of a grid, not of a menu:
# a label holds no digit. News development set 0.9661 to 0.9673 (precision
# 0.9676 to 0.9700), WCXB 0.9032 to 0.9035, the snippet set the same; no
# WCXB type lower to 4 decimals (issue 58, benchmarks/extraction.md).
PROSE_WORDS = 10
_DIGIT = re.compile(r"\d")


def labels_above(blocks: list[Block], kept: np.ndarray) -> np.ndarray:
    """Which of the kept blocks are link labels above the story (above)."""
    result = np.zeros(len(blocks), dtype=bool)
    for index, (block, keep) in enumerate(zip(blocks, kept)):
        if not keep:
            continue
        words = len(block.text.split())
        if words >= PROSE_WORDS and block.link_chars < 0.5 * len(block.text):
            return result  # the first block of prose: the story starts here
        if is_link_label(block) and not _DIGIT.search(block.text):
            result[index] = True
    return np.zeros(len(blocks), dtype=bool)  # no prose: no story to stand above


def kept_blocks(scores: np.ndarray, words: np.ndarray, selection: tuple[str, float]) -> np.ndarray:
    """Which blocks make the text (a mask), by one of SELECTION_RULES."""
    rule, value = selection
    if rule == "at_least":
        return scores >= value
    return _best_expected_f(scores, words, value)


def _best_expected_f(scores: np.ndarray, words: np.ndarray, beta: float) -> np.ndarray:
    """The blocks of the highest scores that give the best expected
    F-score: a score is the chance that the block is main text, so the
    expected words of main text are sum(score * words) on the page and in
    the kept blocks."""
    kept = np.zeros(len(scores), dtype=bool)
    if not len(scores):
        return kept
    order = np.argsort(-scores, kind="stable")
    true_words = np.cumsum((scores * words)[order])
    kept_words = np.cumsum(words[order])
    weight = beta * beta
    expected_f = (1 + weight) * true_words / np.maximum(weight * true_words[-1] + kept_words, 1e-9)
    kept[order[:int(np.argmax(expected_f)) + 1]] = True
    return kept


def kept_fragment(blocks: list[Block], kept: np.ndarray, url: str | None) -> str:
    """The kept blocks as an <article> fragment in reading order, or ""
    when no block is kept."""
    return fragment_of([block_html(block, url) for block, keep in zip(blocks, kept) if keep])


def fragment_of(parts: list[str]) -> str:
    """Kept blocks' HTML (block_html()) as one <article>, "" for none."""
    return f"<article>{''.join(parts)}</article>" if parts else ""


def block_html(block: Block, url: str | None) -> str:
    """One block as HTML: a heading stays a heading, code stays
    preformatted, a list item stays an item, the rest is a paragraph. Links
    keep their address, made absolute from the page's URL (LINK_SCHEMES)."""
    tag = block.element.tag
    if tag == "pre":
        return f"<pre>{html.escape(block.element.text_content().strip())}</pre>"
    inner = _inline_html(block, url)
    if tag in HEADINGS:
        return f"<{tag}>{inner}</{tag}>"
    if tag == "li":
        return f"<ul><li>{inner}</li></ul>"
    return f"<p>{inner}</p>"


# The schemes of a link that the fragment keeps. A page is hostile input:
# javascript:, data: and other schemes would reach the Telegram owner and
# the web page as live links. A link of another scheme keeps its words.
LINK_SCHEMES = frozenset({"http", "https"})


def _inline_html(block: Block, url: str | None) -> str:
    pieces = []
    for text, href in block.parts:
        words = html.escape(text)
        address = _web_address(href, url) if href else None
        pieces.append(f'<a href="{html.escape(address, quote=True)}">{words}</a>' if address else words)
    # The parts keep their own spaces (Block.text); runs of them become one.
    return " ".join("".join(pieces).split())


def _web_address(href: str, url: str | None) -> str | None:
    """The absolute address of a link when its scheme is in LINK_SCHEMES,
    else None. A malformed address is None too: urllib raises ValueError on
    some that real pages hold ("http://[ccpa-preferences]")."""
    try:
        address = urljoin(url or "", href.strip())
        return address if urlsplit(address).scheme in LINK_SCHEMES else None
    except ValueError:
        return None
