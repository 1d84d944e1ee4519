"""News and blog pages: kb's main text against trafilatura, by word-shingle F1.

The set is benchmarks/data/news_dev.jsonl.xz (benchmarks/make_news_dev.py
makes it; benchmarks/data/NEWS_DEV.md says where it comes from). The
score is the one of the public news benchmark and of
bench_extraction.py's synthetic pages: word 4-gram shingles of each page's
text against its main text, precision and recall per page, their means
over the pages, and F1 of both means (bench_extraction.scores()).

Rows: kb's `extract_html` (the code of `kb extract-file`), and trafilatura
2.x alone with its default settings and with favor_precision (text
output), as anchors. The held-out news benchmark of issue 58 ranks them
trafilatura favor_precision > trafilatura > kb; a set that predicts news
should rank them the same way.

Run:
    .venv/bin/python benchmarks/bench_news_dev.py [--only kb] [--every N] [--worst 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_extraction import page_counts, scores  # noqa: E402

from kb.enrich.extract import extract_html  # noqa: E402

SET = REPO / "benchmarks" / "data" / "news_dev.jsonl.xz"


def load_pages(path: Path = SET) -> list[dict]:
    with lzma.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def kb_text(html: str) -> str:
    return extract_html(html).text


def trafilatura_text(html: str, **options) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False, include_tables=True, **options) or ""


EXTRACTORS = {
    "kb": kb_text,
    "trafilatura": trafilatura_text,
    "trafilatura_precision": lambda html: trafilatura_text(html, favor_precision=True),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", type=Path, default=SET)
    parser.add_argument("--only", action="append", choices=sorted(EXTRACTORS), help="run only these rows")
    parser.add_argument("--every", type=int, default=1, help="score every Nth page only (a quick subset)")
    parser.add_argument("--worst", type=int, default=0, help="print kb's N worst pages by shingle F1")
    parser.add_argument("--json", type=Path, help="write each page's texts and counts here")
    args = parser.parse_args()
    pages = load_pages(args.set)[::args.every]
    names = args.only or list(EXTRACTORS)
    print(f"{len(pages)} pages of {args.set.name}; load average {os.getloadavg()[0]:.1f}")
    dump: dict[str, dict] = {page["key"]: {"truth": page["main_text"]} for page in pages}
    for name in names:
        counts, cpu = [], []
        for page in pages:
            start = time.process_time()
            text = EXTRACTORS[name](page["html"])
            cpu.append((time.process_time() - start) * 1000)
            counts.append(page_counts(page["main_text"], text))
            dump[page["key"]][name] = text
            dump[page["key"]][f"{name}_counts"] = counts[-1]
        result = scores(counts)
        print(f"{name:24s} F1 {result['f1']:.4f}  precision {result['precision']:.4f}  recall {result['recall']:.4f}"
              f"  CPU ms p50 {statistics.median(cpu):.1f}  p95 {sorted(cpu)[int(0.95 * (len(cpu) - 1))]:.1f}")
        if name == "kb" and args.worst:
            def page_f1(c):
                tp, fp, fn = c
                return 2 * tp / (2 * tp + fp + fn) if tp else 0.0
            ranked = sorted(zip(pages, counts), key=lambda pc: page_f1(pc[1]))
            for page, (tp, fp, fn) in ranked[:args.worst]:
                print(f"  {page['key']:28s} F1 {page_f1((tp, fp, fn)):.3f}  fp {fp:.3f}  fn {fn:.3f}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(dump, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
