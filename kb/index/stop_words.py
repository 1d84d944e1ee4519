"""The stop words of the search: one copy, for kb.index.search and kb.index.rerank."""

# Words that tell nothing about what a query looks for. A query of few other
# words is a keyword look-up (kb.index.search).
STOP_WORDS = frozenset(
    "a an and are as at be but by for from has have how i in is it its of on or that the this to was what "
    "when where which who why will with you your does do did not no can".split())
# The English stop words of the full-text index (tantivy's filter, as
# kb.index.maintenance.fts_config() sets it up): the index holds none of them.
FTS_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split())
