"""Train the block choice of extraction (kb.enrich.block_choice) and check it.

Each block of each page of both development sets is one example
(kb.enrich.page_blocks.block_features()). Its label:
- WCXB: main text when at least LABEL_SHARE of its word trigrams are in
  the page's hand-made main text.
- news set: main text when it holds a snippet that the text must hold; not
  main text when it holds one that the text must not hold; else no label.
- a copy of an earlier block's text: label_copies().
Each page weighs 1, shared by its blocks by their words: the sets score
each page, and a long block counts more words.

LightGBM fits the trees; PyTorch fits the network that reads the blocks
of a page in order (kb.enrich.block_choice.SEQUENCE), on the same
examples. A block's score is the mean of both. The selection of each page type of kb
(kb.enrich.page_types: one of CHOICES, a threshold or a beta of the best
expected F-score, kb.enrich.block_choice.SELECTION_RULES) is chosen on
out-of-fold scores of the trees: the best sum of both sets' F1. Nested
5-fold cross-validation (the folds of bench_extraction.py): for each fold,
the trees and the network are fitted on the other 4 folds, the selections
on an inner 4-fold CV of the trees on those folds, and the fold is scored
with the mean of both models and the selections, beside trafilatura alone
on the same pages. The selections come from the trees alone because an
inner CV of the network too would take 20 more fits (about an hour).
With --write, both models are fitted on all pages, the selections on a
5-fold CV of the trees on all pages, and the plain numbers go to
kb/enrich/block_choice_model.json.

Needs the "train" extra (`.venv/bin/pip install -e ".[train]"`: LightGBM;
PyTorch comes with kb).
Run (the cache holds trafilatura's runs, as for bench_extraction.py --cv;
a missing run is made and stored; --table keeps the block table):
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_block_choice.py [--cache FILE] [--table FILE] [--write] [--json FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_extraction as bench  # noqa: E402

LABEL_SHARE = 0.5
# The selections that the tuning tries for each page type.
CHOICES = ([("at_least", t) for t in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65)]
           + [("best_f1", beta) for beta in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)])
START = ("at_least", 0.5)
# LightGBM's settings. Under 5-fold CV (3 December 2026): 31 leaves, 300
# rounds at 0.05 gave WCXB 0.8550 and news 0.9336; the same with a depth
# of at most 8 gave 0.8550 and 0.9349, and kb walks 8 levels, not 20;
# 15 leaves and 150 rounds at 0.1 lost 0.005 on an earlier feature set.
# 600 rounds, on the 107 numbers of the groups (4 December 2026, 5-fold
# OOF screen): news 0.9474 and WCXB 0.8606, against 0.9445 and 0.8600 for
# 300; 1,000 rounds gave 0.9477 and 0.8596, 600 at 0.03 gave 0.9454 and
# 0.8606.
PARAMETERS = {"objective": "binary", "learning_rate": 0.05, "num_leaves": 31, "max_depth": 8, "min_data_in_leaf": 50,
              "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
              "verbose": -1, "seed": 1}
ROUNDS = 600
# The network (kb.enrich.block_choice.SEQUENCE). 5-fold screen on the first
# fold (4 December 2026): one GRU layer of 48 gave WCXB 0.8571 alone and
# 0.8592 in the mean with the trees (trees alone 0.8528); two layers of 64
# with dropout 0.2 gave 0.8579 and 0.8618 at twice the time a block; with
# the trees' score as one more input, 12 epochs gave 0.8454 and 6 epochs
# 0.8560 (benchmarks/extraction.md).
SEQUENCE_SETTINGS = {"width": 64, "hidden": 48, "head": 32, "epochs": 10, "learning_rate": 2e-3,
                     "weight_decay": 1e-5, "pages_a_step": 16, "seed": 1}
TRAFILATURA = "trafilatura"
# How much a news page weighs against a WCXB page in the fit.
# 3 (5 December 2026, 300 trees, 5-fold out-of-fold, with earlier_copy):
# news 0.9479 and WCXB 0.8682, against 0.9445 and 0.8683 for 1 (news up
# in 5 of 5 folds); 2 gave 0.9463 and 0.8690.
NEWS_WEIGHT = 3.0


def block_table(sets: list, cache: Path | None) -> dict:
    """For every page: the features, labels and texts of its blocks, its
    set, annotated type, kb's type, fold, and trafilatura alone's counts."""
    import trafilatura

    from kb.enrich.block_choice import block_html
    from kb.enrich.extract import kept_texts, trafilatura_fragment
    from kb.enrich.page_blocks import block_features, gram_sets, page_blocks, share_in, words_of
    from kb.enrich.page_types import page_type

    stored = pickle.loads(cache.read_bytes()) if cache and cache.exists() else {}
    table = {}
    for dev in sets:
        for page in dev.pages:
            raw = bench.html_of(page)
            tree = trafilatura.load_html(raw)
            runs = stored.setdefault(page.key, {}).setdefault("runs", {})
            for mode in ("default", "precision"):
                if mode not in runs:
                    runs[mode] = trafilatura_fragment(copy.deepcopy(tree), page.url, mode) if tree is not None else ""
            try:
                alone = trafilatura.extract(raw, url=page.url) or ""
            except Exception:  # noqa: BLE001 - as bench_extraction scores it: a failure is an empty text
                alone = ""
            row = {"set": dev.name, "kind": page.kind, "fold": bench.fold_of(page),
                   "rule": str(page_type(tree, page.url)) if tree is not None else "article",
                   TRAFILATURA: dev.counts(page, alone), "texts": [], "pieces": [], "y": np.zeros(0, dtype=np.int8),
                   "X": np.zeros((0, 0), dtype=np.float32)}
            table[page.key] = row
            if tree is None:
                continue
            blocks = page_blocks(tree)
            row["X"] = block_features(tree, blocks, kept_texts(runs.__getitem__), row["rule"])
            row["texts"] = [block.text for block in blocks]
            # What kb's fragment holds for each block: the Scorer reads the
            # text that kb gives, through html_to_text().
            row["pieces"] = [block_html(block, page.url) for block in blocks]
            if dev.name == "wcxb":
                truth = gram_sets(dev.truth[page.key])
                labels = [int(share_in(words_of(text), truth) >= LABEL_SHARE) for text in row["texts"]]
            else:
                snippets = dev.dev.SNIPPETS[page.key.removeprefix("news/")]
                must = [dev.dev.norm(s) for s in snippets["with"]]
                must_not = [dev.dev.norm(s) for s in snippets["without"]]
                labels = []
                for text in row["texts"]:
                    norm = dev.dev.norm(text)
                    labels.append(1 if any(s in norm for s in must) else 0 if any(s in norm for s in must_not) else -1)
            row["y"] = label_copies(row["texts"], np.array(labels, dtype=np.int8),
                                    dev.truth[page.key] if dev.name == "wcxb" else None)
    if cache:
        cache.write_bytes(pickle.dumps(stored))
    return table


def label_copies(texts: list[str], labels: np.ndarray, truth: str | None) -> np.ndarray:
    """The labels of blocks whose text stood in an earlier block of the page.
    The trigrams of a copy are in the hand-made text when those of the
    first are, but word F1 counts each word as often as it stands: a copy
    is main text only when the hand-made text holds the text that often.
    Labels by trigrams alone taught the model to keep every copy; with
    these labels and the feature earlier_copy, 300 trees under 5-fold CV
    gave WCXB 0.8683 in place of 0.8600 (forum 0.802 in place of 0.776),
    news 0.9445 both (4 December 2026); under nested CV with the network,
    WCXB 0.8708 against 0.8624 and news 0.9452 against 0.9469 (then
    NEWS_WEIGHT 3: 0.8697 and 0.9519). The news set scores snippets,
    which one copy holds: there a copy labelled main text gets no label
    (-1). A copy is the same text (kb's earlier_copies()); the count is by
    words, so a short copy also counts where its words stand inside a
    longer sentence of the hand-made text."""
    from kb.enrich.page_blocks import earlier_copies, words_of

    def spaced(text: str) -> str:
        # Each word in its own spaces: str.count() does not count
        # overlapping matches, and " x x " holds " x " once, not twice.
        return "".join(f" {word} " for word in words_of(text))

    labels = labels.copy()
    hand_made = spaced(truth) if truth is not None else ""
    for index, (text, earlier) in enumerate(zip(texts, earlier_copies(texts))):
        if not earlier or labels[index] != 1:
            continue
        if truth is None:
            labels[index] = -1
        elif hand_made.count(spaced(text)) <= earlier:
            labels[index] = 0
    return labels


def block_weights(row: dict) -> np.ndarray:
    """The weight of each block of a page in the fit of both models: the
    page weighs 1 (a news page NEWS_WEIGHT), shared by the words of its
    labelled blocks; a block without a label weighs 0."""
    from kb.enrich.block_choice import block_words

    words = np.where(row["y"] >= 0, block_words(row["X"]), 0.0)
    weight = NEWS_WEIGHT if row["set"] == "news" else 1.0
    return weight * words / max(1.0, float(words.sum()))


def examples(table: dict, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The labelled blocks of the pages, with their block_weights()."""
    rows, labels, weights = [], [], []
    for key in keys:
        row = table[key]
        labelled = row["y"] >= 0
        if not labelled.any():
            continue
        rows.append(row["X"][labelled])
        labels.append(row["y"][labelled])
        weights.append(block_weights(row)[labelled])
    return np.vstack(rows), np.concatenate(labels), np.concatenate(weights)


def fit(table: dict, keys: list[str]):
    import lightgbm

    rows, labels, weights = examples(table, keys)
    return lightgbm.train(PARAMETERS | {"num_threads": os.cpu_count() or 1},
                          lightgbm.Dataset(rows, labels, weight=weights), ROUNDS)


def fit_sequence(table: dict, keys: list[str]):
    """The network, fitted on the labelled blocks of the pages with their
    block_weights(), as the trees. The network reads the unlabelled blocks
    too; they have no weight in the loss. A number that does not change on
    these pages gets the scale 1e-6; kb.enrich.block_choice gives the
    network 0 for it (_sequence_arrays)."""
    import torch

    settings = SEQUENCE_SETTINGS
    torch.manual_seed(settings["seed"])
    generator = np.random.default_rng(settings["seed"])
    pages = [key for key in keys if len(table[key]["texts"])]
    rows = np.vstack([table[key]["X"] for key in pages]).astype(np.float64)
    mean, scale = rows.mean(axis=0), rows.std(axis=0) + 1e-6
    network = _network(mean.astype(np.float32), scale.astype(np.float32), settings)
    optimizer = torch.optim.Adam(network.parameters(), lr=settings["learning_rate"],
                                 weight_decay=settings["weight_decay"])
    examples = {key: _page_tensors(table[key], mean, scale) for key in pages}
    batches = _batches(pages, table, settings["pages_a_step"])
    for _ in range(settings["epochs"]):
        for index in generator.permutation(len(batches)):
            inputs, labels, weights, lengths = _padded([examples[key] for key in batches[index]])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                network(inputs, lengths), labels, reduction="none")
            optimizer.zero_grad()
            ((loss * weights).sum() / len(lengths)).backward()
            optimizer.step()
    network.eval()
    return network


def predict_sequence(network, table: dict, keys: list[str]) -> dict[str, np.ndarray]:
    """The network's probability for each block of the pages."""
    import torch

    pages = [key for key in keys if len(table[key]["texts"])]
    scores = {}
    with torch.no_grad():
        for batch in _batches(pages, table, SEQUENCE_SETTINGS["pages_a_step"]):
            inputs, _, _, lengths = _padded([_page_tensors(table[key], network.mean.numpy(), network.scale.numpy())
                                             for key in batch])
            probabilities = torch.sigmoid(network(inputs, lengths)).numpy().astype(np.float64)
            for index, key in enumerate(batch):
                scores[key] = probabilities[index, :lengths[index]]
    return scores


def _batches(pages: list[str], table: dict, size: int) -> list[list[str]]:
    """Pages of near lengths together: less padding."""
    pages = sorted(pages, key=lambda key: len(table[key]["texts"]))
    return [pages[start:start + size] for start in range(0, len(pages), size)]


def _page_tensors(row: dict, mean: np.ndarray, scale: np.ndarray) -> tuple:
    import torch

    return (torch.tensor(((row["X"] - mean) / scale).astype(np.float32)),
            torch.tensor(np.maximum(row["y"], 0).astype(np.float32)),
            torch.tensor(block_weights(row).astype(np.float32)))


def _padded(pages: list[tuple]) -> tuple:
    import torch

    pad = torch.nn.utils.rnn.pad_sequence
    return (pad([page[0] for page in pages], batch_first=True), pad([page[1] for page in pages], batch_first=True),
            pad([page[2] for page in pages], batch_first=True), torch.tensor([len(page[0]) for page in pages]))


def _network(mean: np.ndarray, scale: np.ndarray, settings: dict):
    """PyTorch's form of kb.enrich.block_choice.sequence_scores(): the
    names of its state (parameters, and the scale of the numbers as
    buffers) are the names of SEQUENCE. forward() takes scaled numbers."""
    import torch

    class Network(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.tensor(mean))
            self.register_buffer("scale", torch.tensor(scale))
            self.input = torch.nn.Linear(len(mean), settings["width"])
            self.gru = torch.nn.GRU(settings["width"], settings["hidden"], batch_first=True, bidirectional=True)
            self.head = torch.nn.Linear(settings["width"] + 2 * settings["hidden"], settings["head"])
            self.output = torch.nn.Linear(settings["head"], 1)

        def forward(self, inputs, lengths):
            blocks = torch.relu(self.input(inputs))
            packed = torch.nn.utils.rnn.pack_padded_sequence(blocks, lengths, batch_first=True,
                                                             enforce_sorted=False)
            states, _ = torch.nn.utils.rnn.pad_packed_sequence(self.gru(packed)[0], batch_first=True,
                                                               total_length=inputs.shape[1])
            return self.output(torch.relu(self.head(torch.cat([blocks, states], dim=-1)))).squeeze(-1)

    return Network()


def blend(trees: dict[str, np.ndarray], sequence: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each page's scores as kb.enrich.block_choice.block_scores() makes them."""
    from kb.enrich.block_choice import mean_score

    return {key: mean_score(scores, sequence[key]) if len(scores) else scores for key, scores in trees.items()}


class Scorer:
    """The counts of each page's text with each of CHOICES, made once."""

    def __init__(self, sets: list, table: dict):
        self.sets = {dev.name: dev for dev in sets}
        self.table = table
        self.pages = {page.key: page for dev in sets for page in dev.pages}

    def counts(self, scores: dict[str, np.ndarray]) -> dict[str, dict[tuple, tuple]]:
        """The counts of the text that kb gives (html_to_text of the kept
        blocks' HTML), without the favor_recall run of a thin text."""
        from kb.enrich.block_choice import block_words, fragment_of, kept_blocks
        from kb.enrich.extract import html_to_text

        out = {}
        for key, page_scores in scores.items():
            row = self.table[key]
            dev = self.sets[row["set"]]
            words = block_words(row["X"])
            out[key] = {choice: dev.counts(self.pages[key], html_to_text(fragment_of(
                [piece for piece, kept in zip(row["pieces"], kept_blocks(page_scores, words, choice)) if kept])))
                for choice in CHOICES}
        return out

    def objective(self, counts: dict, keys: list[str], selection: dict[str, tuple]) -> float:
        total = 0.0
        for name, dev in self.sets.items():
            total += dev.f1([counts[k][selection[self.table[k]["rule"]]] for k in keys
                             if self.table[k]["set"] == name])["f1"]
        return total

    def tune(self, counts: dict, keys: list[str]) -> dict[str, tuple]:
        """The selection of each kb page type: coordinate ascent on the sum
        of both sets' F1, from START."""
        from kb.enrich.page_types import PageType

        selection = {str(kind): START for kind in PageType}
        for _ in range(2):
            for kind in selection:
                selection[kind] = max(CHOICES, key=lambda c: (self.objective(counts, keys, selection | {kind: c}),
                                                              c == selection[kind]))
        return selection


def tree_scores(model, table: dict, keys: list[str]) -> dict[str, np.ndarray]:
    """LightGBM's score for each block of the pages (none for a page
    without blocks)."""
    return {key: model.predict(table[key]["X"]) if len(table[key]["texts"]) else np.zeros(0) for key in keys}


def out_of_fold(table: dict, keys: list[str], folds: list[int]) -> dict[str, np.ndarray]:
    """The scores of each page from trees fitted on the other folds."""
    scores = {}
    for fold in folds:
        model = fit(table, [k for k in keys if table[k]["fold"] != fold])
        scores |= tree_scores(model, table, [k for k in keys if table[k]["fold"] == fold])
    return scores


def nested_cv(sets: list, table: dict, scorer: Scorer) -> list[dict]:
    rows = []
    keys = list(table)
    for fold in range(bench.FOLDS):
        inner = [f for f in range(bench.FOLDS) if f != fold]
        train = [k for k in keys if table[k]["fold"] != fold]
        test = [k for k in keys if table[k]["fold"] == fold]
        selection = scorer.tune(scorer.counts(out_of_fold(table, train, inner)), train)
        model = fit(table, train)
        scores = blend(tree_scores(model, table, test), predict_sequence(fit_sequence(table, train), table, test))
        counts = scorer.counts(scores)
        row = {"fold": fold, "selection": selection}
        for dev in sets:
            for kind in ["all", *sorted({table[k]["kind"] for k in test if table[k]["set"] == dev.name})]:
                chosen = [k for k in test if table[k]["set"] == dev.name and kind in ("all", table[k]["kind"])]
                row[f"{dev.name}/{kind}"] = {
                    "blocks": dev.f1([counts[k][selection[table[k]["rule"]]] for k in chosen])["f1"],
                    TRAFILATURA: dev.f1([table[k][TRAFILATURA] for k in chosen])["f1"]}
        rows.append(row)
        print(f"fold {fold}: news {row['news/all']['blocks']:.4f}, WCXB {row['wcxb/all']['blocks']:.4f}, "
              f"selection {selection}", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print("| set, type | kb blocks | trafilatura | blocks above in |")
    print("|---|---|---|---|")
    for name in [n for n in rows[0] if "/" in n]:
        ours = [row[name]["blocks"] for row in rows]
        theirs = [row[name][TRAFILATURA] for row in rows]
        above = sum(a > b for a, b in zip(ours, theirs))
        print(f"| {name} | {bench.mean_spread(ours)} | {bench.mean_spread(theirs)} | {above} of {len(rows)} folds |")


def export(model, network, selection: dict[str, tuple]) -> dict:
    """The trees as padded flat arrays: per node its feature (-1 for a
    leaf), threshold, left and right child and leaf value; the network's
    arrays by their PyTorch names."""
    from kb.enrich.page_blocks import feature_names

    trees, depth = [], 0
    for info in model.dump_model()["tree_info"]:
        nodes = []

        def add(node: dict, level: int) -> int:
            nonlocal depth
            index = len(nodes)
            nodes.append(None)
            if "leaf_value" in node:
                nodes[index] = (-1, 0.0, index, index, node["leaf_value"])
                depth = max(depth, level)
                return index
            if node["decision_type"] != "<=":
                raise ValueError(f"split {node['decision_type']!r}: only '<=' is walked by kb.enrich.block_choice")
            left = add(node["left_child"], level + 1)
            right = add(node["right_child"], level + 1)
            nodes[index] = (node["split_feature"], node["threshold"], left, right, 0.0)
            return index

        add(info["tree_structure"], 0)
        trees.append(nodes)
    width = max(len(nodes) for nodes in trees)
    flat = []
    for nodes in trees:
        nodes = nodes + [(-1, 0.0, i, i, 0.0) for i in range(len(nodes), width)]
        flat.append({"feature": [n[0] for n in nodes], "threshold": [float(n[1]) for n in nodes],
                     "left": [n[2] for n in nodes], "right": [n[3] for n in nodes],
                     "value": [round(n[4], 7) for n in nodes]})
    return {"features": feature_names(), "depth": depth, "selection": selection, "trees": flat,
            "sequence": export_sequence(network)}


def export_sequence(network) -> dict[str, list]:
    """The network's state by its PyTorch names (SEQUENCE). The mean and
    scale keep every digit: a rounded scale of 1e-6 would be 0."""
    return {name: (value.numpy().astype(np.float64) if name in ("mean", "scale")
                   else np.round(value.numpy().astype(np.float64), 7)).tolist()
            for name, value in network.state_dict().items()}


def check_export(model, network, table: dict) -> None:
    """kb's scores from the written file must be the mean of LightGBM's and
    PyTorch's: raises AssertionError when a block's score differs by more
    than 1e-4 on one of the first 200 pages."""
    from kb.enrich import block_choice

    block_choice.load_model.cache_clear()
    shipped = block_choice.load_model()
    pages = [key for key, row in table.items() if len(row["texts"])][:200]
    expected = blend(tree_scores(model, table, pages), predict_sequence(network, table, pages))
    difference = max(np.abs(block_choice.block_scores(shipped, table[key]["X"]) - expected[key]).max()
                     for key in pages)
    assert difference < 1e-4, f"kb's scores differ from LightGBM's and PyTorch's by {difference}"
    print(f"the written file gives LightGBM's and PyTorch's scores (largest difference {difference:.2e})")


def _check_table(table: dict, path: Path) -> None:
    """A table stored before a change of block_features() would fit trees
    on numbers that kb does not make, and the error would show only when
    kb loads the model file."""
    from kb.enrich.page_blocks import feature_names

    widths = {row["X"].shape[1] for row in table.values() if len(row["texts"])}
    if widths != {len(feature_names())}:
        raise SystemExit(f"{path}: the blocks have {sorted(widths)} numbers, kb makes {len(feature_names())};"
                         " delete the file to make it again")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, help="keep trafilatura's runs in this pickle (bench_extraction --cache)")
    parser.add_argument("--table", type=Path, help="keep the block table in this pickle")
    parser.add_argument("--write", action="store_true", help="fit on all pages and write the model file")
    parser.add_argument("--no-cv", action="store_true", help="with --write: skip the nested CV")
    parser.add_argument("--json", type=Path, help="write the nested CV figures here")
    args = parser.parse_args()
    sets = [bench.NewsSet(bench.NEWS_SET), bench.WcxbSet(bench.WCXB_SET)]
    started = time.process_time()
    if args.table and args.table.exists():
        table = pickle.loads(args.table.read_bytes())
        _check_table(table, args.table)
    else:
        table = block_table(sets, args.cache)
        if args.table:
            args.table.write_bytes(pickle.dumps(table))
    print(f"block table: {len(table)} pages, {time.process_time() - started:.0f} s CPU", flush=True)
    scorer = Scorer(sets, table)
    if not args.no_cv:
        rows = nested_cv(sets, table, scorer)
        print_table(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    if args.write:
        from kb.enrich.block_choice import MODEL_FILE

        keys = list(table)
        selection = scorer.tune(scorer.counts(out_of_fold(table, keys, list(range(bench.FOLDS)))), keys)
        model, network = fit(table, keys), fit_sequence(table, keys)
        MODEL_FILE.write_text(json.dumps(export(model, network, selection), separators=(",", ":")) + "\n",
                              encoding="utf-8")
        check_export(model, network, table)
        print(f"wrote {MODEL_FILE}: selection {selection}")
    print(f"CPU {time.process_time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
