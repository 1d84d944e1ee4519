"""The token of the wiki remote (KB_WIKI_REMOTE=https://user:token@host/...)
reaches the git server and nothing else.

A loopback git server (git http-backend as CGI, with Basic auth) takes the
push. While git runs, the server reads the command line of every git
process (/proc/<pid>/cmdline, what `ps` shows to every user). The token
must not be there, nor in the wiki's .git/config, nor in the resource
config that the Dagster UI shows, nor in a file of the owner's git
credential helper, nor in an error text.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from kb.settings import get_settings, redact_secrets, secret_values
from kb.wiki.repo import Wiki
from kb_resources.stores import WikiResource
from tests.loopback import LoopbackServer, QuietHandler

USER, TOKEN = "kb-owner", "ghp_TEST-SECRET-remote-token-7f3a"


def git_commands() -> list[str]:
    """The command lines of the git processes that run now."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"git" in Path(argv[0].decode(errors="replace")).name.encode():
            found.append(" ".join(a.decode(errors="replace") for a in argv))
    return found


class GitServer(LoopbackServer):
    """Smart HTTP by git http-backend, behind Basic auth."""

    def __init__(self, root: Path):
        self.root = root
        self.authorizations: list[str] = []
        self.commands_seen: list[str] = []
        server = self

        class Handler(QuietHandler):
            def do_GET(self):
                self.cgi()

            do_POST = do_GET

            def cgi(self):
                server.commands_seen += git_commands()  # git push waits for this answer
                auth = self.headers.get("Authorization", "")
                server.authorizations.append(auth)
                expected = "Basic " + base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()
                if auth != expected:
                    return self.send_body(401, b"auth", "text/plain", {"WWW-Authenticate": 'Basic realm="kb"'})
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {"GIT_PROJECT_ROOT": str(server.root), "GIT_HTTP_EXPORT_ALL": "1", "REMOTE_USER": USER,
                       "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                       "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
                       "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""), "PATH": os.environ["PATH"]}
                if self.headers.get("Content-Encoding") == "gzip":
                    env["HTTP_CONTENT_ENCODING"] = "gzip"
                out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n") if ": " in line)
                status = int(headers.pop("Status", "200").split()[0])
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.bind(Handler)


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """A bare repository behind the git server, KB_WIKI_REMOTE with the
    token in it, and an owner whose git config stores credentials in a file."""
    root = tmp_path / "git-server"
    subprocess.run(["git", "init", "-q", "--bare", str(root / "wiki.git")], check=True)
    home = tmp_path / "owner-home"
    home.mkdir()
    store = home / "stored-credentials"
    (home / ".gitconfig").write_text(f"[credential]\n\thelper = store --file {store}\n")
    monkeypatch.setenv("HOME", str(home))
    with GitServer(root) as server:
        monkeypatch.setenv("KB_WIKI_REMOTE", f"http://{USER}:{TOKEN}@127.0.0.1:{server.server.server_port}/wiki.git")
        yield server, root / "wiki.git", store


def test_the_push_gives_the_token_to_git_by_its_environment_only(remote, kb_home):
    server, bare, store = remote
    wiki = Wiki.from_settings()
    wiki.ensure()

    assert wiki.push() is None

    pushed = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "main"], capture_output=True, text=True)
    assert pushed.stdout.strip() == wiki.head()  # the push went through, with the token
    assert any(a.startswith("Basic ") for a in server.authorizations)
    commands = [c for c in server.commands_seen if " push " in c or "remote-http" in c]
    assert commands, "no git process was seen during the push"
    assert not [c for c in server.commands_seen if TOKEN in c]
    assert all("127.0.0.1" in c for c in commands if "remote-http" in c)
    assert TOKEN not in (wiki.root() / ".git" / "config").read_text()
    assert not store.exists() or TOKEN not in store.read_text()  # the owner's `store` helper never saw it


def test_the_resource_config_holds_no_url(remote):
    """The resource holds no copy of the remote: its config (what the Dagster
    UI shows) has only the overrides, and the client reads the URL from the
    settings of the process."""
    resource = WikiResource.from_settings()
    # The config values that the Dagster UI shows for the resource.
    shown = resource.get_resource_definition().config_schema.as_field().default_value
    assert "remote" not in shown and "wiki.git" not in json.dumps(shown)
    assert TOKEN not in json.dumps(shown) and TOKEN not in repr(resource)
    # The run worker resolves the variable and gets the whole URL.
    assert resource.get_client().remote.get_secret_value().endswith("/wiki.git")
    assert TOKEN not in repr(resource.get_client())


def test_a_failed_push_names_the_remote_without_the_token(remote, monkeypatch, kb_home):
    server, _, _ = remote
    monkeypatch.setenv("KB_WIKI_REMOTE",
                       f"http://{USER}:wrong-{TOKEN}@127.0.0.1:{server.server.server_port}/wiki.git")
    wiki = Wiki.from_settings()
    wiki.ensure()
    error = wiki.push()
    assert error and "push to the wiki remote failed" in error and "127.0.0.1" in error
    assert TOKEN not in error
    # The token alone is a configured secret too: redaction and the
    # commit checks find it wherever it is written.
    assert f"wrong-{TOKEN}" in secret_values(get_settings())
    assert TOKEN not in redact_secrets(f"the key is wrong-{TOKEN}")


def test_a_remote_with_no_token_is_pushed_as_it_is(tmp_path, monkeypatch, kb_home):
    bare = tmp_path / "plain.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    monkeypatch.setenv("KB_WIKI_REMOTE", str(bare))
    wiki = Wiki.from_settings()
    wiki.ensure()
    assert wiki.push() is None
    pushed = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "main"], capture_output=True, text=True)
    assert pushed.stdout.strip() == wiki.head()


def test_the_specifications_name_kb_git_remote_sets_the_remote(tmp_path, monkeypatch, kb_home):
    """KB_GIT_REMOTE (specification 13.4) is kb's KB_WIKI_REMOTE. The token in
    it reaches git and the secret checks, and no error or config shows it."""
    from kb.setting_names import SettingNameConflict

    bare = tmp_path / "spec.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    monkeypatch.setenv("KB_GIT_REMOTE", str(bare))
    wiki = Wiki.from_settings()
    wiki.ensure()
    assert wiki.push() is None
    pushed = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "main"], capture_output=True, text=True)
    assert pushed.stdout.strip() == wiki.head()
    # A token in it is a configured secret; the resource holds no copy of it.
    monkeypatch.setenv("KB_GIT_REMOTE", f"https://{USER}:{TOKEN}@git.example.org/wiki.git")
    assert TOKEN in secret_values(get_settings())
    resource = WikiResource.from_settings()
    assert TOKEN not in json.dumps(resource.get_resource_definition().config_schema.as_field().default_value)
    assert resource.get_client().remote.get_secret_value().endswith("/wiki.git")
    # Two names with two values: an error that names both and shows neither.
    monkeypatch.setenv("KB_WIKI_REMOTE", f"https://{USER}:other-{TOKEN}@git.example.org/wiki.git")
    with pytest.raises(SettingNameConflict) as error:
        get_settings()
    assert "KB_GIT_REMOTE (in the environment) and KB_WIKI_REMOTE (in the environment)" in str(error.value)
    assert TOKEN not in str(error.value)
