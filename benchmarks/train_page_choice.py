"""Train the per-page choice of extraction strategy (kb.enrich.page_choice).

For each alternative strategy, a logistic regression over
kb.enrich.page_choice.choice_features() learns when that strategy gives more
of a page's main text than the strategy of the page's type
(kb.enrich.extract.TYPE_STRATEGY). Both development sets train it: the
WCXB split (word F1 per page) and the news set (snippet F1 over all pages,
linearized per page), so that a gain on WCXB cannot hide a loss on news.
Each page weighs as much as its gain or loss: a page where the strategies
agree teaches nothing.

The settings (the weight of the news set, the regularization, the types
that the choice may change, the margin) are chosen by an inner 5-fold
cross-validation on the training pages: the best sum of both sets' F1 of
the settings that do not lower the news F1 of those pages.

Nested cross-validation: for each of the 5 folds of
benchmarks/bench_extraction.py, the strategy per type (its tune()) and the
choice (with its inner cross-validation) are fitted on the 4 other folds and
scored on this one, beside the strategy per type alone and trafilatura
alone on the same pages. With --write, the choice is fitted on all pages
(settings from a 5-fold CV of all pages) and its plain numbers go to
kb/enrich/page_choice_model.json. scikit-learn fits; kb reads only the JSON.

Run (the cache holds trafilatura's runs, as for bench_extraction.py --cv):
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_page_choice.py --cache FILE [--write] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_extraction as bench  # noqa: E402

# The alternatives that the choice may take instead of the type's strategy:
# trafilatura without links (closest to trafilatura alone), the series of
# items merged into trafilatura's text, the series of posts alone, and
# trafilatura's default text. They gave the highest per-page oracle of the
# strategies (benchmarks/extraction.md, 3 December 2026, afternoon).
ALTERNATIVES = ("nolinks", "items+merge+link_blocks", "posts", "default")
# The settings that the inner cross-validation chooses from.
NEWS_WEIGHTS = (1.0, 3.0, 5.0)
REGULARIZATION = (0.01, 0.1)  # C of the logistic regression
MARGINS = (0.0, 0.5, 1.0, 2.0)
# The types that the choice may change. On product, documentation and
# service pages the alternatives seldom gain: the narrow set keeps them on
# their type's strategy.
TYPE_SETS = (("article", "collection", "documentation", "forum", "listing", "product", "service"),
             ("article", "collection", "forum", "listing"))
TRAFILATURA = "trafilatura"


def page_table(sets: list, cache: Path) -> dict:
    """For every page: its set, annotated type, kb's type, the counts of
    every strategy and of trafilatura alone, and the choice's inputs."""
    import trafilatura

    from kb.enrich.extract import STRATEGIES, choice_inputs
    from kb.enrich.page_types import page_signals

    kinds, texts = bench.candidate_texts(sets, cache)  # fills the cache with any missing run
    stored = pickle.loads(cache.read_bytes())
    table = {}
    for dev in sets:
        for page in dev.pages:
            raw = bench.html_of(page)
            tree = trafilatura.load_html(raw)
            entry = stored[page.key]
            inputs = (choice_inputs(tree, page_signals(tree, page.url), entry["runs"].__getitem__,
                                    entry["blocks"].__getitem__)
                      if tree is not None else None)
            counts = {name: dev.counts(page, texts[page.key][name]) for name in STRATEGIES}
            try:
                counts[TRAFILATURA] = dev.counts(page, trafilatura.extract(raw, url=page.url) or "")
            except Exception:  # noqa: BLE001 - as bench_extraction scores it: a failure is an empty text
                counts[TRAFILATURA] = dev.counts(page, "")
            table[page.key] = {"set": dev.name, "kind": page.kind, "rule": kinds[page.key], "inputs": inputs,
                               "counts": counts, "fold": bench.fold_of(page)}
    names = sorted(next(row["inputs"] for row in table.values() if row["inputs"]))
    for row in table.values():  # a page that does not parse: no signal, kb's type "article"
        row["inputs"] = row["inputs"] or dict.fromkeys(names, 0.0)
    return table


class Data:
    def __init__(self, sets: list, table: dict, alternatives: tuple[str, ...] = ALTERNATIVES):
        import numpy as np

        self.sets, self.table, self.alternatives = sets, table, alternatives
        self.names = sorted(next(iter(table.values()))["inputs"])
        self.x = {key: np.array([row["inputs"][n] for n in self.names]) for key, row in table.items()}

    def keys(self, folds) -> list[str]:
        return [key for key, row in self.table.items() if row["fold"] in folds]

    def scores(self, choice: dict[str, str], folds) -> dict[str, float]:
        """F1 of both sets and of each annotated WCXB type on the pages of `folds`."""
        out = {}
        for dev in self.sets:
            pages = [p for p in dev.pages if self.table[p.key]["fold"] in folds]
            out[dev.name] = dev.f1([self.table[p.key]["counts"][choice[p.key]] for p in pages])["f1"]
            if dev.name == "wcxb":
                for kind in sorted({p.kind for p in pages}):
                    out[kind] = dev.f1([self.table[p.key]["counts"][choice[p.key]]
                                        for p in pages if p.kind == kind])["f1"]
        return out

    def gains(self, keys: list[str], base: dict[str, str], news_weight: float) -> dict[str, dict[str, float]]:
        """What each alternative adds to the sum of both sets' F1 on each
        page, over the page's base strategy. WCXB: the page's word F1 over
        the page count. News (F1 of counts summed over pages): the first-order
        change of F1 = 2TP / (2TP + FP + FN)."""
        news = [k for k in keys if self.table[k]["set"] == "news"]
        wcxb = [k for k in keys if self.table[k]["set"] == "wcxb"]
        tp, fp, fn = (sum(self.table[k]["counts"][base[k]][i] for k in news) for i in range(3))
        denominator = 2 * tp + fp + fn or 1
        f1 = 2 * tp / denominator
        out = {}
        for key in news:
            b = self.table[key]["counts"][base[key]]
            out[key] = {}
            for name in self.alternatives:
                c = self.table[key]["counts"][name]
                d_tp, d_fp, d_fn = c[0] - b[0], c[1] - b[1], c[2] - b[2]
                out[key][name] = news_weight * (2 * d_tp - f1 * (2 * d_tp + d_fp + d_fn)) / denominator
        for key in wcxb:
            b = self.table[key]["counts"][base[key]][2]
            out[key] = {name: (self.table[key]["counts"][name][2] - b) / len(wcxb) for name in self.alternatives}
        return out

    def fit(self, keys: list[str], base: dict[str, str], settings: dict) -> dict:
        """The model (page_choice's JSON form) fitted on `keys`."""
        import numpy as np
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        keys = [k for k in keys if self.table[k]["rule"] in settings["types"]]
        gains = self.gains(keys, base, settings["news_weight"])
        x = np.array([self.x[k] for k in keys])
        scaler = StandardScaler().fit(x)
        scaler.scale_[scaler.scale_ == 0] = 1.0
        z = scaler.transform(x)
        unit = statistics.mean(abs(g) for k in keys for g in gains[k].values()) or 1.0
        alternatives = {}
        for name in self.alternatives:
            gain = np.array([gains[k][name] for k in keys]) / unit
            if not (gain > 0).any() or (gain > 0).all():
                continue  # nothing to learn: never (or always) better on these pages
            fitted = LogisticRegression(C=settings["c"], max_iter=5000).fit(z, (gain > 0).astype(int),
                                                                           sample_weight=np.abs(gain) + 1e-9)
            alternatives[name] = {"coef": fitted.coef_[0].round(6).tolist(),
                                  "intercept": round(float(fitted.intercept_[0]), 6)}
        return {"types": list(settings["types"]), "features": self.names,
                "mean": scaler.mean_.round(6).tolist(), "scale": scaler.scale_.round(6).tolist(),
                "alternatives": alternatives, "margin": settings["margin"]}

    def predict(self, model: dict, keys: list[str], base: dict[str, str]) -> dict[str, str]:
        from kb.enrich.page_choice import choose

        return {k: choose(model, self.table[k]["rule"], base[k], self.table[k]["inputs"]) for k in keys}

    def select(self, folds: list[int], base: dict[str, str]) -> tuple[dict, dict]:
        """The settings with the best sum of both sets' F1 under a CV over
        `folds`, among those that keep the news F1 of the strategy per type."""
        floor = self.scores(base, folds)["news"]
        best = None
        for types, weight, c in itertools.product(TYPE_SETS, NEWS_WEIGHTS, REGULARIZATION):
            models = {f: self.fit(self.keys([g for g in folds if g != f]), base,
                                  {"types": types, "news_weight": weight, "c": c, "margin": 0.0}) for f in folds}
            for margin in MARGINS:
                choice = dict(base)
                for f in folds:
                    choice |= self.predict(models[f] | {"margin": margin}, self.keys([f]), base)
                s = self.scores(choice, folds)
                settings = {"types": types, "news_weight": weight, "c": c, "margin": margin}
                if s["news"] >= floor and (best is None or s["news"] + s["wcxb"] > best[0]):
                    best = (s["news"] + s["wcxb"], settings, s)
        if best is None:  # no setting keeps the news F1: the choice never changes a strategy
            return {"types": [], "news_weight": 1.0, "c": 0.1, "margin": 0.0}, {}
        return best[1], best[2]


def type_choice(data: Data, folds: list[int]) -> dict[str, str]:
    """Each page's strategy by its type, as bench_extraction tunes it on `folds`."""
    from kb.enrich.extract import STRATEGIES

    pages = {dev.name: [p for p in dev.pages if data.table[p.key]["fold"] in folds] for dev in data.sets}
    kinds = {k: row["rule"] for k, row in data.table.items()}
    per_type = bench.tune(data.sets, pages, kinds, {k: row["counts"] for k, row in data.table.items()},
                          list(STRATEGIES))
    return {k: per_type[kinds[k]] for k in data.table}


def nested_cv(data: Data) -> list[dict]:
    rows = []
    for fold in range(bench.FOLDS):
        started = time.process_time()
        train = [f for f in range(bench.FOLDS) if f != fold]
        base = type_choice(data, train)
        settings, _ = data.select(train, base)
        model = data.fit(data.keys(train), base, settings) if settings["types"] else None
        chosen = dict(base) | (data.predict(model, data.keys([fold]), base) if model else {})
        rows.append({"fold": fold, "settings": settings,
                     "switched": sum(chosen[k] != base[k] for k in data.keys([fold])),
                     "pages": len(data.keys([fold])),
                     "choice": data.scores(chosen, [fold]), "per type": data.scores(base, [fold]),
                     TRAFILATURA: data.scores(dict.fromkeys(data.table, TRAFILATURA), [fold])})
        print(f"fold {fold + 1}: {settings}, {rows[-1]['switched']} of {rows[-1]['pages']} pages switched, "
              f"{time.process_time() - started:.0f} s CPU", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    columns = ("choice", "per type", TRAFILATURA)
    print(f"\nnested {bench.FOLDS}-fold CV, F1 on the held-out folds, mean ± sd")
    print(f"{'':14}" + "".join(f"{c:>20}" for c in columns) + "   choice above trafilatura   choice above per type")
    for kind in rows[0]["choice"]:
        values = {c: [r[c][kind] for r in rows] for c in columns}
        above = sum(a > b for a, b in zip(values["choice"], values[TRAFILATURA]))
        above_type = sum(a > b for a, b in zip(values["choice"], values["per type"]))
        print(f"{kind:14}" + "".join(f"{bench.mean_spread(values[c]):>20}" for c in columns)
              + f"   in {above} of {bench.FOLDS} folds" + f"{'':13}in {above_type} of {bench.FOLDS}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="trafilatura's runs, as bench_extraction --cache")
    parser.add_argument("--table", type=Path, help="keep the page table in this file (pickle) for a second run")
    parser.add_argument("--write", action="store_true", help="fit on all pages and write the model file")
    parser.add_argument("--json", type=Path, help="also write the CV figures to this file")
    parser.add_argument("--types", help="only this set of types, split by commas, instead of TYPE_SETS")
    parser.add_argument("--alternatives", default=",".join(ALTERNATIVES),
                        help="the strategies that the choice may take, split by commas (to measure others)")
    args = parser.parse_args()
    sets = [bench.NewsSet(bench.NEWS_SET), bench.WcxbSet(bench.WCXB_SET)]
    started = time.process_time()
    if args.table and args.table.exists():
        table = pickle.loads(args.table.read_bytes())
    else:
        table = page_table(sets, args.cache)
        if args.table:
            args.table.write_bytes(pickle.dumps(table))
    print(f"page table: {len(table)} pages, {time.process_time() - started:.0f} s CPU, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    from kb.enrich.extract import STRATEGIES

    alternatives = tuple(args.alternatives.split(","))
    unknown = [name for name in alternatives if name not in STRATEGIES]
    if unknown:
        parser.error(f"--alternatives: {', '.join(unknown)} is not a strategy of kb.enrich.extract.STRATEGIES")
    data = Data(sets, table, alternatives)
    if args.types:
        global TYPE_SETS
        TYPE_SETS = (tuple(args.types.split(",")),)
    rows = nested_cv(data)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    if args.write:
        from kb.enrich.extract import TYPE_STRATEGY
        from kb.enrich.page_choice import MODEL_FILE

        every = list(range(bench.FOLDS))
        base = {k: TYPE_STRATEGY[row["rule"]] for k, row in table.items()}
        settings, fitted = data.select(every, base)
        model = data.fit(data.keys(every), base, settings) if settings["types"] else {
            "types": [], "features": data.names, "mean": [0.0] * len(data.names),
            "scale": [1.0] * len(data.names), "alternatives": {}, "margin": 0.0}
        model["settings"] = {"news_weight": settings["news_weight"], "c": settings["c"]}
        MODEL_FILE.write_text(json.dumps(model, indent=0) + "\n", encoding="utf-8")
        print(f"\nwrote {MODEL_FILE}: {settings}; CV of all pages with it: "
              + ", ".join(f"{k} {v:.4f}" for k, v in fitted.items()))
    print(f"load average at the end {os.getloadavg()[0]:.1f}; {time.process_time() - started:.0f} s CPU in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
