"""Make benchmarks/data/news_dev.jsonl.xz: a development set of real news and
blog pages with their whole main text (issue 58).

Source: the test pages of Mozilla's Readability (github.com/mozilla/readability,
test/test-pages/<name>/source.html and expected.html; Apache License 2.0,
benchmarks/data/NEWS_DEV.md has the licence note). Each page is a real page
that a person saved; expected.html is the main text that Readability gives
and that its developers checked by hand.

What this script keeps (the rules, not a choice per page):
- pages of at least MIN_SOURCE_BYTES bytes (the smaller ones are made-up
  test cases of one HTML feature);
- not the pages in NOT_NEWS: reference pages, product pages, fiction and
  indexes. The set is for news and blog articles.
The main text of a page is the text of expected.html without figure
captions (<figcaption>): Readability keeps them, the news benchmarks count
them as boilerplate.

Run (the mirror is a bare git directory of the repository):
    .venv/bin/python benchmarks/make_news_dev.py --readability /work/.mirror/mozilla+readability/repo
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
from pathlib import Path

import lxml.html

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kb.enrich.extract import html_to_text  # noqa: E402

OUT = REPO / "benchmarks" / "data" / "news_dev.jsonl.xz"
# The commit of mozilla/readability that the set comes from.
COMMIT = "ab4027a8b37669745016869a37a504727992b2ba"
MIN_SOURCE_BYTES = 9000
NOT_NEWS = frozenset({
    # reference and documentation pages
    "wikipedia", "wikipedia-2", "wikipedia-3", "wikipedia-4", "google-sre-book-1", "ietf-1", "mercurial",
    "mathjax", "daringfireball-1", "table-style-attributes", "data-url-image",
    # product pages and indexes
    "mozilla-1", "mozilla-2", "yahoo-2", "nytimes-5",
    # fiction and fables
    "archive-of-our-own", "royal-road", "hukumusume", "clean-links",
})


def git_show(gitdir: Path, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(gitdir), "show", f"{COMMIT}:{path}"],
                          check=True, capture_output=True).stdout


def main_text(expected: bytes) -> str:
    root = lxml.html.fragment_fromstring(expected.decode("utf-8"), create_parent="div")
    for caption in list(root.iter("figcaption")):
        caption.drop_tree()
    return html_to_text(lxml.html.tostring(root, encoding="unicode"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readability", type=Path, required=True, help="git directory of mozilla/readability")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    listing = subprocess.run(["git", "--git-dir", str(args.readability), "ls-tree", "-r", "-l", COMMIT,
                              "test/test-pages"], check=True, capture_output=True, text=True).stdout
    sizes = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        if path.endswith("/source.html"):
            sizes[path.split("/")[2]] = int(meta.split()[3])
    names = sorted(name for name, size in sizes.items() if size >= MIN_SOURCE_BYTES and name not in NOT_NEWS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(args.out, "wt", encoding="utf-8", preset=9) as out:
        for name in names:
            base = f"test/test-pages/{name}"
            meta = json.loads(git_show(args.readability, f"{base}/expected-metadata.json"))
            record = {
                "key": name,
                "source": f"mozilla/readability@{COMMIT[:12]}:{base}",
                "title": meta.get("title"),
                "lang": meta.get("lang"),
                "html": git_show(args.readability, f"{base}/source.html").decode("utf-8", "replace"),
                "main_text": main_text(git_show(args.readability, f"{base}/expected.html")),
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{len(names)} pages -> {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
