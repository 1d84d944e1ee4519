"""The repeated blocks of a page: the posts of a thread, the items of a list.

trafilatura looks for one body of text. On a forum thread the content is a
series of posts, and on a category page or a list it is a series of items;
trafilatura then keeps the first post, or drops the items as link blocks.
These pages say what their repeated parts are by their markup: the site's
software writes each post (each item) with the same tag and class. This
module finds the largest such series.

The rule: elements with the same tag and the same class attribute form a
series when there are at least MIN_REPEATS of them, none inside another of
the series. The series with the most words wins. The words of links count
only by `link_weight`: a menu is a series of links, a post is prose.
Words under navigation, scripts, forms' controls and similar parts count
nothing: they are never content.
"""

from __future__ import annotations

import copy
import re

import lxml.html

MIN_REPEATS = 3
# Series larger than this are rows of a data table or the cells of a grid
# of icons; the cost of judging them grows with their size.
MAX_REPEATS = 400
# Elements whose words never count: navigation and the code of the page.
_NO_CONTENT = frozenset({"script", "style", "noscript", "template", "svg", "nav", "select", "button", "iframe",
                         "head", "title", "option", "textarea"})


def word_counts(root: lxml.html.HtmlElement) -> tuple[dict, dict]:
    """(words, link words) under every element, in one pass over the tree
    from the leaves up."""
    words: dict = {}
    link_words: dict = {}
    for element in reversed(list(root.iter())):
        tag = element.tag if isinstance(element.tag, str) else ""
        if tag in _NO_CONTENT:
            words[element] = link_words[element] = 0
            continue
        own = len((element.text or "").split()) if tag else 0
        total = own + sum(words[c] + len((c.tail or "").split()) for c in element)
        words[element] = total
        if tag == "a":
            link_words[element] = total
        else:
            link_words[element] = sum(link_words[c] for c in element)
    return words, link_words


def best_series(root: lxml.html.HtmlElement, link_weight: float) -> list[lxml.html.HtmlElement]:
    """The series of repeated blocks with the most words (links weigh
    link_weight), or [] when the page has no series."""
    return best_series_by_weight(root, (link_weight,))[link_weight]


def best_series_by_weight(root: lxml.html.HtmlElement,
                          link_weights: tuple[float, ...]) -> dict[float, list[lxml.html.HtmlElement]]:
    """best_series() for each link weight, from one pass over the tree: the
    walk costs about 4 ms a page (p50), the scores of the series little."""
    words, link_words = word_counts(root)
    groups: dict[tuple[str, str], list] = {}
    for element in root.iter():
        if not isinstance(element.tag, str) or not words.get(element):
            continue
        marks = element.get("class")
        if marks:
            groups.setdefault((element.tag, " ".join(marks.split())), []).append(element)
    candidates = []
    for members in groups.values():
        if not MIN_REPEATS <= len(members) <= MAX_REPEATS:
            continue
        inside = set(members)
        members = [m for m in members if not any(a in inside for a in m.iterancestors())]
        if len(members) >= MIN_REPEATS:
            candidates.append(members)
    found = {}
    for link_weight in link_weights:
        best, best_score = [], 0.0
        for members in candidates:
            score = sum(words[m] - (1 - link_weight) * link_words[m] for m in members)
            if score > best_score:
                best, best_score = members, score
        found[link_weight] = best
    return found


# Parts of a post that are the forum's controls, not what a person wrote:
# reactions and votes, share and report buttons, signatures, the poster's
# rank and avatar, the post's own footer of actions.
_CONTROLS = re.compile(
    r"reaction|\blikes?\b|share|signature|\bactions?\b|controls|toolbar|\bvotes?\b|voting|badge|user-?title"
    r"|avatar|report|bookmark|\bmenu\b|dropdown|tooltip|sr-only|visually-hidden",
    re.IGNORECASE)


def series_html(members: list[lxml.html.HtmlElement]) -> list[str]:
    """The HTML of each block of a series, without the parts that are never
    content and without the forum's controls. The page's tree is not changed."""
    out = []
    for member in members:
        block = copy.deepcopy(member)
        block.tail = None
        for element in list(block.iter()):
            if element is block or element.getparent() is None or not isinstance(element.tag, str):
                continue
            marks = f"{element.get('class', '')} {element.get('id', '')}"
            if element.tag in _NO_CONTENT or element.tag == "footer" or _CONTROLS.search(marks):
                element.drop_tree()
        out.append(lxml.html.tostring(block, encoding="unicode"))
    return out
