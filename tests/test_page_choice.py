"""The per-page choice of extraction strategy (kb.enrich.page_choice) and
its place in extract_html(), on hand-made models and pages."""

from __future__ import annotations

import json

import lxml.html
import pytest

from kb.enrich import page_choice
from kb.enrich.extract import choice_inputs, extract_html, main_content
from kb.enrich.page_choice import choose, load_model
from kb.enrich.page_types import page_signals
from tests.test_extract import BODY, article_page, fragment


def model(**changes) -> dict:
    """A model with two inputs: "posts" wins when r_posts is high."""
    base = {"types": ["article", "listing"], "features": ["w_article", "r_posts"], "mean": [5.0, 0.0],
            "scale": [1.0, 0.5], "margin": 0.5,
            "alternatives": {"posts": {"coef": [0.0, 2.0], "intercept": -1.0},
                             "nolinks": {"coef": [0.1, 0.0], "intercept": -1.0}}}
    return base | changes


def test_the_alternative_with_the_highest_score_above_the_margin_replaces_the_type_strategy():
    # posts: -1 + 2 * (1.0 - 0) / 0.5 = 3 > margin 0.5; nolinks: -1 + 0.1 * 0 = -1.
    assert choose(model(), "article", "article", {"w_article": 5.0, "r_posts": 1.0}) == "posts"
    # posts: -1 + 2 * 0.25 / 0.5 = 0, below the margin: the type's strategy stays.
    assert choose(model(), "article", "article", {"w_article": 5.0, "r_posts": 0.25}) == "article"


def test_a_page_of_another_type_or_already_on_the_alternative_keeps_its_strategy():
    inputs = {"w_article": 5.0, "r_posts": 1.0}
    assert choose(model(), "product", "default", inputs) == "default"
    assert choose(model(), "listing", "posts", inputs) == "posts"  # nolinks scores -1: below the margin


def test_a_missing_input_is_an_error_that_names_it():
    with pytest.raises(ValueError, match="r_posts"):
        choose(model(), "article", "article", {"w_article": 5.0})


def test_a_model_file_that_does_not_match_its_feature_list_is_refused(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model(mean=[5.0])), encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}.*do not match"):
        load_model(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}: not a page-choice model"):
        load_model(path)


def test_the_shipped_model_reads_only_inputs_that_extraction_gives():
    """A model trained on another version of choice_features() fails here,
    not silently on real pages."""
    shipped = load_model()
    tree = lxml.html.document_fromstring(article_page())
    runs = {"default": fragment(BODY), "precision": fragment(BODY), "recall": "", "nolinks": fragment(BODY)}
    inputs = choice_inputs(tree, page_signals(tree, "https://news.example/bridge"), runs.__getitem__,
                           lambda weight: [])
    assert set(shipped["features"]) <= set(inputs)
    assert set(shipped["alternatives"]) <= {"nolinks", "items+merge+link_blocks", "posts", "default"}
    for name in shipped["alternatives"]:  # every alternative is a strategy that main_content knows
        main_content(runs.__getitem__, strategy=name, blocks=lambda weight: [])


def test_extract_html_takes_the_strategy_that_the_choice_gives(monkeypatch):
    """The article keeps its links under its type's strategy; a model that
    always takes "nolinks" for articles makes extract_html read it without."""
    always_nolinks = {"types": ["article"], "features": ["w_article"], "mean": [0.0], "scale": [1.0],
                      "margin": 0.0, "alternatives": {"nolinks": {"coef": [0.0], "intercept": 5.0}}}
    never = always_nolinks | {"types": []}
    monkeypatch.setattr(page_choice, "load_model", lambda: never)
    kept = extract_html(article_page(), "https://news.example/bridge")
    monkeypatch.setattr(page_choice, "load_model", lambda: always_nolinks)
    chosen = extract_html(article_page(), "https://news.example/bridge")
    assert kept.page_type == chosen.page_type == "article"
    assert "href" in kept.text_html and "href" not in chosen.text_html
    assert BODY[0] in chosen.text
