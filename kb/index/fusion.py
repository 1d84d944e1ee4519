"""Fusion: one score per candidate passage from its dense and its BM25
score (kb/index/search.py gathers the candidates).

Hybrid mode: each list's scores are scaled to [0, 1] over the candidates
(min-max) and summed with equal weights ("convex combination"). Unlike
reciprocal rank fusion, it keeps the size of the gaps between scores: when
BM25 puts one passage far above the rest (a rare word matched), the gap
survives, where rank fusion would give it the same credit as a narrow
lead. Plain RRF stays available as `fusion="rrf"`. On SciFact it gives
nDCG@10 0.735 against 0.713 for RRF (figures in benchmarks/index_and_retrieval.md).
"""

from __future__ import annotations

from dataclasses import dataclass

FUSION_METHODS = ("convex", "rrf")
DEFAULT_FUSION = "convex"
RRF_K = 60


@dataclass(slots=True)
class Candidate:
    # slots: a search makes about 200 of them; plain attributes, no dict each.
    row_id: int  # in the pinned table version of this search
    key: object = None  # tweet id; (source, ref, position) when one document is read
    dense: float | None = None  # cosine similarity
    bm25: float | None = None
    dense_rank: int | None = None
    bm25_rank: int | None = None
    score: float = 0.0
    exact: bool = False  # holds the exact query phrase
    rare: bool = False  # holds every rare query word
    rerank: float | None = None  # the cross-encoder's score (rerank=True)


# --- fusion ------------------------------------------------------------------
def score_candidates(cands: list[Candidate], mode: str, fusion: str) -> None:
    if mode == "dense":
        for c in cands:
            c.score = c.dense if c.dense is not None else -1.0
        return
    if mode == "bm25":
        for c in cands:
            c.score = c.bm25 or 0.0  # a rare-word passage below the depth has none
        return
    if fusion == "rrf":
        for c in cands:
            c.score = sum(1.0 / (RRF_K + r + 1) for r in (c.dense_rank, c.bm25_rank) if r is not None)
        return
    dense = _min_max([c.dense for c in cands])
    bm25 = _min_max([c.bm25 for c in cands])
    for c, d, b in zip(cands, dense, bm25):
        c.score = 0.5 * d + 0.5 * b


def _min_max(values: list[float | None]) -> list[float]:
    """Scores to [0, 1] over this candidate list: the list's best is 1, its
    worst 0. A passage that the list does not hold scores 0 too."""
    present = [v for v in values if v is not None]
    if not present:
        return [0.0] * len(values)
    low, high = min(present), max(present)
    span = high - low or 1.0
    return [0.0 if v is None else (v - low) / span for v in values]
