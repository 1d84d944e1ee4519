"""Train kb's page-type classifier (kb.enrich.page_types.MODEL_FILE).

A multinomial logistic regression over kb.enrich.page_types.page_features(),
fitted on the annotated page types of the WCXB development split
(../shared/eval/wcxb-dev). It prints the accuracy on held-out folds (the
5 folds of benchmarks/bench_extraction.py), then fits on all pages and
writes the coefficients as JSON. scikit-learn fits the model; kb reads only
the JSON (kb.enrich.page_types.predict), so kb does not need scikit-learn.

Run:
    .venv/bin/python benchmarks/train_page_types.py [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_extraction as bench  # noqa: E402

# The strength of the regularization (smaller is stronger). 0.1 gave the
# best held-out accuracy of 0.03, 0.1, 0.3, 1 and 3 (0.828 against 0.816 to
# 0.826); classes are not reweighted: with balanced weights, articles (half
# of the pages) lose more than the small types gain (0.784).
C = 0.1


def fit(features: list[dict[str, float]], labels: list[str], c: float = C) -> dict:
    """The model as plain numbers: feature names, their mean and scale, and
    the coefficients and intercept of each class."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    names = sorted(features[0])
    x = np.array([[f[name] for name in names] for f in features])
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=c, max_iter=5000).fit(scaler.transform(x), labels)
    return {"features": names, "mean": scaler.mean_.round(6).tolist(), "scale": scaler.scale_.round(6).tolist(),
            "classes": [str(k) for k in model.classes_], "coef": model.coef_.round(6).tolist(),
            "intercept": model.intercept_.round(6).tolist()}


def held_out_types(features: dict[str, dict[str, float]], labels: dict[str, str], fold_of) -> dict[str, str]:
    """Each labelled page's type by a model fitted on the other 4 folds."""
    from kb.enrich.page_types import predict

    out = {}
    for fold in range(bench.FOLDS):
        train = [key for key in labels if fold_of(key) != fold]
        model = fit([features[k] for k in train], [labels[k] for k in train])
        out |= {key: str(predict(model, features[key])) for key in labels if fold_of(key) == fold}
    return out


def wcxb_features(wcxb) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    import trafilatura

    from kb.enrich.page_types import page_features

    features, labels = {}, {}
    for page in wcxb.pages:
        tree = trafilatura.load_html(bench.html_of(page))
        if tree is not None:
            features[page.key], labels[page.key] = page_features(tree, page.url), page.kind
    return features, labels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wcxb-set", type=Path, default=bench.WCXB_SET)
    parser.add_argument("--write", action="store_true", help="write the model fitted on all pages")
    args = parser.parse_args()
    from kb.enrich.page_types import MODEL_FILE

    wcxb = bench.WcxbSet(args.wcxb_set)
    folds = {page.key: bench.fold_of(page) for page in wcxb.pages}
    features, labels = wcxb_features(wcxb)
    predicted = held_out_types(features, labels, folds.__getitem__)
    right = Counter(labels[k] for k in labels if predicted[k] == labels[k])
    total = Counter(labels.values())
    print(f"held-out accuracy {sum(right.values()) / len(labels):.3f} on {len(labels)} pages; per type: "
          + ", ".join(f"{kind} {right[kind]}/{n}" for kind, n in sorted(total.items())))
    if args.write:
        model = fit(list(features.values()), list(labels.values()))
        model["trained_on"] = f"WCXB development split, {len(labels)} pages, C={C}"
        MODEL_FILE.write_text(json.dumps(model, indent=0) + "\n", encoding="utf-8")
        print(f"wrote {MODEL_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
