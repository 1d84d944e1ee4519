"""`kb demo`: the main job on the embedded default, with no login, key or server.

The sample capture that kb ships (kb/sample_data) goes through every
stage with the local embedder, and a few searches print their results.
"""

from __future__ import annotations

import os
from pathlib import Path

import click


def run_demo(home: Path) -> int:
    """Returns the exit code: 0 when every stage finished and every demo
    search found its expected post."""
    from kb.sample_data import DEMO_QUERIES, sample_pages

    home = home.expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["KB_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    # The demo promises no server: the local model, even when Ollama runs.
    os.environ["KB_EMBED_BACKEND"] = "local"

    from kb.apps.printing import print_hits, print_stage_line, print_sync_report
    from kb.search import search
    from kb.apps.sync import run_sync

    click.echo(f"kb demo: KB_HOME is {home}")
    # The sample's links point to example.com and example.org: the demo
    # promises no network, so its run leaves them out (the run tag kb/exclude).
    report = run_sync(files=[str(p) for p in sample_pages()], exclude=["link"], on_stage=print_stage_line)
    print_sync_report(report)
    misses = 0
    for demo_query in DEMO_QUERIES:
        click.echo(f'\n$ kb search "{demo_query.query}" -n 3')
        response = search(demo_query.query, limit=3)
        print_hits(response)
        if not any(hit.author == demo_query.expected_author for hit in response.hits):
            misses += 1
            click.echo(f"   (expected a post by @{demo_query.expected_author})", err=True)
    return 1 if report.failed or misses else 0
