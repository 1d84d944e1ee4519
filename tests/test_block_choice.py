"""The blocks of a page (kb.enrich.page_blocks) and the learned choice of
the blocks that are main text (kb.enrich.block_choice), on HTML made here."""

from __future__ import annotations

import json

import lxml.html
import numpy as np
import pytest
import train_block_choice  # benchmarks/ (pyproject's pythonpath): the training's own network and export

from kb.enrich import block_choice
from kb.enrich.page_blocks import block_features, feature_names, page_blocks
from kb.enrich.page_types import PageType


def blocks_of(html: str):
    return page_blocks(lxml.html.document_fromstring(html))


def test_a_block_holds_its_inline_words_and_not_the_blocks_inside_it():
    html = ("<html><body><div>Intro <b>bold</b> word<i>s</i><p>A paragraph with <a href='/x'>a link</a>.</p>"
            "after the paragraph<br>and a line</div><script>var hidden = 1;</script><style>p {}</style></body></html>")
    blocks = blocks_of(html)
    assert [b.text for b in blocks] == ["Intro bold words after the paragraph and a line", "A paragraph with a link."]
    paragraph = blocks[1]
    assert paragraph.element.tag == "p" and paragraph.link_chars == len("a link")
    assert ("a link", "/x") in paragraph.parts
    assert all("hidden" not in b.text for b in blocks)


def test_a_space_between_inline_elements_divides_words():
    blocks = blocks_of("<html><body><nav><a href='/'>Home</a> <a href='/news'>News</a>\n<a href='/a'>About</a></nav>"
                       "<p><b>New</b> <i>York</i> is large.</p></body></html>")
    assert [b.text for b in blocks] == ["Home News About", "New York is large."]
    fragment = block_choice.kept_fragment(blocks, np.array([True, True]), "https://site.example/")
    assert '<a href="https://site.example/">Home</a> <a href="https://site.example/news">News</a> <a' in fragment
    assert "<p>New York is large.</p>" in fragment


def test_the_text_for_readers_without_script_is_a_block():
    """Discourse puts the whole thread in <noscript>: it must not be skipped."""
    blocks = blocks_of("<html><body><noscript><p>The first post of the thread.</p></noscript></body></html>")
    assert [b.text for b in blocks] == ["The first post of the thread."]


def test_a_deeply_nested_page_is_read():
    """libxml2 keeps at most 255 levels; the walk must read all of them."""
    html = "<html><body>" + "<div>" * 250 + "deep words" + "</div>" * 250 + "</body></html>"
    assert [b.text for b in blocks_of(html)] == ["deep words"]


def test_the_features_measure_what_trafilatura_kept():
    html = ("<html><head><title>Stone bridges</title></head><body><nav><a href='/'>Home</a></nav>"
            "<p>The river town kept its old stone bridge for four hundred years.</p></body></html>")
    tree = lxml.html.document_fromstring(html)
    blocks = page_blocks(tree)
    kept = {"default": "The river town kept its old stone bridge for four hundred years.", "precision": "",
            "article": ""}
    rows = block_features(tree, blocks, kept, "forum")
    with pytest.raises(KeyError):  # a text that the caller forgot is not an empty text
        block_features(tree, blocks, {"default": kept["default"]}, "forum")
    column = {name: index for index, name in enumerate(feature_names())}
    assert rows.shape == (2, len(feature_names()))
    assert rows[0, column["in_nav"]] == 1 and rows[0, column["link_share"]] == 1
    assert rows[1, column["kept_default"]] == 1 and rows[0, column["kept_default"]] == 0
    assert rows[1, column["kept_precision"]] == 0
    assert (rows[:, column["type_forum"]] == 1).all() and (rows[:, column["type_article"]] == 0).all()


def test_a_copy_of_an_earlier_block_is_marked():
    """A quoted post repeats the post: only the copy gets earlier_copy."""
    post = "The first post asks how the old bridge was built."
    html = (f"<html><body><div class='post'>{post}</div><p>A reply says lime mortar.</p>"
            f"<blockquote>{post}</blockquote><p>Share</p><p>Share</p></body></html>")
    tree = lxml.html.document_fromstring(html)
    blocks = page_blocks(tree)
    rows = block_features(tree, blocks, {"default": "", "precision": "", "article": ""}, "forum")
    assert [b.text for b in blocks] == [post, "A reply says lime mortar.", post, "Share", "Share"]
    assert rows[:, feature_names().index("earlier_copy")].tolist() == [0, 0, 1, 0, 1]
    assert rows[:, feature_names().index("log_same_text")].tolist() == pytest.approx([np.log1p(1), 0, np.log1p(1),
                                                                                        np.log1p(1), np.log1p(1)])


def test_a_copy_is_main_text_only_as_often_as_the_hand_made_text_holds_it():
    """Word F1 counts each word as often as it stands: the training labels a
    copy by how often the hand-made text holds it."""
    texts = ["Lime mortar, and stones.", "A menu line", "Lime mortar and stones", "Lime mortar, and stones.",
             "Lime mortar, and stones."]
    labels = np.array([1, 0, 1, 1, 1], dtype=np.int8)
    once = "How it was built. Lime mortar and stones. The end."
    assert train_block_choice.label_copies(texts, labels, once).tolist() == [1, 0, 1, 0, 0]
    twice = once + " Lime mortar and stones!"
    assert train_block_choice.label_copies(texts, labels, twice).tolist() == [1, 0, 1, 1, 0]
    # Twice in a row in the hand-made text is twice, not once.
    in_a_row = "How it was built. Lime mortar and stones. Lime mortar and stones. The end."
    assert train_block_choice.label_copies(texts, labels, in_a_row).tolist() == [1, 0, 1, 1, 0]
    # The news set scores snippets, which one copy holds: a copy labelled
    # main text has no label; a copy labelled boilerplate stays so.
    assert train_block_choice.label_copies(texts, labels, None).tolist() == [1, 0, 1, -1, -1]
    menus = train_block_choice.label_copies(["A menu line", "A menu line"], np.array([0, 0], dtype=np.int8), None)
    assert menus.tolist() == [0, 0]
    assert labels.tolist() == [1, 0, 1, 1, 1]  # the caller's labels stay as they were


def test_each_page_weighs_the_same_in_the_fit_shared_by_the_words_of_its_labelled_blocks():
    """The sets score each page, so a long page must not count more: its
    labelled blocks share one weight (a news page NEWS_WEIGHT) by words."""
    rows = np.zeros((3, len(feature_names())), dtype=np.float32)
    rows[:, feature_names().index("log_words")] = np.log1p([3, 5, 1])
    labels = np.array([1, -1, 0], dtype=np.int8)
    wcxb = train_block_choice.block_weights({"X": rows, "y": labels, "set": "wcxb"})
    assert wcxb.tolist() == pytest.approx([0.75, 0.0, 0.25])
    news = train_block_choice.block_weights({"X": rows, "y": labels, "set": "news"})
    assert news.tolist() == pytest.approx([0.75 * train_block_choice.NEWS_WEIGHT, 0.0,
                                           0.25 * train_block_choice.NEWS_WEIGHT])
    unlabelled = train_block_choice.block_weights({"X": rows, "y": np.full(3, -1, dtype=np.int8), "set": "wcxb"})
    assert unlabelled.tolist() == [0.0, 0.0, 0.0]


def test_the_posts_of_a_thread_share_what_was_kept_of_their_group():
    """trafilatura kept the first post only: its replies in the same markup
    get the kept share of their group, the menu link does not."""
    posts = ["The first post asks how the old bridge was built.", "A reply says the builders used lime mortar.",
             "A second reply names the quarry of the stones."]
    html = ("<html><body><div class='menu'><a href='/'>Home</a></div>"
            + "".join(f"<article class='post'><div class='body'>{text}</div></article>" for text in posts)
            + "<p class='body'>A footer line in other markup.</p></body></html>")
    tree = lxml.html.document_fromstring(html)
    blocks = page_blocks(tree)
    rows = block_features(tree, blocks, {"default": posts[0], "precision": "", "article": ""}, "forum")
    column = {name: index for index, name in enumerate(feature_names())}
    assert [rows[i, column["kept_default"]] for i in (1, 2, 3)] == [1, 0, 0]
    for grouping in ("name", "parent", "path"):
        replies = rows[2:4, column[f"{grouping}_kept_default"]]
        assert (replies > 0.3).all() and (replies < 0.4).all(), grouping  # 1 of 3 posts of about equal words
        assert rows[0, column[f"{grouping}_kept_default"]] == 0
        assert rows[0, column[f"{grouping}_link_share"]] == 1
    # <p class="body"> is not a post: another tag, so another group.
    assert rows[4, column["name_kept_default"]] == 0
    assert rows[1, column["log_same_parent"]] == pytest.approx(np.log1p(3))
    words = [len(text.split()) for text in posts]
    assert rows[1, column["path_words"]] == pytest.approx(sum(words) / (sum(words) + 1 + 6))


# A small network of the training's form (benchmarks/train_block_choice.py).
SMALL = {"width": 8, "hidden": 5, "head": 4, "epochs": 3, "learning_rate": 1e-2, "weight_decay": 0.0,
         "pages_a_step": 2, "seed": 1}


def made_network(seed: int = 1, silent: bool = False, mean=0.0, scale=1.0):
    """The training's network, small, with PyTorch's own start values.
    silent: the output is 0 for every block (probability 0.5). mean and
    scale: one number for every feature or one per feature."""
    import torch
    torch.manual_seed(seed)
    count = len(feature_names())
    network = train_block_choice._network(np.broadcast_to(mean, count).astype(np.float32).copy(),
                                          np.broadcast_to(scale, count).astype(np.float32).copy(), SMALL)
    if silent:
        with torch.no_grad():
            network.output.weight.zero_()
            network.output.bias.zero_()
    return network.eval()


def training_scores(network, rows: np.ndarray) -> np.ndarray:
    """The training's (PyTorch's) probability for each block of one page."""
    page = {"X": rows, "y": np.zeros(len(rows), dtype=np.int8), "texts": ["words"] * len(rows), "set": "wcxb"}
    return train_block_choice.predict_sequence(network, {"page": page}, ["page"])["page"]


# The trees of tiny_model() on a row of zeros.
TREES_ON_ZEROS = 1 / (1 + np.exp(-(-3.0 + 0.5)))


def tiny_model(tmp_path, network=None) -> dict:
    """Two trees on the feature "kept_default": the first splits at 0.5,
    the second is one leaf. Score = sigmoid(leaf + 0.5). Without a network
    given, the network says 0.5 for every block, so a block's score is
    (that + 0.5) / 2."""
    feature = feature_names().index("kept_default")
    raw = {
        "sequence": train_block_choice.export_sequence(network or made_network(silent=True)),
        "features": feature_names(), "depth": 1,
        "selection": {str(kind): ["at_least", 0.5] for kind in PageType},
        "trees": [
            {"feature": [feature, -1, -1], "threshold": [0.5, 0, 0], "left": [1, 1, 2], "right": [2, 1, 2],
             "value": [0, -3.0, 2.0]},
            {"feature": [-1, -1, -1], "threshold": [0, 0, 0], "left": [0, 1, 2], "right": [0, 1, 2],
             "value": [0.5, 0, 0]},
        ],
    }
    path = tmp_path / "model.json"
    path.write_text(json.dumps(raw))
    return block_choice.load_model(path)


def test_the_trees_are_walked_as_lightgbm_scores_them(tmp_path):
    model = tiny_model(tmp_path)
    rows = np.zeros((3, len(feature_names())), dtype=np.float32)
    rows[:, feature_names().index("kept_default")] = [0.0, 0.5, 0.9]
    expected = (1 / (1 + np.exp(-np.array([-3.0 + 0.5, -3.0 + 0.5, 2.0 + 0.5]))) + 0.5) / 2
    assert np.allclose(block_choice.block_scores(model, rows), expected)
    assert block_choice.block_scores(model, rows[:0]).shape == (0,)
    # A page of more blocks than are scored at once gets the same scores.
    many = np.repeat(rows, block_choice.ROWS_AT_ONCE, axis=0)
    assert np.allclose(block_choice.block_scores(model, many), np.repeat(expected, block_choice.ROWS_AT_ONCE))


def test_the_network_gives_pytorchs_scores_for_the_blocks_in_page_order():
    """numpy's run of the written network against PyTorch's, on rows that
    are scaled first (each feature by its own mean and scale)."""
    count = len(feature_names())
    network = made_network(seed=7, mean=np.linspace(-1, 1, count), scale=np.linspace(0.5, 3, count))
    arrays = block_choice._sequence_arrays(train_block_choice.export_sequence(network))
    rows = np.random.default_rng(3).random((40, count)).astype(np.float32)
    scores = block_choice.sequence_scores(arrays, rows)
    assert np.abs(scores - training_scores(network, rows)).max() < 1e-5
    # A block's score depends on the blocks around it: the same blocks in
    # the other order get other scores (a model of one block would not).
    backwards = block_choice.sequence_scores(arrays, rows[::-1])[::-1]
    assert np.abs(backwards - scores).max() > 1e-3


def test_the_trained_and_written_network_gives_the_trainings_scores(monkeypatch):
    """The training's whole path on made-up pages: fit, write, and kb's
    numpy run of the written file against the training's own scores."""
    monkeypatch.setattr(train_block_choice, "SEQUENCE_SETTINGS", SMALL)
    generator = np.random.default_rng(11)
    count = len(feature_names())
    table = {}
    for page, blocks in enumerate((3, 9, 14, 6, 1)):
        rows = generator.random((blocks, count)).astype(np.float32)
        labels = (rows[:, 0] > 0.5).astype(np.int8)
        labels[0] = -1  # a block without a label is read, not learned
        table[f"page{page}"] = {"X": rows, "y": labels, "texts": ["words"] * blocks, "set": "wcxb"}
    table["empty"] = {"X": np.zeros((0, count), dtype=np.float32), "y": np.zeros(0, dtype=np.int8), "texts": [],
                      "set": "wcxb"}
    network = train_block_choice.fit_sequence(table, list(table))
    expected = train_block_choice.predict_sequence(network, table, list(table))
    assert set(expected) == {f"page{page}" for page in range(5)}
    arrays = block_choice._sequence_arrays(json.loads(json.dumps(train_block_choice.export_sequence(network))))
    for key, scores in expected.items():
        assert np.abs(block_choice.sequence_scores(arrays, table[key]["X"]) - scores).max() < 1e-5, key


def test_a_page_of_too_many_blocks_gets_the_scores_of_the_trees_alone(tmp_path, monkeypatch):
    """A hostile page of a million tiny blocks must not hold the network's
    loop (one step a block) for minutes."""
    model = tiny_model(tmp_path, made_network(seed=2))
    rows = np.zeros((6, len(feature_names())), dtype=np.float32)
    assert not np.allclose(block_choice.block_scores(model, rows), TREES_ON_ZEROS)
    monkeypatch.setattr(block_choice, "SEQUENCE_MOST_BLOCKS", 5)
    assert np.allclose(block_choice.block_scores(model, rows), TREES_ON_ZEROS)


def test_a_feature_that_never_changed_in_training_gives_the_network_nothing():
    """type_service is 0 on every training page: its scale in the file is
    1e-6. A page of that type must not give the network a million."""
    count = len(feature_names())
    scale = np.ones(count)
    scale[0] = 1e-6
    arrays = block_choice._sequence_arrays(train_block_choice.export_sequence(made_network(seed=4, scale=scale)))
    rows = np.random.default_rng(5).random((5, count)).astype(np.float32)
    changed = rows.copy()
    changed[:, 0] = 1.0
    assert np.allclose(block_choice.sequence_scores(arrays, rows), block_choice.sequence_scores(arrays, changed))
    other = rows.copy()
    other[:, 1] = 1.0  # a feature of a normal scale still counts
    assert not np.allclose(block_choice.sequence_scores(arrays, rows), block_choice.sequence_scores(arrays, other))


def test_a_number_that_is_not_finite_leaves_the_page_to_the_trees(tmp_path):
    """The GRU would carry one NaN to every block of the page."""
    model = tiny_model(tmp_path, made_network(seed=2))
    rows = np.zeros((4, len(feature_names())), dtype=np.float32)
    rows[2, 0] = np.nan
    assert np.allclose(block_choice.block_scores(model, rows), TREES_ON_ZEROS)


def test_a_model_of_other_features_is_refused_with_the_file_named(tmp_path):
    path = tmp_path / "old.json"
    every_type = {str(kind): ["at_least", 0.5] for kind in PageType}
    path.write_text(json.dumps({"features": ["log_words"], "depth": 1, "selection": every_type, "trees": []}))
    with pytest.raises(ValueError, match="old.json.*features"):
        block_choice.load_model(path)
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "selection": {"article": ["at_least", 0.5]},
                                "trees": []}))
    with pytest.raises(ValueError, match="old.json: no selection for the page types forum"):
        block_choice.load_model.__wrapped__(path)
    # The model before selections had one threshold per type.
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "thresholds": {"article": 0.5},
                                "trees": []}))
    with pytest.raises(ValueError, match="old.json: not a block-choice model .*selection"):
        block_choice.load_model.__wrapped__(path)
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "trees": [],
                                "selection": every_type | {"forum": ["most_words", 1]}}))
    with pytest.raises(ValueError, match="old.json: unknown selection rules most_words"):
        block_choice.load_model.__wrapped__(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="old.json: not a block-choice model"):
        block_choice.load_model.__wrapped__(path)
    # A network of other shapes: numpy would fail deep in the first page.
    sequence = train_block_choice.export_sequence(made_network(silent=True))
    wrong = sequence | {"gru.bias_hh_l0_reverse": [0.0] * 7}
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "selection": every_type, "trees": [],
                                "sequence": wrong}))
    with pytest.raises(ValueError, match=r"old.json: not a block-choice model .*gru.bias_hh_l0_reverse has the shape \(7,\)"):
        block_choice.load_model.__wrapped__(path)
    # A bias of (8, 1) in place of (8,): numpy broadcasts it without an error.
    wrong = sequence | {"input.bias": [[value] for value in sequence["input.bias"]]}
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "selection": every_type, "trees": [],
                                "sequence": wrong}))
    with pytest.raises(ValueError, match=r"old.json: .*input.bias has the shape \(8, 1\), not \(8,\)"):
        block_choice.load_model.__wrapped__(path)
    wrong = sequence | {"head.bias": [float("nan")] * 4}
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "selection": every_type, "trees": [],
                                "sequence": wrong}))
    with pytest.raises(ValueError, match="old.json: .*head.bias holds a value that is not a finite number"):
        block_choice.load_model.__wrapped__(path)
    path.write_text(json.dumps({"features": feature_names(), "depth": 1, "selection": every_type, "trees": []}))
    with pytest.raises(ValueError, match="old.json: not a block-choice model .*sequence"):
        block_choice.load_model.__wrapped__(path)
    # The walk stays on a leaf because a leaf points to itself: a leaf that
    # points elsewhere would send the walk on with a leaf's feature.
    path.write_text(json.dumps({"features": feature_names(), "depth": 2, "selection": every_type, "sequence": sequence, "trees": [
        {"feature": [0, -1, -1], "threshold": [0.5, 0, 0], "left": [1, 1, 2], "right": [2, 0, 2], "value": [0, 1, -1]}]}))
    with pytest.raises(ValueError, match="old.json: a leaf does not point to itself"):
        block_choice.load_model.__wrapped__(path)


def test_the_shipped_model_loads():
    model = block_choice.load_model()
    assert model["feature"].shape == model["threshold"].shape and model["depth"] > 0
    assert set(model["selection"]) == set(map(str, PageType))
    assert {rule for rule, _ in model["selection"].values()} <= set(block_choice.SELECTION_RULES)


def test_a_threshold_keeps_the_blocks_at_or_above_it():
    scores, words = np.array([0.9, 0.5, 0.49]), np.array([10.0, 10.0, 10.0])
    assert block_choice.kept_blocks(scores, words, ("at_least", 0.5)).tolist() == [True, True, False]


def test_the_best_expected_f_score_keeps_the_blocks_that_pay_on_this_page():
    """Scores 0.9, 0.6 and 0.1 on blocks of 100 words: 160 expected words
    of main text. Beta 1: the first two blocks give 2*150/(160+200) = 0.83,
    above one block (0.69) and all three (0.70). Beta 0.5 (precision counts
    more): the first block alone gives 0.80, two give 0.78."""
    scores, words = np.array([0.1, 0.9, 0.6]), np.array([100.0, 100.0, 100.0])
    assert block_choice.kept_blocks(scores, words, ("best_f1", 1.0)).tolist() == [False, True, True]
    assert block_choice.kept_blocks(scores, words, ("best_f1", 0.5)).tolist() == [False, True, False]
    # A long block of a middling score counts by its words.
    assert block_choice.kept_blocks(np.array([0.9, 0.6]), np.array([10.0, 1000.0]), ("best_f1", 1.0)).all()
    assert block_choice.kept_blocks(np.zeros(0), np.zeros(0), ("best_f1", 1.0)).shape == (0,)


def test_the_words_of_a_block_come_back_from_its_row():
    html = "<html><body><p>one two three</p><p>" + "word " * 1234 + "</p></body></html>"
    tree = lxml.html.document_fromstring(html)
    blocks = page_blocks(tree)
    rows = block_features(tree, blocks, dict.fromkeys(("default", "precision", "article"), ""), "article")
    assert block_choice.block_words(rows).tolist() == [3, 1234]


def test_the_fragment_keeps_only_web_links_and_escapes_the_page_text():
    """A hostile page: a javascript: link, a data: link, an address that
    urllib cannot parse, and text that looks like markup. Only http and
    https addresses stay links; the words stay."""
    html = ("<html><body><h2>Title</h2>"
            "<p>Read <a href='javascript:alert(1)'>this</a> and <a href='data:text/html,x'>that</a> "
            "and <a href='/next'>the next page</a> and <a href='http://[not-a-host]/x'>a broken one</a>. "
            "&lt;script&gt;alert(2)&lt;/script&gt;</p>"
            "<li>an item</li><pre>line 1\n  line 2</pre><div>dropped</div></body></html>")
    blocks = blocks_of(html)
    kept = np.array([True, True, True, True, False])
    fragment = block_choice.kept_fragment(blocks, kept, "https://site.example/a/b")
    assert "javascript:" not in fragment and "data:" not in fragment
    assert '<a href="https://site.example/next">the next page</a> and' in fragment
    assert "<script>" not in fragment and "&lt;script&gt;" in fragment
    assert fragment.startswith("<article><h2>Title</h2>") and "<ul><li>an item</li></ul>" in fragment
    assert "<pre>line 1\n  line 2</pre>" in fragment and "dropped" not in fragment
    assert "this" in fragment and "that" in fragment
    assert "not-a-host" not in fragment and "a broken one" in fragment
    assert block_choice.kept_fragment(blocks, kept & False, None) == ""


def test_the_training_refuses_a_stored_table_of_other_numbers(tmp_path):
    """A block table stored before block_features() changed would fit trees
    on numbers that kb does not make."""
    stale = tmp_path / "table.pkl"
    table = {"wcxb/1": {"texts": ["a"], "X": np.zeros((1, len(feature_names()) - 1), dtype=np.float32)},
             "wcxb/2": {"texts": [], "X": np.zeros((0, 0), dtype=np.float32)}}
    with pytest.raises(SystemExit, match=rf"table.pkl: the blocks have \[{len(feature_names()) - 1}\] numbers"):
        train_block_choice._check_table(table, stale)
    table["wcxb/1"]["X"] = np.zeros((1, len(feature_names())), dtype=np.float32)
    train_block_choice._check_table(table, stale)


# --- rules after the model (issue 58) ---------------------------------------------------

def _block(blocks, start: str):
    return next(b for b in blocks if b.text.startswith(start))


def test_markup_shown_as_text_is_boilerplate_and_code_in_pre_is_not():
    """A tracking pixel or an advertisement's code as text is not main
    text; an HTML sample in <pre>, or prose that names a tag, is."""
    blocks = blocks_of(
        "<html><body><article>"
        "<div>&lt;div style=\"position:absolute;\"&gt;&lt;img width=1 height=1 src=\"https://t.example/b\"&gt;</div>"
        "<div> &lt;iframe src=\"https://ads.example/\"&gt;&lt;/iframe&gt;</div>"
        "<pre>&lt;div class=\"box\"&gt;One&lt;/div&gt;</pre>"
        "<p>Use the &lt;div&gt; element for a box.</p>"
        "</article></body></html>")
    assert block_choice.is_boilerplate(_block(blocks, '<div style='))
    assert block_choice.is_boilerplate(_block(blocks, '<iframe'))
    assert not block_choice.is_boilerplate(_block(blocks, '<div class="box">'))
    assert not block_choice.is_boilerplate(_block(blocks, "Use the <div>"))


def test_a_menu_item_of_the_site_is_boilerplate_and_a_list_in_the_text_is_not():
    blocks = blocks_of(
        "<html><body><header><nav><ul>"
        "<li><a href='/uk'>UK</a></li><li><a href='/world'>World and more</a></li>"
        "<li><a href='/long'>Four words of link</a></li><li>Not a link</li></ul></nav></header>"
        "<div class='menu'><ul><li><a href='/sport'>Sport</a></li></ul></div>"
        "<article><p>The budget passed.</p><ul><li><a href='/budget'>Budget</a></li></ul></article>"
        "</body></html>")
    assert block_choice.is_boilerplate(_block(blocks, "UK"))
    assert block_choice.is_boilerplate(_block(blocks, "World and more"))
    # Longer than MENU_ITEM_WORDS, not a link, outside <nav> and <header>, or in the text: kept.
    for text in ("Four words of link", "Not a link", "Sport", "Budget", "The budget passed."):
        assert not block_choice.is_boilerplate(_block(blocks, text)), text
    kept = block_choice.without_boilerplate(blocks, np.array([True] * len(blocks)))
    assert [b.text for b, keep in zip(blocks, kept) if keep] == [
        "Four words of link", "Not a link", "Sport", "The budget passed.", "Budget"]
    # A block that the model dropped stays dropped.
    assert not block_choice.without_boilerplate(blocks, np.zeros(len(blocks), dtype=bool)).any()


def _far_run_page(gap: int, far_score: float, far_first: bool = False):
    """5 kept blocks of 100 words (score 0.95), `gap` dropped blocks, and a
    run of 3 kept blocks of 50 words (score far_score); or the short run
    first."""
    main = ([True] * 5, [0.95] * 5, [100.0] * 5)
    gap_part = ([False] * gap, [0.1] * gap, [20.0] * gap)
    far = ([True] * 3, [far_score] * 3, [50.0] * 3)
    parts = (far, gap_part, main) if far_first else (main, gap_part, far)
    return tuple(np.array(sum((list(part[i]) for part in parts), [])) for i in range(3))


def test_a_far_run_of_doubtful_blocks_after_the_main_text_is_dropped():
    kept, scores, words = _far_run_page(gap=block_choice.FAR_BLOCKS, far_score=0.6)
    result = block_choice.without_far_runs(kept, scores, words)
    assert result[:5].all() and not result[5:].any()
    assert kept[-3:].all()  # the caller's mask is not changed


@pytest.mark.parametrize("gap, far_score, far_first", [
    (9, 0.6, False),   # near the main text: a part of it
    (10, 0.75, False),  # far, but the model is sure enough
    (10, 0.6, True),  # before the main text: a lead or a summary
])
def test_a_run_near_the_main_text_sure_or_before_it_stays(gap, far_score, far_first):
    kept, scores, words = _far_run_page(gap, far_score, far_first)
    assert (block_choice.without_far_runs(kept, scores, words) == kept).all()


def _rows_with_links(links: list[float]) -> np.ndarray:
    """Rows of block_features() that hold only each block's link share."""
    rows = np.zeros((len(links), len(feature_names())), dtype=np.float32)
    rows[:, feature_names().index("link_share")] = links
    return rows


def _far_run_main_text(monkeypatch, kind: str, far_links: float, far_words: float = 10.0) -> int:
    """How many of the 20 blocks of _far_run_page() (gap 12) main_text()
    keeps on a page of this type: 5 in the main text, 3 in the far run,
    whose blocks hold far_words words each and far_links link text."""
    kept, scores, words = _far_run_page(gap=12, far_score=0.6)
    words[-3:] = far_words
    monkeypatch.setattr(block_choice, "block_scores", lambda model, rows: scores)
    monkeypatch.setattr(block_choice, "block_words", lambda rows: words)
    model = {"selection": {str(kind): ("at_least", 0.5) for kind in PageType}}
    return int(block_choice.main_text(model, _rows_with_links([0.0] * 17 + [far_links] * 3), kind).sum())


def test_on_an_article_page_every_far_run_is_dropped(monkeypatch):
    assert _far_run_main_text(monkeypatch, "article", far_links=0.0, far_words=50.0) == 5


@pytest.mark.parametrize("kind", [str(kind) for kind in PageType if kind not in (PageType.ARTICLE, PageType.FORUM)])
def test_on_other_pages_a_far_run_of_link_titles_is_dropped_and_other_far_runs_stay(monkeypatch, kind):
    # The titles of other stories beside the page's text go ...
    assert _far_run_main_text(monkeypatch, kind, far_links=1.0) == 5
    # ... a far run of text, and a row of cards each of one long link, stay.
    assert _far_run_main_text(monkeypatch, kind, far_links=0.0) == 8
    assert _far_run_main_text(monkeypatch, kind, far_links=1.0, far_words=block_choice.TITLE_WORDS) == 8


def test_on_a_forum_page_no_far_run_is_dropped(monkeypatch):
    # The later posts of a thread: their user names are link titles.
    assert _far_run_main_text(monkeypatch, "forum", far_links=1.0) == 8


def test_a_link_title_is_short_and_half_link_text():
    rows = _rows_with_links([0.5, 0.5, 0.49, 1.0])
    words = np.array([block_choice.TITLE_WORDS - 1, block_choice.TITLE_WORDS, 5, 0], dtype=float)
    assert block_choice.link_titles(rows, words).tolist() == [True, False, False, True]


def test_the_titles_of_a_far_run_are_counted_by_their_words():
    kept, scores, words = _far_run_page(gap=12, far_score=0.6)
    titles = np.zeros(len(kept), dtype=bool)
    titles[-3] = True  # 1 block of 3 is a title ...
    words[-3:] = [10.0, 45.0, 45.0]  # ... with 0.1 of the run's words: the run stays
    assert (block_choice.without_far_runs(kept, scores, words, titles) == kept).all()
    words[-3] = 40.0  # 40 of 130 words: 0.31
    assert not block_choice.without_far_runs(kept, scores, words, titles)[-3:].any()
    # A run of titles that the model is sure of stays, as on an article page.
    assert (block_choice.without_far_runs(kept, np.where(kept, 0.95, 0.1), words, titles) == kept).all()


def test_a_short_figure_caption_is_boilerplate_and_a_long_one_is_not():
    blocks = blocks_of(
        "<html><body><article><p>The bridge stood for four hundred years.</p>"
        "<figure><img src='a.jpg'><figcaption>The bridge in winter (Jane Doe)</figcaption></figure>"
        "<figure><img src='b.jpg'><figcaption>The council met on the bridge in 1910 to decide that the town "
        "would keep it as it was.</figcaption></figure><p>Short line.</p></article></body></html>")
    assert block_choice.is_boilerplate(_block(blocks, "The bridge in winter"))
    assert not block_choice.is_boilerplate(_block(blocks, "The council met"))
    assert not block_choice.is_boilerplate(_block(blocks, "Short line."))



_STORY = ("<p>Most people go to hotels for the pleasure of sleeping in a giant bed with clean white sheets and "
          "waking up to fresh towels in the morning. But those towels and sheets might not be as clean as they "
          "look, according to the hotel owners that answered an online thread about the things they do not "
          "tell their guests. The owners said that a guest should look at the sheets, the towels and the cups "
          "before using them.</p>")
_STORY_TEXT = " ".join(lxml.html.fragment_fromstring(_STORY).text_content().split())
_GALLERY = ("<div class='dnd-widget-wrapper'><div class='full-gallery'><h2 class='gallery-title'>Business news in "
            "pictures</h2><ul class='legends'><li><h2>1/50 United going down</h2>"
            "<p>Manchester United's absence from the Champions League hurt more than the pride of the fans.</p>"
            "<p class='credits'>GETTY IMAGES</p></li><li><h2>2/50 Star Wars boosts the economy</h2>"
            "<p>Production of the next Star Wars film brought an economic impact of some 150 million pounds.</p>"
            "</li></ul></div></div>"
            # A gallery that the site names by its id, not its class.
            "<div id='photo-slideshow'><p>3/50 The pound falls against the dollar after the vote.</p></div>")
_AFTER = ("<div class='slider-content'><p>Beware the wall-mounted hairdryer: it holds the most germs in the "
          "room.</p></div><p>Mini bars almost always lose money, the hotel owners said.</p>")


def _kept_texts(html: str, kind: str | None) -> list[str]:
    blocks = blocks_of(html)
    kept = block_choice.without_boilerplate(blocks, np.ones(len(blocks), dtype=bool), kind)
    return [b.text for b, keep in zip(blocks, kept) if keep]


def _keeps_no_block_that_the_model_dropped(html: str, kind: str | None) -> bool:
    blocks = blocks_of(html)
    return not block_choice.without_boilerplate(blocks, np.zeros(len(blocks), dtype=bool), kind).any()


def test_a_gallery_in_an_article_is_dropped_and_the_text_around_it_stays():
    """The blocks of an element named as a gallery inside <article> (a
    photo gallery of other stories) go on article pages; the article's
    paragraphs, and a slider's text, stay."""
    page = f"<html><body><article class='full-article'>{_STORY}{_GALLERY}{_AFTER}</article></body></html>"
    assert _kept_texts(page, str(PageType.ARTICLE)) == [
        _STORY_TEXT,
        "Beware the wall-mounted hairdryer: it holds the most germs in the room.",
        "Mini bars almost always lose money, the hotel owners said."]
    # A block that the model dropped stays dropped.
    assert _keeps_no_block_that_the_model_dropped(page, str(PageType.ARTICLE))


@pytest.mark.parametrize("page, kind", [
    # Another type of page: the gallery shows the items.
    (f"<html><body><article>{_STORY}{_GALLERY}</article></body></html>", PageType.PRODUCT),
    (f"<html><body><article>{_STORY}{_GALLERY}</article></body></html>", PageType.COLLECTION),
    (f"<html><body><article>{_STORY}{_GALLERY}</article></body></html>", None),
    # Outside <article>: a product's features, named "gallery" by the site.
    (f"<html><body><main>{_STORY}{_GALLERY}</main></body></html>", PageType.ARTICLE),
    # The gallery holds nearly all the text: it is the page's text.
    (f"<html><body><article>{_GALLERY}{_AFTER}</article></body></html>", PageType.ARTICLE),
])
def test_a_gallery_stays_on_other_pages_outside_the_article_or_when_it_is_the_text(page, kind):
    blocks = blocks_of(page)
    assert _kept_texts(page, None if kind is None else str(kind)) == [b.text for b in blocks]


_LABELS_PAGE = (
    "<html><body><div class='module navigation-module'><ul><li><a href='/news'>News</a></li>"
    "<li><a href='/local'>Local</a></li><li><a href='/opinion'>Opinion columns today</a></li></ul></div>"
    "<div class='kicker'><a href='/videos'>Videos</a></div>"
    "<div><a href='/deals'>$ 99 deals</a></div>"
    "<div><a href='/long'>Four words of link</a></div>"
    "<div>Opinion</div>"
    "<h1>The bridge stays open for another year</h1>"
    f"{_STORY}"
    "<p>Mini bars almost always lose money, the hotel owners said.</p>"
    "<ul class='tags'><li><a href='/tag/hotels'>Hotels</a></li></ul>"
    "</body></html>")


def test_links_above_the_story_are_dropped_on_an_article_page():
    """The site's menu and section links above the first paragraph of prose
    go, outside <nav> too; a price, a longer link, plain text, the headline
    and every block from the story on stay (a tag link below it too)."""
    assert _kept_texts(_LABELS_PAGE, str(PageType.ARTICLE)) == [
        "$ 99 deals", "Four words of link", "Opinion", "The bridge stays open for another year", _STORY_TEXT,
        "Mini bars almost always lose money, the hotel owners said.", "Hotels"]
    assert _keeps_no_block_that_the_model_dropped(_LABELS_PAGE, str(PageType.ARTICLE))


@pytest.mark.parametrize("page, kind", [
    # Another type of page: the links are the items of a listing or a shop.
    (_LABELS_PAGE, PageType.LISTING),
    (_LABELS_PAGE, PageType.COLLECTION),
    (_LABELS_PAGE, None),
    # No prose on the page: no story for the links to stand above.
    ("<html><body><div><a href='/news'>News</a></div><div><a href='/local'>Local</a></div>"
     "<p>Short line.</p></body></html>", PageType.ARTICLE),
])
def test_links_above_the_story_stay_on_other_pages_or_without_prose(page, kind):
    blocks = blocks_of(page)
    assert _kept_texts(page, None if kind is None else str(kind)) == [b.text for b in blocks]


_PLAYER = ("<div id='player' class='video-js vjs-default-skin'><div class='vjs-control-bar'>"
           "<div class='vjs-subtitles-button vjs-menu-button'>Subtitles</div>"
           "<ul class='vjs-menu-content'><li>Chapters</li>"
           "<li class='vjs-menu-item vjs-selected'>subtitles off, selected</li></ul></div>"
           "<div class='vjs-text-track-settings'><label class='vjs-label'>Background</label>"
           "<div class='vjs-close-button vjs-control'>Close</div></div></div>")
_NEAR_PLAYER = ("<p class='video-caption'>The hotel owners talk about towels on the video.</p>"
                "<div class='novjs-box'><p>Not a control of the player.</p></div>")


@pytest.mark.parametrize("kind", [None, *(str(kind) for kind in PageType)])
def test_the_controls_of_a_video_player_are_dropped_and_the_text_around_them_stays(kind):
    """The menus and settings of a video.js player (its "vjs-" names) go on
    every page; the story, the video's caption outside the player, and a
    name that only holds "vjs-" inside a word stay."""
    page = f"<html><body><article>{_STORY}{_PLAYER}{_NEAR_PLAYER}</article></body></html>"
    assert _kept_texts(page, kind) == [
        _STORY_TEXT,
        "The hotel owners talk about towels on the video.", "Not a control of the player."]


_DEK_PAGE = ("<html><body><article><h1>The bridge stays open for another year</h1>"
             "<p class='article-dek'>The council kept the old bridge open, and the town pays for the repairs.</p>"
             "<div class='styles_articleDek__Icz5H'>A summary of the story in one long sentence for readers.</div>"
             f"{_STORY}"
             "<div class='story-block'><p class='standfirst'>JANE DOE The town has other bridges, and they need "
             "repairs too.</p></div>"
             "<p class='dekor-note'>The paint of the bridge is red, as it was in 1910.</p>"
             "<div class='dek'><p>A paragraph inside a box that the site named dek.</p></div>"
             "<p id='story-standfirst'>A second summary that the site names by its id, not its class.</p>"
             "</article></body></html>")


def test_a_dek_is_dropped_on_an_article_page():
    """On an article page a block whose own class or id names it a dek
    ("article-dek", "...Dek__...", "standfirst") goes; the headline, the
    story, a name that holds "dek" inside a word ("dekor-note") and a block
    inside an element named "dek" stay."""
    assert _kept_texts(_DEK_PAGE, str(PageType.ARTICLE)) == [
        "The bridge stays open for another year", _STORY_TEXT,
        "The paint of the bridge is red, as it was in 1910.",
        "A paragraph inside a box that the site named dek."]
    blocks = blocks_of(_DEK_PAGE)
    assert block_choice.is_dek(_block(blocks, "The council kept"))
    assert block_choice.is_dek(_block(blocks, "A second summary"))
    assert not block_choice.is_dek(_block(blocks, "The paint"))


@pytest.mark.parametrize("kind", [None, *(str(kind) for kind in PageType if kind != PageType.ARTICLE)])
def test_a_dek_stays_on_other_pages(kind):
    """On a shop's or a listing's page, a "subtitle" named dek is the text
    of an item."""
    assert _kept_texts(_DEK_PAGE, kind) == [b.text for b in blocks_of(_DEK_PAGE)]


_BOXES = ("<aside class='related-stories'><h3>Related stories</h3><ul><li><a href='/a'>The old ferry returns to "
          "the river after ten years</a></li></ul></aside>"
          "<div class='newsletter-box'><p>Get the best stories of the week in your inbox every Friday.</p>"
          "<form><button>Sign up</button></form></div>"
          "<div class='c-signup'><p>Sign up for our morning briefing and read it with your coffee.</p></div>")
_BOX_NEIGHBOURS = ("<h2 id='which-is-the-best-subscribe-service'>Which is the best service?</h2>"
                   "<p>Mini bars almost always lose money, the hotel owners said.</p>")


def test_boxes_of_related_stories_and_newsletters_are_dropped_on_an_article_page():
    """On an article page the blocks of an element whose class names a box
    of related stories or of a newsletter go; the story, and a heading
    whose id (made from its words) holds such a name, stay."""
    page = f"<html><body><article>{_STORY}{_BOXES}{_BOX_NEIGHBOURS}</article></body></html>"
    assert _kept_texts(page, str(PageType.ARTICLE)) == [
        _STORY_TEXT, "Which is the best service?", "Mini bars almost always lose money, the hotel owners said."]
    assert _keeps_no_block_that_the_model_dropped(page, str(PageType.ARTICLE))


@pytest.mark.parametrize("page, kind", [
    # Another type of page: a shop's "related products" are its items.
    (f"<html><body><article>{_STORY}{_BOXES}</article></body></html>", PageType.PRODUCT),
    (f"<html><body><article>{_STORY}{_BOXES}</article></body></html>", PageType.LISTING),
    (f"<html><body><article>{_STORY}{_BOXES}</article></body></html>", None),
    # The box holds nearly all the text: a newsletter's issue in "newsletter-email".
    (f"<html><body><div class='newsletter-email'>{_STORY}</div><p>Short line.</p></body></html>",
     PageType.ARTICLE),
])
def test_a_box_stays_on_other_pages_or_when_it_is_the_text(page, kind):
    blocks = blocks_of(page)
    assert _kept_texts(page, None if kind is None else str(kind)) == [b.text for b in blocks]
