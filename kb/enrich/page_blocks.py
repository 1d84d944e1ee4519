"""The blocks of a page, and the numbers that say if a block is main text.

A block is the text that one block element (a paragraph, a list item, a
table cell, a div) holds itself, with its inline elements (links, bold) but
without the blocks inside it. kb.enrich.block_choice keeps or drops each
block with a learned model; this module only cuts the page and measures
each block: its words, its links, its tag and the names of its classes,
where it stands in the page, and how much of it trafilatura's runs kept.
"""

from __future__ import annotations

import collections
import operator
import re
from dataclasses import dataclass, field
from functools import cached_property

import lxml.html
import numpy as np

from kb.enrich.page_types import PageType

# Elements that start a new block. Inline elements (a, span, b, em, code)
# stay in the block of their parent.
BLOCK_TAGS = frozenset({
    "p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote",
    "table", "tr", "td", "th", "thead", "tbody", "tfoot", "caption", "section", "article", "main", "header",
    "footer", "nav", "aside", "figure", "figcaption", "body", "form", "fieldset", "address", "details",
    "summary", "center", "label", "legend", "menu", "dialog", "hgroup", "search",
})
# Elements whose text is never main text. <noscript> is not here: Discourse
# and other sites put the whole thread for readers without script in it.
SKIP_TAGS = frozenset({
    "head", "script", "style", "template", "svg", "iframe", "select", "option", "button", "textarea", "input",
    "object", "embed", "canvas", "map", "math",
})
HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# The ancestors that say where a block stands.
AREA_TAGS = ("nav", "header", "footer", "aside", "article", "main", "form", "table", "li", "blockquote",
             "figure", "pre", "a", "dl")
# Families of words in the class and id names of a block and its ancestors.
# They are the words that web software uses for these parts of a page.
NAME_FAMILIES = {
    "content": ("content", "article", "entry", "body", "text", "story", "main", "prose", "markdown", "post",
                "blog", "rich", "detail", "description"),
    "thread": ("comment", "reply", "replies", "answer", "discussion", "thread", "message", "topic", "forum",
               "question", "review"),
    "navigation": ("nav", "menu", "breadcrumb", "sidebar", "widget", "footer", "header", "banner", "toolbar",
                   "pagination", "pager", "skip", "toc", "masthead", "drawer", "dropdown", "tabs"),
    "promotion": ("share", "social", "related", "recommend", "promo", "ad", "ads", "advert", "sponsor",
                  "newsletter", "subscribe", "signup", "login", "cookie", "popup", "modal", "banner", "cta",
                  "more", "trending", "popular"),
    "meta": ("author", "byline", "date", "time", "meta", "info", "avatar", "user", "profile", "tag", "tags",
             "category", "caption", "credit"),
    "item": ("item", "card", "product", "price", "tile", "grid", "list", "result", "listing", "teaser"),
    "code": ("code", "highlight", "syntax", "example", "admonition", "note", "warning", "api", "signature"),
}
# Words of the block's own text that mark the parts around the main text:
# calls to share, to sign in, to read more, legal lines.
AROUND_WORDS = frozenset({
    "share", "shares", "tweet", "comment", "comments", "reply", "subscribe", "newsletter", "cookie", "cookies",
    "copyright", "rights", "reserved", "privacy", "terms", "login", "log", "sign", "signup", "follow", "related",
    "advertisement", "sponsored", "read", "more", "previous", "next", "home", "menu", "search", "posted",
    "published", "updated", "by", "ago", "views", "likes", "tags", "categories", "category", "loading",
})
_NAME_WORD = re.compile(r"[a-z]+")
_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"[.!?。！？](?:\s|$)")
_PUNCTUATION = re.compile(r"[,;:.!?]")
_DIGIT = re.compile(r"\d")
_first = operator.itemgetter(0)  # the first letter of a word of str.split(): never empty


@dataclass
class Block:
    element: lxml.html.HtmlElement
    # The pieces of text in reading order, each with the href of the link
    # that holds it ("" for a link without one), or None outside links.
    parts: list[tuple[str, str | None]] = field(default_factory=list)
    link_chars: int = 0
    areas: frozenset[str] = frozenset()  # AREA_TAGS that hold the block
    depth: int = 0
    own_families: frozenset[str] = frozenset()  # NAME_FAMILIES of its own class and id
    up_families: frozenset[str] = frozenset()  # NAME_FAMILIES of its ancestors

    @cached_property  # read many times, and only after page_blocks() has filled the parts
    def text(self) -> str:
        # The parts keep their own spaces: "See <a>the replay</a>." is
        # "See the replay." and "word<b>s</b>" one word.
        return " ".join("".join(text for text, _ in self.parts).split())


def page_blocks(tree: lxml.html.HtmlElement) -> list[Block]:
    """The blocks of the page in reading order, without empty ones. One
    walk over the tree gives each block its text, links, areas, depth and
    the families of the class names around it."""
    body = tree.find("body")
    root = body if body is not None else tree
    order: list[Block] = []
    families_of_names: dict[str, frozenset[str]] = {}  # pages repeat few class names

    def families(element: lxml.html.HtmlElement) -> frozenset[str]:
        names = f"{element.get('class') or ''} {element.get('id') or ''}"
        if names not in families_of_names:
            families_of_names[names] = _name_families(names)
        return families_of_names[names]

    def add(block: Block, text: str | None, link: str | None) -> None:
        if not text:
            return
        if text.isspace():
            # The space between two inline elements divides words:
            # "<a>Home</a> <a>News</a>" is "Home News", not "HomeNews".
            if block.parts:
                block.parts.append((" ", None))
            return
        if not block.parts:
            order.append(block)
        block.parts.append((text, link))
        if link is not None:
            block.link_chars += len(text.strip())

    # An explicit stack, not recursion: a walk of 255 levels (libxml2's
    # limit) stays far from Python's recursion limit in every caller.
    # Each entry: element, its block, areas, families of the ancestors,
    # depth, the link it is in, and whether it stands for the element's tail.
    stack: list[tuple] = [(root, None, frozenset(), frozenset(), 0, None, False)]
    while stack:
        element, owner, areas, up, depth, link, is_tail = stack.pop()
        if is_tail:
            # After a block inside this one, or after a line break, the
            # text goes on after a space: "Intro<p>..</p>after" is two words.
            tail = element.tail
            if tail and (element.tag in BLOCK_TAGS or element.tag == "br"):
                tail = " " + tail
            add(owner, tail, link)
            continue
        tag = element.tag if isinstance(element.tag, str) else ""
        if not tag or tag in SKIP_TAGS:
            continue
        if tag in AREA_TAGS:
            areas = areas | {tag}
        own = families(element)
        if tag in BLOCK_TAGS or owner is None:
            owner = Block(element, areas=areas, depth=depth, own_families=own, up_families=up)
        link_here = (element.get("href") or "") if tag == "a" and link is None else link
        add(owner, element.text, link_here)
        below = up | own
        for child in reversed(element):
            # The tail of a child belongs to this element's block, after the child.
            stack.append((child, owner, areas, below, depth + 1, link_here, True))
            stack.append((child, owner, areas, below, depth + 1, link_here, False))
    return order


def earlier_copies(texts: list[str]) -> list[int]:
    """For each text, how many earlier texts of the list are the same: a
    block with 1 or more is a copy (the feature earlier_copy, and the
    training's labels of copies)."""
    seen: dict[str, int] = {}
    counts = []
    for text in texts:
        counts.append(seen.get(text, 0))
        seen[text] = counts[-1] + 1
    return counts


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def word_grams(words: list[str]) -> list[tuple[str, ...]]:
    """The word trigrams of a text (pairs or single words for a shorter one):
    a block is in another text when its trigrams are, not when its words are
    (every text holds "the")."""
    return list(_grams(words, min(3, len(words)))) if words else []


def _grams(words: list[str], n: int):
    # zip over shifted lists: several times faster than slices of the list.
    return zip(*(words[shift:] for shift in range(n)))


def gram_sets(text: str) -> dict[int, set[tuple[str, ...]]]:
    words = words_of(text)
    return {n: set(_grams(words, n)) for n in (1, 2, 3)}


def share_in(words: list[str], sets: dict[int, set[tuple[str, ...]]]) -> float:
    """The share of a block's word trigrams that another text holds."""
    return gram_share(word_grams(words), sets)


def gram_share(grams: list[tuple[str, ...]], sets: dict[int, set[tuple[str, ...]]]) -> float:
    """share_in() from the block's word_grams(), made once for all texts."""
    if not grams:
        return 0.0
    # map() with the set's own test: a third of the time of a generator.
    return sum(map(sets[len(grams[0])].__contains__, grams)) / len(grams)


def _families_of_mark() -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for family, marks in NAME_FAMILIES.items():
        for mark in marks:
            found[mark] = found.get(mark, frozenset()) | {family}
    return found


_FAMILIES_OF_MARK = _families_of_mark()  # a mark can be in two families ("banner")


def _name_families(names: str) -> frozenset[str]:
    """The NAME_FAMILIES that the words of class and id names belong to."""
    found: frozenset[str] = frozenset()
    for word in _NAME_WORD.findall(names.lower()):
        found |= _FAMILIES_OF_MARK.get(word, frozenset())
    return found


BLOCK_TAG_GROUPS = ("p", "div", "li", "cell", "h1", "h2", "h3", "h4-6", "pre", "blockquote", "dt-dd", "section",
                    "caption", "other")
_TAG_GROUP = {"td": "cell", "th": "cell", "h4": "h4-6", "h5": "h4-6", "h6": "h4-6", "dt": "dt-dd", "dd": "dt-dd",
              "article": "section", "main": "section", "header": "section", "footer": "section",
              "figcaption": "caption", "caption": "caption", "summary": "caption", "label": "caption"}
KEPT_BY = ("default", "precision", "article")
# Blocks of the same structure: the posts of a thread, the items of a list,
# the links of a menu. What the kept texts hold of the whole group speaks
# for each of its blocks: trafilatura often keeps the first post of a
# thread and drops the replies in the same markup. A group is the blocks
# with the same tag and class ("name"), the same name and the same name of
# the parent ("parent"), or the same names up _PATH_LEVELS ancestors
# ("path"). 5-fold CV (3 December 2026): WCXB 0.8603 against 0.8528
# without, higher in 5 of 5 folds; news 0.9460 against 0.9476.
GROUPINGS = ("name", "parent", "path")
_PATH_LEVELS = 4
_CONTEXT = 3  # blocks on each side of a block whose kept share is averaged


def _feature_names() -> list[str]:
    names = ["log_words", "chars_per_word", "link_share", "punctuation", "sentences", "digits", "capitals",
             "position", "words_before", "log_depth", "log_same_name", "log_page_words", "log_blocks",
             "around_words", "in_title", "after_h1", "from_h1", "log_same_text", "earlier_copy"]
    names += [f"tag_{group}" for group in BLOCK_TAG_GROUPS]
    names += [f"in_{tag}" for tag in AREA_TAGS]
    names += [f"own_{family}" for family in NAME_FAMILIES] + [f"up_{family}" for family in NAME_FAMILIES]
    for mode in KEPT_BY:
        names += [f"kept_{mode}", f"near_kept_{mode}", f"prev_kept_{mode}", f"next_kept_{mode}",
                  f"page_kept_{mode}", f"inside_kept_{mode}"]
    names += ["prev_log_words", "next_log_words", "prev_link_share", "next_link_share", "heading_before_kept"]
    for grouping in GROUPINGS:
        names += [f"{grouping}_words", f"{grouping}_link_share", *(f"{grouping}_kept_{mode}" for mode in KEPT_BY)]
    names += ["log_same_parent", "log_same_path"]
    # The page's type (kb.enrich.page_types): a short block of links is an
    # item on a listing and a menu on an article. With it, 5-fold CV gave
    # news 0.9379 and WCXB 0.8542 against 0.9345 and 0.8512 without.
    names += [f"type_{kind}" for kind in PageType]
    return names


_FEATURE_NAMES = tuple(_feature_names())
_COLUMN = {name: index for index, name in enumerate(_FEATURE_NAMES)}


def feature_names() -> list[str]:
    """The name of each column of block_features(), in order."""
    return list(_FEATURE_NAMES)


def _window_sum(values: np.ndarray) -> np.ndarray:
    """The sum of each value and the _CONTEXT values on each side of it."""
    total = np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))
    index = np.arange(len(values))
    high = np.minimum(index + _CONTEXT + 1, len(values))
    low = np.maximum(index - _CONTEXT, 0)
    return (total[high] - total[low]).astype(np.float32)


def block_features(tree: lxml.html.HtmlElement, blocks: list[Block], kept_texts: dict[str, str],
                   kind: str) -> np.ndarray:
    """One row of feature_names() per block. kept_texts holds the text of
    each extraction of KEPT_BY: trafilatura's runs and kb's article rule;
    kind is the page's type (PageType)."""
    count = len(blocks)
    rows = np.zeros((count, len(_FEATURE_NAMES)), dtype=np.float32)
    if not count:
        return rows
    column = _COLUMN
    texts = [block.text for block in blocks]
    words = [words_of(text) for text in texts]
    sizes = np.array([len(w) for w in words], dtype=np.float32)
    page_words = max(1.0, float(sizes.sum()))
    chars = np.array([max(1, len(text)) for text in texts], dtype=np.float32)
    at_least_one = np.maximum(sizes, 1.0)
    # Columns of plain numbers are filled one column at a time: one numpy
    # call per column, not one per block and column.
    rows[:, column["log_words"]] = np.log1p(sizes)
    rows[:, column["chars_per_word"]] = np.minimum(20.0, chars / at_least_one)
    rows[:, column["link_share"]] = np.minimum(1.0, np.array([b.link_chars for b in blocks]) / chars)
    rows[:, column["punctuation"]] = np.array([len(_PUNCTUATION.findall(t)) for t in texts]) / at_least_one
    rows[:, column["sentences"]] = np.log1p([len(_SENTENCE_END.findall(t)) for t in texts])
    rows[:, column["digits"]] = np.array([len(_DIGIT.findall(t)) for t in texts]) / chars
    # map() over C functions, not a generator per block: the page's blocks
    # are many and short.
    capitals = [sum(map(str.isupper, map(_first, text.split()))) for text in texts]
    rows[:, column["capitals"]] = np.array(capitals) / at_least_one
    rows[:, column["position"]] = np.arange(count) / count
    rows[:, column["words_before"]] = (np.cumsum(sizes) - sizes) / page_words
    rows[:, column["log_depth"]] = np.log1p([block.depth for block in blocks])
    rows[:, column["around_words"]] = np.array([sum(map(AROUND_WORDS.__contains__, ws)) for ws in words]) / at_least_one
    title = tree.find(".//title")
    title_sets = gram_sets(title.text_content() if title is not None else "")
    grams = [word_grams(block_words) for block_words in words]
    rows[:, column["in_title"]] = [gram_share(block_grams, title_sets) for block_grams in grams]
    groups = _groups(blocks)
    for grouping, group in groups.items():
        rows[:, column[f"log_same_{grouping}"]] = np.log1p(np.bincount(group)[group])
    for index, block in enumerate(blocks):
        tag = block.element.tag
        group = tag if tag in BLOCK_TAG_GROUPS else _TAG_GROUP.get(tag, "other")
        marks = [f"tag_{group}", *(f"in_{area}" for area in block.areas),
                 *(f"own_{family}" for family in block.own_families),
                 *(f"up_{family}" for family in block.up_families)]
        rows[index, [column[mark] for mark in marks]] = 1.0
    # The page's first <h1> most often opens the main text: what stands
    # before it is the header of the site.
    first_h1 = next((index for index, block in enumerate(blocks) if block.element.tag == "h1"), None)
    if first_h1 is not None:
        rows[first_h1:, column["after_h1"]] = 1.0
        rows[:, column["from_h1"]] = (np.arange(count) - first_h1) / count
    # The same text in several blocks is a label of the site ("Reply",
    # "Share", a menu repeated in the footer), seldom main text.
    same_text = collections.Counter(texts)
    rows[:, column["log_same_text"]] = np.log1p([same_text[text] - 1 for text in texts])
    # Word F1 counts each word as often as it stands: a second copy of a
    # kept paragraph (a quoted post, a title repeated under the photo)
    # costs precision when the main text holds it once. The model learns
    # when the copy is main text (benchmarks/train_block_choice.py labels
    # each copy by the hand-made text).
    rows[:, column["earlier_copy"]] = np.array(earlier_copies(texts)) > 0
    rows[:, column[f"type_{PageType(kind)}"]] = 1.0
    rows[:, column["log_page_words"]] = np.log1p(page_words)
    rows[:, column["log_blocks"]] = np.log1p(count)
    log_words = rows[:, column["log_words"]]
    link_share = rows[:, column["link_share"]]
    rows[1:, column["prev_log_words"]] = log_words[:-1]
    rows[:-1, column["next_log_words"]] = log_words[1:]
    rows[1:, column["prev_link_share"]] = link_share[:-1]
    rows[:-1, column["next_link_share"]] = link_share[1:]
    weighted_sizes = _window_sum(sizes)
    for mode in KEPT_BY:
        sets = gram_sets(kept_texts[mode])  # a missing text must fail, not count as empty
        kept = np.array([gram_share(block_grams, sets) for block_grams in grams], dtype=np.float32)
        rows[:, column[f"kept_{mode}"]] = kept
        rows[:, column[f"near_kept_{mode}"]] = _window_sum(kept * sizes) / np.maximum(
            weighted_sizes, 1.0)
        rows[1:, column[f"prev_kept_{mode}"]] = kept[:-1]
        rows[:-1, column[f"next_kept_{mode}"]] = kept[1:]
        rows[:, column[f"page_kept_{mode}"]] = float((kept * sizes).sum()) / page_words
        held = np.flatnonzero(kept >= 0.5)
        if held.size:
            rows[held[0]:held[-1] + 1, column[f"inside_kept_{mode}"]] = 1.0
    _fill_group_columns(rows, groups, sizes, page_words)
    # A heading is main text when the text under it is: the kept share of
    # the next block of at least 10 words.
    default_kept = rows[:, column["kept_default"]]
    next_long = count
    for index in range(count - 1, -1, -1):
        if next_long < count:
            rows[index, column["heading_before_kept"]] = default_kept[next_long]
        if sizes[index] >= 10:
            next_long = index
    return rows


def _name(element: lxml.html.HtmlElement | None) -> tuple:
    return (element.tag, element.get("class") or "") if element is not None else ()


def _groups(blocks: list[Block]) -> dict[str, np.ndarray]:
    """For each of GROUPINGS, the number of each block's group."""
    keys: dict[str, list[tuple]] = {grouping: [] for grouping in GROUPINGS}
    for block in blocks:
        path, element = [], block.element
        for _ in range(_PATH_LEVELS):
            path.append(_name(element))
            element = element.getparent() if element is not None else None
        keys["name"].append(path[0])
        keys["parent"].append((path[0], path[1]))
        keys["path"].append(tuple(path))
    numbers = {}
    for grouping, group_keys in keys.items():
        number_of: dict[tuple, int] = {}
        numbers[grouping] = np.array([number_of.setdefault(key, len(number_of)) for key in group_keys])
    return numbers


def _fill_group_columns(rows: np.ndarray, groups: dict[str, np.ndarray], sizes: np.ndarray,
                        page_words: float) -> None:
    """The share of the page's words in each block's group, and the link
    share and kept shares of the group, each block weighed by its words + 1
    (a block of one link counts too)."""
    column = _COLUMN
    weight = sizes.astype(np.float64) + 1.0
    for grouping, group in groups.items():
        rows[:, column[f"{grouping}_words"]] = (np.bincount(group, sizes) / page_words)[group]
        group_weight = np.bincount(group, weight)
        for name in ("link_share", *(f"kept_{mode}" for mode in KEPT_BY)):
            mean = np.bincount(group, weight * rows[:, column[name]]) / group_weight
            rows[:, column[f"{grouping}_{name}"]] = mean[group]
