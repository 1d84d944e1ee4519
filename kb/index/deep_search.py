"""The deep search (`search(rerank=True)`): a cross-encoder reads the query
with a window of each of the first RERANK_TOP hits and sorts them again
(kb/index/rerank.py: the model, and the choice of each hit's window). It
gives a better order (SciFact nDCG@10: see kb/index/rerank.py), but it adds
about 0.3 s (p95 0.7 s) on 2 cores, so search() leaves it off by default: the
CLI and the web page search fast. The MCP tool search_bookmarks turns it on
by default, because an agent waits seconds for its own model anyway
(issue 49). In a keyword query or a query
with a "quoted phrase", the exact-word hits keep their places
(exact_words_lead()).
"""

from __future__ import annotations

from kb.index.exact_words import QUOTED, is_keyword_query
from kb.index.fusion import Candidate
from kb.index.passage_rows import PassageRows
from kb.index.rerank import RERANK_TOP, WordRarity, load_model, new_order, window_for, words_of

# --- deep search ---------------------------------------------------------------
def exact_words_lead(query: str) -> bool:
    """True when the hits with the exact words (Hit.exact_match) keep their
    places in a deep search: a keyword query, or a query with a "quoted
    phrase". There the owner asks for those words. In a longer query, a rare
    word is one word of a question, and the cross-encoder, which reads the
    whole text, orders all the first hits: on SciFact, hits kept in place
    there cost nDCG@10 (benchmarks/index_and_retrieval.md)."""
    return is_keyword_query(query) or bool(QUOTED.search(query))


def reranked_by_model(query: str, rows: PassageRows, chosen: list[Candidate], per_document: bool) -> list[Candidate]:
    """The first RERANK_TOP hits in the cross-encoder's order (kb.index.rerank).
    The model loads at the first deep search of a process, so a search
    without rerank never loads it."""
    head = chosen[:RERANK_TOP]
    if not head:
        return chosen
    if rows.word_rarity is None:
        rows.word_rarity = WordRarity.of_sample(rows.texts())
    query_words = words_of(query)
    windows = [window_for(query_words, texts, rows.word_rarity) for texts in _texts_behind(rows, head, per_document)]
    scores = load_model().score(query, windows).tolist()
    for cand, score in zip(head, scores):
        cand.rerank = score
    keep = exact_words_lead(query)
    order = new_order(scores, [c.score for c in head], [keep and (c.exact or c.rare) for c in head])
    return [head[i] for i in order] + chosen[len(head):]


def _texts_behind(rows: PassageRows, head: list[Candidate], per_document: bool) -> list[list[list[str]]]:
    """For each hit: its texts, each as its passages in order. A bookmark hit:
    every text of the bookmark (its post, article, linked pages...), the
    text of the hit's passage first. A hit of one document read: its passage."""
    if per_document:
        return [[[text]] for text in rows.column("text", [c.row_id for c in head])]
    hit_rows = dict(zip((c.row_id for c in head), zip(*(rows.column(n, [c.row_id for c in head])
                                                          for n in ("source", "ref")))))
    by_bookmark = rows.rows_of_bookmarks(list(dict.fromkeys(c.key for c in head)))
    out = []
    for cand in head:
        ids = by_bookmark[cand.key]
        texts: dict[tuple, list[tuple[int, str]]] = {hit_rows[cand.row_id]: []}
        for source, ref, position, text in zip(*(rows.column(n, ids) for n in ("source", "ref", "position", "text"))):
            texts.setdefault((source, ref), []).append((position or 0, text))
        out.append([[text for _, text in sorted(parts, key=lambda p: p[0])] for parts in texts.values() if parts])
    return out
