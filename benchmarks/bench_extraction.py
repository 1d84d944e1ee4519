"""Extraction quality: kb's extract stage against trafilatura alone.

Two tables, from one run:

1. Real pages: the development set in ../shared/eval/extraction (400 saved
   pages in many languages, see its README). Its measure: snippets that the
   main text must hold and boilerplate snippets that it must not hold;
   precision, recall and F1 over all snippets. Rows: kb's `extract_html`
   (the documents stage and `kb extract-file`), kb's Telegram web parser
   (`source_parsers.extract_html`, Markdown), and trafilatura alone with its
   default options (as the set's score.py calls it) and with
   favor_precision. Time per page: p50 and p95; the extractors run on each
   page one after the other, so that load on the machine hits all alike.

2. Synthetic pages: SciFact abstracts (../shared/eval/scifact) inside five
   page templates, scored as the public article-extraction benchmarks do
   (word 4-gram shingles; precision and recall per page, averaged). The true
   body is known exactly, so the table shows lost body text clearly; it has
   no real web boilerplate, so it could not show the precision that kb lost
   on real pages (issue 15).

With --cv, the parameters of kb's rule (kb.enrich.extract: PRECISION_KEEPS,
LINK_SHARE, SHORT_BLOCK_CHARS) are checked by 5-fold cross-validation on the
development set: tuned on 4 folds, scored on the 5th.

Run:
    .venv/bin/python benchmarks/bench_extraction.py [--no-synthetic] [--cv] [--json]

It exits with status 2 when ../shared (or KB_SHARED_DIR) has no development
set, and with status 1 when kb scores below trafilatura alone on it.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import itertools
import json
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kb.enrich.extract import extract_html  # noqa: E402

SHARED = Path(os.environ.get("KB_SHARED_DIR", REPO.parent / "shared"))
DEFAULT_CORPUS = SHARED / "eval" / "scifact" / "corpus.jsonl"
DEV_SET = SHARED / "eval" / "extraction"


# --- the measure -------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


def shingles(text: str, n: int = 4) -> Counter:
    """Word n-grams of a text, counted. A text shorter than n words is one
    shingle, so a short body still counts."""
    words = _WORD.findall(text or "")
    if not words:
        return Counter()
    return Counter(tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1)))


def page_counts(true: str, pred: str) -> tuple[float, float, float]:
    """(tp, fp, fn) of one page, normalized to sum to 1."""
    t, p = shingles(true), shingles(pred)
    tp = sum((t & p).values())
    fp = sum((p - t).values())
    fn = sum((t - p).values())
    total = tp + fp + fn
    return (tp / total, fp / total, fn / total) if total else (0.0, 0.0, 0.0)


def scores(counts: list[tuple[float, float, float]]) -> dict[str, float]:
    def precision(tp, fp, fn):
        if fp == fn == 0:
            return 1.0
        return tp / (tp + fp) if tp + fp else 0.0

    def recall(tp, fp, fn):
        if fp == fn == 0:
            return 1.0
        return tp / (tp + fn) if tp + fn else 0.0

    # As in the public benchmark: a page with no predicted shingle has no
    # precision (it counts in recall only), and the reverse.
    p = statistics.mean(precision(*c) for c in counts if c[0] + c[1] > 0)
    r = statistics.mean(recall(*c) for c in counts if c[0] + c[2] > 0)
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    exact = sum(1 for c in counts if c[1] == c[2] == 0) / len(counts)
    return {"f1": f1, "precision": p, "recall": r, "exact": exact}


# --- the pages -----------------------------------------------------------------------

@dataclass
class Abstract:
    title: str
    sentences: list[str]


@dataclass
class Page:
    html: str
    body: str  # the true article body: what an extractor should return
    template: str


def load_abstracts(path: Path) -> list[Abstract]:
    abstracts = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            item = json.loads(line)
            text = " ".join(item.get("text", "").split())
            sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", text) if s]
            if len(text.split()) >= 120 and len(sentences) >= 4:
                abstracts.append(Abstract(item["title"].strip(), sentences))
    return abstracts


class Builder:
    """Makes one page from an article and random boilerplate."""

    def __init__(self, abstracts: list[Abstract], rng: random.Random):
        self.abstracts = abstracts
        self.rng = rng

    # Pieces of natural-language boilerplate, from other abstracts.
    def other(self) -> Abstract:
        return self.rng.choice(self.abstracts)

    def teaser(self, words: int = 25) -> str:
        sentence = " ".join(self.other().sentences[0].split()[:words])
        return sentence.rstrip(".,;") + "..."

    def comment_text(self) -> str:
        return " ".join(self.rng.sample(self.other().sentences, k=2))

    def paragraphs(self, article: Abstract) -> list[str]:
        sentences = list(article.sentences)
        out, i = [], 0
        while i < len(sentences):
            size = self.rng.randint(2, 4)
            out.append(" ".join(sentences[i:i + size]))
            i += size
        return out

    def body_blocks(self, paragraphs: list[str], *, tag: str = "p") -> tuple[str, str]:
        """HTML of the body and its true text. Sometimes one paragraph is a list
        or a quote, as in real articles."""
        parts, truth = [], []
        for n, p in enumerate(paragraphs):
            form = self.rng.random()
            if n > 0 and form < 0.12:
                items = re.split(r"(?<=[.!?])\s+", p)
                parts.append("<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in items) + "</ul>")
            elif n > 0 and form < 0.2:
                parts.append(f"<blockquote><p>{html.escape(p)}</p></blockquote>")
            elif tag == "br":
                parts.append(f"{html.escape(p)}<br><br>")
            else:
                parts.append(f"<{tag}>{html.escape(p)}</{tag}>")
            truth.append(p)
        return "\n".join(parts), "\n\n".join(truth)

    def nav(self) -> str:
        sections = self.rng.sample(
            ["News", "World", "Science", "Health", "Technology", "Opinion", "Culture", "Sport", "Business",
             "Climate", "Education", "Podcasts", "Video", "Newsletters", "Events", "Jobs"], k=10)
        return "<nav class='site-nav'><ul>" + "".join(
            f"<li><a href='/{s.lower()}'>{s}</a></li>" for s in sections) + "</ul></nav>"

    def cookie_banner(self) -> str:
        return ("<div id='cookie-consent' class='banner'><p>We and our partners use cookies and similar "
                "technologies to store and access information on your device, to measure how you use our "
                "site and to show you personalised content and advertising. You can accept all cookies, "
                "reject them, or choose which ones we may use in the settings.</p>"
                "<button>Accept all</button> <button>Reject</button> <a href='/privacy'>Settings</a></div>")

    def related(self, count: int = 4) -> str:
        items = "".join(
            f"<li><a href='/story/{self.rng.randint(1000, 9999)}'><h4>{html.escape(self.other().title)}</h4>"
            f"<p>{html.escape(self.teaser())}</p></a></li>"
            for _ in range(count))
        return f"<section class='related'><h3>Related stories</h3><ul>{items}</ul></section>"

    def comments(self, count: int) -> str:
        names = ["Maria K.", "dr_jones", "Sam", "P. Okafor", "lena.w", "Tom R."]
        items = "".join(
            f"<li class='comment'><div class='comment-author'>{self.rng.choice(names)}</div>"
            f"<div class='comment-body'><p>{html.escape(self.comment_text())}</p></div>"
            f"<a class='reply' href='#'>Reply</a></li>"
            for _ in range(count))
        return f"<section id='comments' class='comments'><h3>{count} comments</h3><ol>{items}</ol></section>"

    def footer(self) -> str:
        return ("<footer class='site-footer'><div class='links'><a href='/about'>About us</a> "
                "<a href='/contact'>Contact</a> <a href='/careers'>Careers</a> <a href='/privacy'>Privacy policy</a> "
                "<a href='/terms'>Terms of use</a></div><p>Copyright 2024 The Daily Review Media Group. All rights "
                "reserved. No part of this site may be reproduced without our written permission. Registered "
                "office: 12 Harbour Street, Port City.</p></footer>")

    def newsletter(self) -> str:
        return ("<div class='newsletter'><h4>Get the morning briefing</h4><p>The most important science and "
                "health stories of the day, in your inbox every morning before eight. Free, and you can "
                "unsubscribe at any time.</p><input type='email' placeholder='Email'><button>Sign up</button></div>")

    def byline(self) -> str:
        return (f"<div class='byline'>By <a href='/authors/{self.rng.randint(1, 99)}'>Staff Reporter</a> · "
                f"{self.rng.randint(1, 28)} March 2024 · {self.rng.randint(3, 12)} min read</div>")

    def share(self) -> str:
        return "<div class='share'><a href='#'>Share</a> <a href='#'>Post</a> <a href='#'>Email</a> <a href='#'>Print</a></div>"

    def ad(self) -> str:
        return ("<div class='ad-slot'><span>Advertisement</span><p>Continue reading below</p>"
                "<iframe src='/ads/slot'></iframe></div>")

    def author_bio(self) -> str:
        return (f"<div class='author-bio'><h4>About the author</h4><p>{html.escape(self.comment_text())}</p></div>")

    # The templates.
    def news(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a))
        parts = blocks.split("\n")
        if len(parts) > 2:  # an ad between paragraphs, as news sites do
            parts.insert(len(parts) // 2, self.ad())
        doc = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>{html.escape(a.title)} | The Daily Review</title>
<meta name="description" content="{html.escape(self.teaser())}">
<script>window.dataLayer = window.dataLayer || []; function gtag(){{dataLayer.push(arguments);}}</script>
<style>.site-nav li{{display:inline}}</style></head>
<body>{self.cookie_banner()}
<header class="masthead"><a class="logo" href="/">The Daily Review</a>{self.nav()}</header>
<main><article class="story">
<header><h1>{html.escape(a.title)}</h1>{self.byline()}{self.share()}</header>
<div class="story-body">{''.join(parts)}</div>
{self.author_bio() if self.rng.random() < 0.5 else ''}
</article>
{self.related()}
{self.comments(self.rng.randint(0, 5))}
</main>
<aside class="sidebar">{self.newsletter()}<h3>Most read</h3><ol>{''.join(f"<li><a href='/m/{i}'>{html.escape(self.other().title)}</a></li>" for i in range(5))}</ol></aside>
{self.footer()}</body></html>"""
        return Page(doc, truth, "news")

    def blog(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a))
        tags = "".join(f"<a rel='tag' href='/tag/{t}'>{t}</a> " for t in self.rng.sample(
            ["biology", "medicine", "papers", "notes", "reading", "genetics", "methods"], k=3))
        doc = f"""<!DOCTYPE html><html><head><title>{html.escape(a.title)} – Lab Notebook</title></head>
<body class="single-post"><div id="page" class="site">
<header id="masthead"><p class="site-title"><a href="/">Lab Notebook</a></p>
<p class="site-description">Notes on papers I read, and what I learned from them</p>{self.nav()}</header>
<div id="content"><div id="primary" class="content-area">
<div class="post type-post hentry">
<h2 class="entry-title">{html.escape(a.title)}</h2>
<div class="entry-meta">Posted on March {self.rng.randint(1, 28)}, 2024 by admin</div>
<div class="entry-content">{blocks}</div>
<div class="entry-footer">Tags: {tags}</div>
</div>
<nav class="post-navigation"><a href="/prev">← {html.escape(self.other().title)}</a>
<a href="/next">{html.escape(self.other().title)} →</a></nav>
{self.comments(self.rng.randint(1, 6))}
</div>
<div id="secondary" class="widget-area">
<section class="widget"><h3>About me</h3><p>{html.escape(self.comment_text())}</p></section>
<section class="widget"><h3>Recent posts</h3><ul>{''.join(f"<li><a href='/p/{i}'>{html.escape(self.other().title)}</a></li>" for i in range(5))}</ul></section>
<section class="widget"><h3>Archives</h3><ul><li>March 2024</li><li>February 2024</li><li>January 2024</li></ul></section>
</div></div>
{self.footer()}</div></body></html>"""
        return Page(doc, truth, "blog")

    def docs(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a))
        toc = "".join(f"<li><a href='/docs/{i}'>{html.escape(' '.join(self.other().title.split()[:5]))}</a></li>"
                      for i in range(12))
        doc = f"""<html><head><title>{html.escape(a.title)}</title></head><body>
<div class="topbar"><a href="/">Research Wiki</a> <input placeholder="Search the wiki"> <a href="/login">Log in</a></div>
<div class="layout"><div class="toc"><h3>Contents</h3><ul>{toc}</ul></div>
<div class="page"><div class="breadcrumb"><a href="/">Home</a> › <a href="/topics">Topics</a> › {html.escape(a.title[:40])}</div>
<div id="content"><h1>{html.escape(a.title)}</h1>{blocks}</div>
<div class="cite-box"><h4>Cite this page</h4><p>Research Wiki contributors. {html.escape(a.title)}. Retrieved 2024.</p></div>
<div class="page-meta">This page was last edited on 3 March 2024. Content is available under a free licence unless
otherwise noted.</div></div></div>
{self.footer()}</body></html>"""
        return Page(doc, truth, "docs")

    def table_layout(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a), tag="br")
        doc = f"""<html><head><title>{html.escape(a.title)}</title></head><body bgcolor="#ffffff">
<table width="100%" border="0"><tr><td colspan="2"><font size="5">Department of Life Sciences</font>
<br><a href="/">Home</a> | <a href="/people">People</a> | <a href="/research">Research</a> | <a href="/teaching">Teaching</a></td></tr>
<tr><td width="180" valign="top"><b>Menu</b><br><a href="/seminars">Seminars</a><br><a href="/pubs">Publications</a><br>
<a href="/jobs">Open positions</a><br><a href="/contact">Contact</a><br><br><b>News</b><br><font size="2">{html.escape(self.teaser(18))}</font></td>
<td valign="top"><font size="4"><b>{html.escape(a.title)}</b></font><br><br>{blocks}</td></tr>
<tr><td colspan="2"><font size="1">Last updated 2019. Webmaster: web@lifesci.example. Best viewed with any browser.</font></td></tr>
</table></body></html>"""
        return Page(doc, truth, "table_layout")

    def div_soup(self, a: Abstract) -> Page:
        paragraphs = self.paragraphs(a)
        cls = lambda: "c" + "".join(self.rng.choices("abcdefghijklmnop0123456789", k=6))  # noqa: E731
        parts, truth = [], []
        for n, p in enumerate(paragraphs):
            parts.append(f"<div class='{cls()}'><div class='{cls()}'>{html.escape(p)}</div></div>")
            truth.append(p)
            if n == 0 and len(paragraphs) > 2:
                parts.append(f"<div class='{cls()}'><a href='/x'>Read more: {html.escape(self.other().title)}</a></div>")
        doc = f"""<!DOCTYPE html><html><head><title>{html.escape(a.title)}</title>
<script src="/static/app.3f9a1.js" defer></script></head><body>
<div id="__next"><div class="{cls()}"><div class="{cls()}">{self.nav()}</div></div>
{self.cookie_banner()}
<div class="{cls()}"><div class="{cls()}"><div class="{cls()}"><span class="{cls()}">{html.escape(a.title)}</span></div>
<div class="{cls()}">{''.join(parts)}</div></div>
<div class="{cls()}">{self.related(3)}</div></div>
<div class="{cls()}">{self.newsletter()}</div>
{self.footer()}</div></body></html>"""
        return Page(doc, "\n\n".join(truth), "div_soup")

    def build(self, article: Abstract) -> Page:
        template = self.rng.choice([self.news, self.blog, self.docs, self.table_layout, self.div_soup])
        return template(article)


def make_pages(abstracts: list[Abstract], count: int, seed: int) -> list[Page]:
    rng = random.Random(seed)
    builder = Builder(abstracts, rng)
    articles = rng.sample(abstracts, k=min(count, len(abstracts)))
    return [builder.build(a) for a in articles]


# --- the synthetic pages: extractors and run ------------------------------------------

def ours(page_html: str) -> str:
    """What the documents stage stores as the text of a page."""
    return extract_html(page_html, "https://site.example/article").text


def trafilatura_alone(page_html: str) -> str:
    """trafilatura called as the public benchmark calls it."""
    import trafilatura

    return trafilatura.extract(page_html, include_comments=False) or ""


EXTRACTORS: dict[str, Callable[[str], str]] = {"kb extract_html": ours, "trafilatura": trafilatura_alone}


def evaluate(pages: list[Page]) -> dict[str, dict]:
    results = {}
    for name, extractor in EXTRACTORS.items():
        extractor(pages[0].html)  # warm-up: imports and caches stay out of the timing
        counts, by_template, seconds = [], {}, []
        for page in pages:
            started = time.perf_counter()
            predicted = extractor(page.html)
            seconds.append(time.perf_counter() - started)
            c = page_counts(page.body, predicted)
            counts.append(c)
            by_template.setdefault(page.template, []).append(c)
        results[name] = scores(counts) | {
            "ms_per_page_p50": 1000 * statistics.median(seconds),
            "ms_per_page_p95": 1000 * percentile(seconds, 95),
            "by_template_f1": {t: round(scores(cs)["f1"], 4) for t, cs in sorted(by_template.items())},
        }
    return results


def percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# --- the development set of real pages ------------------------------------------------------

def load_dev_set(folder: Path):
    """The set's own score.py, so that the figures are the ones its README
    gives. Raises FileNotFoundError when the folder is absent."""
    script = folder / "score.py"
    if not script.exists():
        raise FileNotFoundError(f"{folder}: no development set here (no score.py)")
    spec = importlib.util.spec_from_file_location("extraction_dev_score", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dev_extractors() -> dict[str, Callable[[bytes, str], str]]:
    import trafilatura

    from kb_assets import source_parsers

    return {
        "kb extract_html": lambda page, url: extract_html(page, url).text,
        "kb Telegram web": lambda page, url: source_parsers.extract_html(page, url)[0],
        "trafilatura default": lambda page, url: trafilatura.extract(page, url=url) or "",
        "trafilatura precision": lambda page, url: trafilatura.extract(page, url=url, favor_precision=True) or "",
    }


def evaluate_dev(dev, limit: int | None = None) -> tuple[dict[str, dict], dict[str, dict[str, str]]]:
    """(scores and times of each extractor, its text of each page)."""
    extractors = dev_extractors()
    keys = list(dev.SNIPPETS)[:limit]
    predictions = {name: {} for name in extractors}
    seconds = {name: [] for name in extractors}
    cpu_seconds = {name: [] for name in extractors}
    for name, extractor in extractors.items():  # warm-up: imports and caches stay out of the timing
        extractor(dev.html_of(keys[0]), dev.SNIPPETS[keys[0]]["url"].strip())
    for key in keys:
        page, url = dev.html_of(key), dev.SNIPPETS[key]["url"].strip()
        for name, extractor in extractors.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            predictions[name][key] = extractor(page, url)
            cpu_seconds[name].append(time.process_time() - cpu_started)
            seconds[name].append(time.perf_counter() - started)
    results = {}
    for name in extractors:
        scored = snippet_scores(dev, predictions[name], keys)
        results[name] = scored | {"ms_per_page_p50": 1000 * statistics.median(seconds[name]),
                                  "ms_per_page_p95": 1000 * percentile(seconds[name], 95),
                                  "cpu_ms_per_page_p50": 1000 * statistics.median(cpu_seconds[name]),
                                  "cpu_ms_per_page_p95": 1000 * percentile(cpu_seconds[name], 95)}
    return results, predictions


def snippet_counts(dev, key: str, text: str) -> tuple[int, int, int]:
    """(tp, fp, fn) of one page, as the set's score.py counts them."""
    text = dev.norm(text)
    snippets = dev.SNIPPETS[key]
    tp = sum(1 for s in snippets["with"] if dev.norm(s) in text)
    fp = sum(1 for s in snippets["without"] if dev.norm(s) in text)
    return tp, fp, len(snippets["with"]) - tp


def snippet_scores(dev, predictions: dict[str, str], keys: list[str]) -> dict[str, float]:
    tp = fp = fn = 0
    for key in keys:
        a, b, c = snippet_counts(dev, key, predictions.get(key, ""))
        tp, fp, fn = tp + a, fp + b, fn + c
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0, "pages": len(keys)}


# --- cross-validation of kb's rule -------------------------------------------------------------

# The grid: the values of each parameter of kb.enrich.extract.main_content
# that the folds choose from. inf switches a step off.
GRID = {
    "precision_keeps": [0.9, 0.95, 0.98, 1.0, float("inf")],
    "link_share": [0.5, 0.7, 0.9, float("inf")],
    "short_chars": [100, 200, 400],
}
FOLDS = 5


def trafilatura_fragments(dev, keys: list[str]) -> dict[str, dict[str, str]]:
    """trafilatura's fragment of each page for each mode, as extract_html makes
    them, kept so that every point of the grid is scored without running
    trafilatura again."""
    from kb.enrich.extract import trafilatura_fragment

    fragments = {}
    for key in keys:
        page, url = dev.html_of(key), dev.SNIPPETS[key]["url"].strip()
        fragments[key] = {mode: trafilatura_fragment(page, url, mode) for mode in ("default", "precision", "recall")}
    return fragments


def cross_validate(dev, baselines: dict[str, dict[str, str]]) -> dict:
    """Tune the grid on 4 folds, score on the 5th. Folds by page key, which
    is a hash: a fixed split that follows no site or language."""
    from kb.enrich.extract import html_to_text, main_content

    keys = list(dev.SNIPPETS)
    fragments = trafilatura_fragments(dev, keys)
    points = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    counts = {}  # (point index, key) -> (tp, fp, fn)
    for n, point in enumerate(points):
        for key in keys:
            text = html_to_text(main_content(lambda mode, key=key: fragments[key][mode], **point))
            counts[n, key] = snippet_counts(dev, key, text)

    def f1_of(n: int, subset: list[str]) -> float:
        tp = sum(counts[n, k][0] for k in subset)
        fp = sum(counts[n, k][1] for k in subset)
        fn = sum(counts[n, k][2] for k in subset)
        p, r = (tp / (tp + fp) if tp + fp else 0.0), (tp / (tp + fn) if tp + fn else 0.0)
        return 2 * p * r / (p + r) if p + r else 0.0

    folds = []
    for fold in range(FOLDS):
        test = [k for k in keys if int(k, 16) % FOLDS == fold]
        train = [k for k in keys if int(k, 16) % FOLDS != fold]
        best = max(range(len(points)), key=lambda n: f1_of(n, train))
        folds.append({
            "fold": fold + 1, "pages": len(test), "chosen": points[best], "kb_f1": f1_of(best, test),
            **{f"{name}_f1": snippet_scores(dev, preds, test)["f1"] for name, preds in baselines.items()},
        })
    return {"folds": folds, "whole_set_best": points[max(range(len(points)), key=lambda n: f1_of(n, keys))]}


def mean_spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


# --- main ------------------------------------------------------------------------------------------

def print_dev(results: dict[str, dict]) -> None:
    pages = next(iter(results.values()))["pages"]
    print(f"Real pages: {pages} pages of {DEV_SET} (snippet precision/recall, as its score.py)")
    # CPU time is the figure to compare on a shared machine; wall time is
    # what a user waits, and grows with the load of other work.
    print(f"{'extractor':<22} {'prec':>6} {'recall':>6} {'F1':>6} {'CPU ms p50':>10} {'p95':>7} "
          f"{'wall ms p50':>11} {'p95':>7}")
    for name, r in results.items():
        print(f"{name:<22} {r['precision']:6.4f} {r['recall']:6.4f} {r['f1']:6.4f} "
              f"{r['cpu_ms_per_page_p50']:10.1f} {r['cpu_ms_per_page_p95']:7.1f} "
              f"{r['ms_per_page_p50']:11.1f} {r['ms_per_page_p95']:7.1f}")


def print_synthetic(pages: list[Page], seed: int, results: dict[str, dict]) -> None:
    print(f"Synthetic pages: {len(pages)} pages, seed {seed}, templates: "
          f"{dict(sorted(Counter(p.template for p in pages).items()))} (shingle F1, per page)")
    print(f"{'extractor':<22} {'prec':>6} {'recall':>6} {'F1':>6} {'exact':>6} {'p50 ms':>7} {'p95 ms':>7}")
    for name, r in results.items():
        print(f"{name:<22} {r['precision']:6.4f} {r['recall']:6.4f} {r['f1']:6.4f} {r['exact']:6.3f} "
              f"{r['ms_per_page_p50']:7.1f} {r['ms_per_page_p95']:7.1f}")
    for name, r in results.items():
        print(f"  {name}: F1 by template {r['by_template_f1']}")


def print_cv(cv: dict) -> None:
    print(f"5-fold cross-validation of kb's rule (grid {GRID})")
    names = [k.removesuffix("_f1") for k in cv["folds"][0] if k.endswith("_f1") and k != "kb_f1"]
    print(f"{'fold':>4} {'pages':>5} {'kb F1':>7} " + " ".join(f"{n + ' F1':>26}" for n in names) + "  chosen")
    for f in cv["folds"]:
        print(f"{f['fold']:>4} {f['pages']:>5} {f['kb_f1']:7.4f} "
              + " ".join(f"{f[n + '_f1']:26.4f}" for n in names) + f"  {f['chosen']}")
    print(f"mean ± sd  kb {mean_spread([f['kb_f1'] for f in cv['folds']])}; "
          + "; ".join(f"{n} {mean_spread([f[n + '_f1'] for f in cv['folds']])}" for n in names))
    for n in names:
        gains = [f["kb_f1"] - f[n + "_f1"] for f in cv["folds"]]
        print(f"kb minus {n}: {mean_spread(gains)} (above in {sum(g > 0 for g in gains)} of {FOLDS} folds)")
    print(f"best point on the whole set: {cv['whole_set_best']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev-set", type=Path, default=DEV_SET, help="the folder of the development set")
    parser.add_argument("--limit", type=int, help="only the first N pages of the development set (a quick look)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="SciFact corpus.jsonl")
    parser.add_argument("--pages", type=int, default=200, help="synthetic pages")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-synthetic", action="store_true", help="skip the synthetic table")
    parser.add_argument("--cv", action="store_true", help="cross-validate kb's rule on the development set")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--save-pages", type=Path, help="write the synthetic pages and their true bodies to this folder")
    args = parser.parse_args()
    try:
        dev = load_dev_set(args.dev_set)
    except FileNotFoundError as exc:
        print(f"{exc}. The development set lives in ../shared/eval/extraction next to the repository; "
              "give --dev-set or set KB_SHARED_DIR.", file=sys.stderr)
        return 2
    out: dict = {}
    out["dev"], predictions = evaluate_dev(dev, args.limit)
    if not args.json:
        print_dev(out["dev"])
    if not args.no_synthetic:
        if not args.corpus.exists():
            print(f"{args.corpus}: no such file, so no synthetic table. Give --corpus.", file=sys.stderr)
        else:
            pages = make_pages(load_abstracts(args.corpus), args.pages, args.seed)
            if args.save_pages:
                args.save_pages.mkdir(parents=True, exist_ok=True)
                for n, page in enumerate(pages):
                    (args.save_pages / f"{n:04d}-{page.template}.html").write_text(page.html, encoding="utf-8")
                    (args.save_pages / f"{n:04d}-{page.template}.txt").write_text(page.body, encoding="utf-8")
            out["synthetic"] = evaluate(pages)
            if not args.json:
                print()
                print_synthetic(pages, args.seed, out["synthetic"])
    if args.cv:
        if args.limit:
            print("--cv needs the whole development set: leave out --limit.", file=sys.stderr)
            return 2
        baselines = {name: predictions[name] for name in ("trafilatura default", "trafilatura precision")}
        out["cv"] = cross_validate(dev, baselines)
        if not args.json:
            print()
            print_cv(out["cv"])
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    kb, alone = out["dev"]["kb extract_html"]["f1"], out["dev"]["trafilatura default"]["f1"]
    if kb < alone:
        print(f"FAIL: kb's extract stage scores below trafilatura alone on real pages ({kb:.4f} < {alone:.4f}).",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
