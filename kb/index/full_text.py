"""The full-text queries of a search (kb/index/search.py): BM25 on the word
index, the n-gram index for words inside a run of a script without spaces,
and the passages that hold every word of a quoted phrase. Each query gives
row ids and scores only. A filter comes as Lance SQL (`where`), or, when it
is narrow, as its rows in Lance's row allowlist (`allow`,
search._row_allowlist()): then Lance does not evaluate the SQL again for
each query.
"""

from __future__ import annotations

from lance.query import FullTextOperator, MatchQuery

from kb.index.chunk_schema import NGRAM_COLUMN
from kb.index.chunking import unspaced_runs
from kb.index.exact_words import QUOTED, TOKEN

ROW_ID = "_rowid"


def _bm25(table, query: str, where: str | None, depth: int, allow: bytes | None = None) -> list[tuple[int, float]]:
    """(row id, BM25 score) of the best lexical matches, best first.
    allow: the rows of `where` as a row allowlist (_row_allowlist())."""
    plain = QUOTED.sub(lambda m: m.group(1), query)
    if not TOKEN.search(plain):
        return []
    rows = _fts(table, plain, where, depth, allow=allow)
    runs = unspaced_runs(plain)
    if runs and _has_index(table, NGRAM_COLUMN):
        # Chinese, Japanese, Korean or Thai words: the word index sees a
        # whole run as one word, the n-gram index finds a word inside a run.
        rows = _union(rows, _fts(table, runs, where, depth, column=NGRAM_COLUMN, allow=allow))
    quoted = [p for p in QUOTED.findall(query) if len(TOKEN.findall(p)) > 1]
    if quoted:
        # Quoted phrases: also fetch the passages that hold all their words,
        # which a long OR-query may rank below the depth. The phrase check
        # on the text then finds the exact ones. (The index keeps no token
        # positions, so it cannot match a phrase itself: positions made its
        # build 4 times slower and each query 2 times slower.)
        seen = {row_id for row_id, _ in rows}
        for phrase in quoted:
            for row_id, score in _fts(table, MatchQuery(phrase, "text", operator=FullTextOperator.AND), where, depth,
                                      allow=allow):
                if row_id not in seen:
                    seen.add(row_id)
                    rows.append((row_id, score))
        rows.sort(key=lambda r: r[1], reverse=True)
    return rows


def _union(first: list[tuple[int, float]], second: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The rows of two lexical lists, each with its best score, best first."""
    best = dict(first)
    for row_id, score in second:
        if score > best.get(row_id, -1.0):
            best[row_id] = score
    return sorted(best.items(), key=lambda r: r[1], reverse=True)


def _has_index(table, column: str) -> bool:
    # The dataset keeps its index list: about 7 us a call.
    return any(ix.field_names == [column] for ix in table.describe_indices())


def _fts(table, query: str | MatchQuery, where: str | None, depth: int,
         column: str = "text", allow: bytes | None = None) -> list[tuple[int, float]]:
    """(row id, BM25 score) of a full-text query on one column, best first.
    allow: the rows of `where` as a row allowlist (_row_allowlist()): Lance
    then does not evaluate `where` again."""
    text_query = query if isinstance(query, MatchQuery) else {"query": query, "columns": [column]}
    if allow is not None:
        result = table.scanner(columns=["_score"], with_row_id=True, full_text_query=text_query, limit=depth,
                               row_addr_allowlist=allow, disable_scoring_autoprojection=True).to_table()
    else:
        result = table.to_table(columns=["_score"], with_row_id=True, full_text_query=text_query, limit=depth,
                                filter=where, prefilter=bool(where), disable_scoring_autoprojection=True)
    return list(zip(result.column(ROW_ID).to_pylist(), result.column("_score").to_pylist()))
