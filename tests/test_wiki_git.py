"""kb's own git (kb/wiki/git_env.py): no setting of the owner's git reaches
a git command of kb. The agent's change under an owner's global excludes
file is in tests/test_red_team.py."""

from __future__ import annotations

from kb.backup.archive import _git as backup_git
from kb.wiki.git_env import GIT_ENV_NAMES, GIT_FIXED_ENV, git_env
from kb.wiki.repo import Wiki

OWNER_GIT_VARIABLES = {
    "GIT_DIR": "elsewhere.git", "GIT_WORK_TREE": "elsewhere", "GIT_INDEX_FILE": "elsewhere.index",
    "GIT_OBJECT_DIRECTORY": "elsewhere-objects", "GIT_CONFIG_PARAMETERS": "'user.name'='from-the-shell'",
    "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "user.email", "GIT_CONFIG_VALUE_0": "shell@example.org",
}


def test_kb_git_reads_no_setting_and_no_variable_of_the_owner(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    # A hook folder of the owner's: git runs its pre-commit at every commit
    # unless kb's own settings keep it out (a trap that fires for plain git).
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text(f"#!/bin/sh\ntouch {tmp_path / 'pwned-by-hook'}\n")
    (hooks / "pre-commit").chmod(0o755)
    (home / ".gitconfig").write_text(f"[user]\n\tname = the-owner\n[core]\n\thooksPath = {hooks}\n")
    (home / ".config" / "git" / "config").write_text("[core]\n\tpager = touch pwned\n")
    (home / ".config" / "git" / "ignore").write_text("*.md\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for name, value in OWNER_GIT_VARIABLES.items():
        monkeypatch.setenv(name, str(tmp_path / value) if "elsewhere" in value else value)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-not-for-git")

    env = git_env()
    assert set(env) <= set(GIT_ENV_NAMES) | set(GIT_FIXED_ENV), sorted(set(env) - set(GIT_ENV_NAMES) - set(GIT_FIXED_ENV))
    assert env["GIT_CONFIG_GLOBAL"] == "/dev/null" and env["GIT_CONFIG_NOSYSTEM"] == "1"

    wiki = Wiki.from_settings()
    root = wiki.ensure()
    assert (root / ".git").is_dir() and not (tmp_path / "elsewhere.git").exists()
    (root / "wiki/concepts/a.md").write_text("# a\n")
    # The owner's XDG ignore file says *.md: kb's git sees the page anyway.
    assert "wiki/concepts/a.md" in wiki.dirty_paths()
    for config in (wiki.git("config", "--list", "--show-origin"), backup_git(root, "config", "--list", "--show-origin")):
        assert "the-owner" not in config and "from-the-shell" not in config and "shell@example.org" not in config
        assert str(home) not in config  # no file of the owner's home was read
    # A hook inside the wiki's own .git (a page cannot put one there, but a
    # restored or copied wiki can hold one) does not run either.
    (root / ".git" / "hooks" / "pre-commit").write_text(f"#!/bin/sh\ntouch {tmp_path / 'pwned-by-repo-hook'}\n")
    (root / ".git" / "hooks" / "pre-commit").chmod(0o755)
    assert wiki.commit_all("manual: a page") is not None
    assert wiki.git("log", "-1", "--format=%an") == "kb wiki"
    assert not (tmp_path / "pwned-by-hook").exists() and not (tmp_path / "pwned-by-repo-hook").exists()
