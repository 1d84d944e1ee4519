"""The wiki agent on the owner's machine: what the owner's git settings,
home folder and missing programs must not change. The real CLI against the
loopback Messages API (tests/fake_anthropic.py), real git, real files; the
fixtures and helpers are those of tests/test_wiki_agent.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import dagster as dg
import pytest

from kb.index.search import search
from kb.settings import get_settings
from kb.wiki.agent import AgentRun, tool_deny_reason
from kb_assets.index.wiki_index import wiki_index
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, WikiResource
from tests.fake_anthropic import FakeAnthropic, write
from tests.test_wiki_agent import (  # noqa: F401 (fixtures)
    PARSED,
    TOKEN,
    agent_env,
    assert_unchanged,
    ephemeral_instance,
    good_turns,
    materialize_source,
    record_gate_decision,
    run_ingest,
    snapshot,
    wiki,
)


@pytest.mark.parametrize("tool,tool_input,allowed", [
    # A leading ~ is a home folder to the CLI, which expands it after the guard.
    ("Read", {"file_path": "~/notes.md"}, False),
    ("Grep", {"pattern": "x", "path": "~"}, False),
    ("Glob", {"pattern": "*", "path": "~"}, False),
    ("Glob", {"pattern": "~/*"}, False),
    # The CLI's search reads hidden files: no search of the root, no pattern that names a dot.
    ("Glob", {"pattern": "*"}, False),
    ("Glob", {"pattern": "**/*.md"}, False),
    ("Grep", {"pattern": "x"}, False),
    ("Grep", {"pattern": "x", "path": ".", "glob": "*"}, False),
    ("Grep", {"pattern": "x", "path": "wiki", "glob": "{a,.git}/*"}, False),
    ("Glob", {"pattern": "[.]git/*"}, False),
    ("Glob", {"pattern": "wiki/**/.*"}, False),
    ("Grep", {"pattern": "x", "path": "wiki"}, True),
    ("Grep", {"pattern": "x", "path": "raw", "glob": "*.md"}, True),
    ("Grep", {"pattern": "x", "path": "index.md"}, True),
    ("Glob", {"pattern": "*.md", "path": "wiki"}, True),
])
def test_the_guard_on_home_paths_and_searches(tool, tool_input, allowed, tmp_path):
    # The folders exist, with a page each: a path that does not exist would pass any rule.
    (tmp_path / "wiki/concepts").mkdir(parents=True)
    (tmp_path / "wiki/concepts/a.md").write_text("# a\n")
    (tmp_path / "raw/parsed").mkdir(parents=True)
    (tmp_path / "raw/parsed/a.md").write_text("# a\n")
    (tmp_path / "index.md").write_text("# Index\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("/raw/*\n")
    assert (tool_deny_reason(tool, tool_input, tmp_path) is None) is allowed


def test_grep_and_glob_stay_out_of_a_folder_that_holds_a_dot_entry(tmp_path):
    (tmp_path / "wiki/concepts").mkdir(parents=True)
    (tmp_path / "wiki/concepts/.gitkeep").touch()  # kb's empty placeholder does not count
    assert tool_deny_reason("Grep", {"pattern": "x", "path": "wiki"}, tmp_path) is None
    (tmp_path / "wiki/concepts/.gitkeep").write_text("a key\n")
    assert "wiki/concepts/.gitkeep" in tool_deny_reason("Grep", {"pattern": "x", "path": "wiki"}, tmp_path)
    (tmp_path / "wiki/concepts/.gitkeep").write_text("")
    (tmp_path / "wiki/concepts/.obsidian").mkdir()
    for tool, tool_input in (("Grep", {"pattern": "x", "path": "wiki/concepts"}),
                             ("Glob", {"pattern": "wiki/**/*.md"})):
        assert "wiki/concepts/.obsidian" in tool_deny_reason(tool, tool_input, tmp_path)


@pytest.mark.slow  # the agent's CLI
def test_the_owner_git_settings_hide_no_page_and_an_ignored_page_is_refused(wiki, monkeypatch, tmp_path):
    """The owner's global excludes file (scratch files, node_modules/) must not
    hide a page from the check of the change, and a page that the wiki's own
    .gitignore hides is refused by name. The rollback removes both, and the
    search index never holds the token of the hidden page."""
    home, xdg = tmp_path / "owner-home", tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (xdg / "git").mkdir(parents=True)
    (xdg / "git" / "ignore").write_text("node_modules/\nscratch-*\n")
    (home / "global-ignore").write_text("node_modules/\nscratch-*\n")
    (home / ".gitconfig").write_text(f"[core]\n\texcludesFile = {home / 'global-ignore'}\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    # A shell that points git at another repository must not move kb's git either.
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere.git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "elsewhere.index"))
    root = wiki.root()
    # A new page goes into a page folder itself (not a folder below it): the
    # patterns name files there.
    (root / ".gitignore").write_text((root / ".gitignore").read_text() + "/wiki/concepts/draft-*\n")
    subprocess.run(["git", "--git-dir", str(root / ".git"), "--work-tree", str(root), "commit", "-qam",
                    "manual: drafts are mine"], check=True, env={**os.environ, "GIT_INDEX_FILE": str(root / ".git/index")})
    # The owner's git does not see the page: this is the door.
    owner = subprocess.run(["git", "--git-dir", str(root / ".git"), "--work-tree", str(root), "check-ignore", "-q",
                            "wiki/concepts/scratch-x.md"], env={**os.environ, "GIT_INDEX_FILE": str(root / ".git/index")})
    assert owner.returncode == 0
    before = snapshot(root)
    hidden, drafted = "wiki/concepts/scratch-x.md", "wiki/concepts/draft-y.md"
    turns = good_turns()
    turns.insert(1, [write(hidden, f"# x\n\nThe token is {TOKEN}.\n"), write(drafted, "# y\n\nA draft.\n")])
    with FakeAnthropic(turns=turns) as fake:
        outcome = run_ingest(wiki, fake, monkeypatch)
    assert not outcome.ok
    assert f"refused: {hidden} holds the value of ANTHROPIC_AUTH_TOKEN" in outcome.problems
    assert f"refused: {drafted} is a file that the wiki's .gitignore hides" in outcome.problems
    assert not (root / hidden).exists() and not (root / drafted).exists()
    assert_unchanged(before, root)
    assert not (tmp_path / "elsewhere.git").exists() and not (tmp_path / "elsewhere.index").exists()
    # The token never reaches the history or the search index (this check
    # was the red team's; tests/test_red_team.py plays the hostile model).
    history = subprocess.run(["git", "--git-dir", str(root / ".git"), "log", "-p", "--all", "--format=%B"],
                             capture_output=True, text=True, check=True).stdout
    assert TOKEN not in history
    indexed = dg.materialize([wiki_index], resources={
        "wiki": WikiResource.from_settings(), "embedder": EmbedderResource.from_settings(backend="hash"),
        "lance": ChunkIndexResource.from_settings()})
    assert indexed.success
    assert TOKEN not in repr(search(TOKEN, mode="bm25", limit=50).hits)


@pytest.mark.slow  # the agent's CLI
def test_the_first_agent_run_without_bubblewrap_says_so_and_how_to_install_it(wiki, monkeypatch, tmp_path):
    """KB_AGENT_SANDBOX=auto and no bwrap on PATH: the run works without its
    room, its log and metadata say so, and the owner gets one notice (no
    bot here: the notices of `kb status`)."""
    from kb.telegram.notifier import TelegramNotifier, recent_notices
    from kb.wiki.sandbox import bubblewrap_works
    from kb_assets.wiki.wiki_pages import tell_of_the_room

    no_bwrap = tmp_path / "bin"
    no_bwrap.mkdir()
    (no_bwrap / "git").symlink_to(shutil.which("git"))  # kb's git, and no bwrap
    monkeypatch.setenv("PATH", str(no_bwrap))
    monkeypatch.setenv("KB_AGENT_SANDBOX", "auto")
    bubblewrap_works.cache_clear()
    try:
        record_gate_decision("src1", "accepted", PARSED)
        with FakeAnthropic(turns=good_turns()) as fake, ephemeral_instance() as instance:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
            result = materialize_source(instance, "src1")
            assert result.success
            meta = {k: v.value for k, v in result.asset_materializations_for_node("wiki_pages")[0].metadata.items()}
            warnings = [e.message for e in instance.all_logs(result.run_id) if e.level >= logging.WARNING]
        assert meta["agent_sandbox"] == "none"
        for text in (meta["agent_sandbox_notice"], *[w for w in warnings if "bubblewrap" in w][:1],
                     recent_notices(get_settings())[-1]["text"]):
            assert "runs without its bubblewrap room" in text and "bubblewrap is not installed" in text
            assert "sudo apt-get install bubblewrap" in text and "sudo dnf install bubblewrap" in text
        assert any("bubblewrap" in w for w in warnings)
        # The next run logs it again, but the owner's notice came once.
        tell_of_the_room(dg.build_asset_context(), AgentRun(sandbox="none", sandbox_notice=meta["agent_sandbox_notice"]),
                         TelegramNotifier.from_settings())
        assert [n["key"] for n in recent_notices(get_settings(), limit=50)].count("wiki-agent") == 1
    finally:
        bubblewrap_works.cache_clear()
