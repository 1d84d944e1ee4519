"""The extraction strategy of one page, chosen from the page's own numbers.

TYPE_STRATEGY (kb.enrich.extract) gives each page type one strategy. Inside
one type the best strategy changes from page to page: on the WCXB
development split, the best strategy per page gives 0.873 word F1, the best
strategy per annotated type only 0.831 (benchmarks/extraction.md). So for
the pages of some types (MODEL_FILE "types") a small model can replace the
type's strategy with one of a few others ("alternatives"):

- The inputs are page_types.page_features() (the page's signals and
  counts), the size of the page's series of repeated blocks, and the word
  counts of the texts that kb makes anyway for the article strategy
  (CHOICE_TEXTS): when the series has many more words than the article
  text, the items are likely the content.
- Each alternative has a logistic regression that scores "this alternative
  gives more of the main text than the type's strategy". The alternative
  with the highest score replaces the type's strategy when its score is
  above the model's margin.

benchmarks/train_page_choice.py fits the model on both development sets
(the news set in the objective, so that news pages do not lose) and checks
it by nested 5-fold cross-validation. kb ships only the plain numbers
(MODEL_FILE) and reads them here: no scikit-learn at run time.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

MODEL_FILE = Path(__file__).with_name("page_choice_model.json")
# The strategies (kb.enrich.extract.STRATEGIES) whose word counts are
# inputs. All four come from the two trafilatura runs and the series that
# the article strategy needs, so the inputs cost no extra run.
CHOICE_TEXTS = ("article", "default", "posts", "items+merge+link_blocks")


def choice_features(page: dict[str, float], words: dict[str, int], series: dict[str, int],
                    raw_words: dict[str, int]) -> dict[str, float]:
    """The model's inputs: page_features() of the page; the word counts of
    the CHOICE_TEXTS, each on a log scale relative to the article text; the
    number of blocks of the series ("posts" and "items"); and the words of
    trafilatura's own default and favor_precision output before kb's
    cleaning. Counts are on a log scale."""
    article = math.log1p(words["article"])
    features = dict(page)
    features["w_article"] = article
    features |= {f"r_{name}": math.log1p(words[name]) - article for name in CHOICE_TEXTS if name != "article"}
    features |= {f"series_{name}": math.log1p(count) for name, count in series.items()}
    features |= {f"raw_{mode}": math.log1p(count) for mode, count in raw_words.items()}
    return features


@cache
def load_model(path: Path = MODEL_FILE) -> dict:
    """The coefficients of the choice. Raises ValueError naming the file when
    the numbers do not match its feature list: a model from another version
    of choice_features() must not give silent wrong choices."""
    try:
        model = json.loads(path.read_text(encoding="utf-8"))
        size = len(model["features"])
        rows = [model["mean"], model["scale"], *(alt["coef"] for alt in model["alternatives"].values())]
        float(model["margin"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a page-choice model ({type(exc).__name__}: {exc})") from exc
    if any(len(row) != size for row in rows):
        raise ValueError(f"{path}: the coefficients do not match the feature list ({size} features)")
    if any(scale == 0 for scale in model["scale"]):
        raise ValueError(f"{path}: a feature has a scale of 0")
    return model


def choose(model: dict, kind: str, base: str, features: dict[str, float]) -> str:
    """The strategy of one page: `base` (the type's strategy), or the
    alternative with the highest score when the page's type is one of the
    model's types and that score is above the margin."""
    if kind not in model["types"]:
        return base
    missing = [name for name in model["features"] if name not in features]
    if missing:
        raise ValueError(f"the page-choice model needs inputs that choice_features() does not give: {missing}")
    values = [(features[name] - mean) / scale
              for name, mean, scale in zip(model["features"], model["mean"], model["scale"], strict=True)]
    scores = {name: alt["intercept"] + sum(w * v for w, v in zip(alt["coef"], values, strict=True))
              for name, alt in model["alternatives"].items() if name != base}
    if not scores:
        return base
    best = max(scores, key=scores.__getitem__)
    return best if scores[best] > model["margin"] else base
