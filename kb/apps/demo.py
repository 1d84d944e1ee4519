"""`kb demo`: the main job on the embedded default, with no login, key or server.

The sample capture that kb ships (kb/sample_data) goes through every
stage with the local embedder, and a few searches print their results.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
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
    from kb.index.search import search
    from kb.apps.sync import run_sync

    click.echo(f"kb demo: KB_HOME is {home}")
    # The sample's links point to example.com and example.org: the demo
    # promises no network, so its run leaves them out (the run tag kb/exclude).
    report = run_sync(files=[str(p) for p in sample_pages()], exclude=["link"], on_stage=print_stage_line)
    print_sync_report(report)
    misses = 0
    for demo_query in DEMO_QUERIES:
        click.echo(f"\n$ {demo_env(home)} {typed('kb')} search {shlex.quote(demo_query.query)} -n 3")
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


def typed(command: str) -> str:
    """A command of kb's venv as the user can type it in this folder. The
    bare name only when the shell finds this same program on PATH. Else its
    path: after `python3 -m venv .venv && .venv/bin/kb demo`, the venv is not
    on PATH, and a printed `kb search` answered "kb: command not found"."""
    program = Path(sys.executable).parent / command  # the venv's bin folder; not resolved: that is the venv
    if not program.exists():
        return command
    found = shutil.which(command)
    if found and Path(found).resolve() == program.resolve():
        return command
    shown = _shown(program)
    # A path without a slash is a name that the shell looks up on PATH.
    return shlex.quote(shown if "/" in shown else f"./{shown}")


def next_commands(home: Path, query: str) -> str:
    """The commands that reach the demo store when the user types them in this folder."""
    env, kb = demo_env(home), typed("kb")
    lines = ["Try the demo store yourself. Type these commands in this folder:",
             f"  {env} {kb} search {shlex.quote(query)} -n 3",
             f"  {env} {kb} status",
             f"  {env} {kb} web",
             f"  {env} {kb} up --no-bot",
             "(`kb up` runs the Dagster UI on http://127.0.0.1:3000 and the search page.)"]
    if kb != "kb":
        bin_folder = shlex.quote(_shown(Path(sys.executable).parent))
        lines.append(f"To type `kb` alone, put the venv on PATH first: export PATH=\"$PWD/{bin_folder}:$PATH\""
                     if not bin_folder.startswith("/") else
                     f"To type `kb` alone, put the venv on PATH first: export PATH=\"{bin_folder}:$PATH\"")
    lines.append(f"Your own store is ~/kb (or KB_HOME): run `{kb} login`, then `{kb} sync`.")
    return "\n".join(lines)
