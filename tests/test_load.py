"""Load, small: 8 clients search while a writer commits new versions of the
index, with the hash embedder. 6 clients call search() in threads (as `kb
search` does), 2 are MCP clients over stdio, each with its own server
process. Zero errors: no exception, no wrong answer (a rare key word gives
its bookmark first; a churn hit holds one version). The figures with the
local model come from benchmarks/bench_load.py."""

from __future__ import annotations

import pytest

from benchmarks.bench_load import run_load

pytestmark = pytest.mark.slow  # slow: kb or a server in another process


@pytest.mark.slow  # starts two MCP server processes
def test_eight_clients_search_while_the_index_is_written(kb_home):
    report = run_load(kb_home, backend="hash", n_bookmarks=120, n_churn=10, cli=6, mcp=2, per_client=8,
                      cli_in_processes=False, writer_in_process=False)

    summary = report.summary()
    print(summary)
    assert report.errors == []
    assert summary["queries"] == 8 * 8
    assert summary["cli"]["n"] == 6 * 8 and summary["mcp"]["n"] == 2 * 8
    # The writer committed while the clients searched: the searches overlapped writes.
    assert report.writer_commits >= 3
