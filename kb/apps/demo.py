"""`kb demo`: the main job on the embedded default, with no login, key or server.

The sample capture that kb ships (kb/sample_data) goes through every
stage with the local embedder, and a few searches print their results.
"""

from __future__ import annotations

import os
import shlex
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
        click.echo(f"\n$ {demo_env(home)} kb search {shlex.quote(demo_query.query)} -n 3")
        response = search(demo_query.query, limit=3)
        print_hits(response)
        if not any(hit.author == demo_query.expected_author for hit in response.hits):
            misses += 1
            click.echo(f"   (expected a post by @{demo_query.expected_author})", err=True)
    click.echo("\n" + next_commands(home, DEMO_QUERIES[0].query))
    return 1 if not report.ok or misses else 0


def _shown(home: Path) -> str:
    """The demo folder as the user typed it: relative to this folder when inside it."""
    try:
        return str(home.relative_to(Path.cwd()))
    except ValueError:
        return str(home)


def demo_env(home: Path) -> str:
    """The variables that make a typed command read the demo store. Without
    KB_HOME it reads ~/kb, and answered "No results." KB_EMBED_BACKEND=local:
    the demo indexed with the local model, and a search must embed the query
    with the same model."""
    return f"KB_HOME={shlex.quote(_shown(home))} KB_EMBED_BACKEND=local"


def next_commands(home: Path, query: str) -> str:
    """The commands that reach the demo store when the user types them in this folder."""
    env, shown = demo_env(home), _shown(home)
    # Dagster wants an absolute DAGSTER_HOME; the shell makes it from $PWD.
    dagster_home = (shlex.quote(str(home / "dagster")) if shown == str(home)
                    else f'"$PWD"/{shlex.quote(shown)}/dagster')
    return "\n".join([
        "Try the demo store yourself. Type these commands in this folder:",
        f"  {env} kb search {shlex.quote(query)} -n 3",
        f"  {env} kb status",
        f"  {env} kb web",
        f"  {env} DAGSTER_HOME={dagster_home} dagster dev -w workspace.yaml",
        "Your own store is ~/kb (or KB_HOME): run `kb login`, then `kb sync`.",
    ])
