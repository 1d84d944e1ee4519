"""The wiki: a folder in KB_HOME that is its own git repository.

Each change to the wiki is one git commit, or nothing. This resource owns
every git operation on the wiki: create it, snapshot the owner's edits,
roll back a failed change, verify the agent's commit, and push.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path



from urllib.parse import unquote, urlsplit, urlunsplit

from kb.store.atomic_files import write_atomic
from pydantic import BaseModel, SecretStr

from kb.settings import Settings, get_settings


@contextlib.contextmanager
def raw_files_lock(wiki_dir: Path):
    """Hold the lock on the wiki's raw/ folder.

    An ingest checks that raw/ did not change while the agent worked, because
    git cannot roll raw/ back. The intake stages write raw/ too (a parsed
    file, a move to raw/rejected/), so they hold this lock while they write,
    and an ingest holds it for its whole change. Otherwise an intake run for
    one item would fail the ingest of another. The lock file lives next to
    the wiki, not in it: it must never show in raw/ or in git."""
    wiki_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(wiki_dir.parent / f".{wiki_dir.name}.raw.lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
from kb.guards.secret_scan import guarded_secrets, secrets_in
from kb.wiki.git_env import git_command, git_env
from kb.wiki.change_rules import KeptLines, lost_cited_claims, owner_section_problem, redirects
from kb.wiki_files import (
    APPEND_ONLY_FILES, WIKILINK, agent_path_problem, make_wiki_folder, wiki_page_files, write_wiki_file,
)
from kb.wiki.schema import DISPUTED_MARK, MANUAL_PREFIX, UNSUPPORTED_MARK, new_page_problem, only_key_added
from kb.wiki.playbook import CLAUDE_MD, GITIGNORE, INDEX_MD, LOG_MD, PURPOSE_MD

BRANCH = "main"
# The folders at the wiki root that are not in git and that a rollback
# keeps: raw/ holds the sources that wait for their ingest (kb's, see
# GITIGNORE), .obsidian/ and .trash/ the state of the owner's viewer.
KEPT_OUTSIDE_GIT = ("raw", ".obsidian", ".trash")  # "raw" is RAW_FOLDER
PAGE_DIRS = (
    "wiki/entities",
    "wiki/concepts",
    "wiki/sources",
    "wiki/syntheses/weekly",
    "wiki/syntheses/lint",
    "wiki/syntheses/topics",
)
# The ref of the last commit that reached the remote: the push scans only
# the commits after it.
PUSHED_REF = "refs/kb/pushed"
# The largest diff that the agent's show_change tool returns.
MAX_DIFF_CHARS = 60_000
# The most bytes that one change may add to one file. An agent that a source
# talked into it turned 1.2 kB of tool input into a page of 360 kB (Edit
# with replace_all), and a page of 100 MB in the room. A page of an honest
# change has a few kB; index.md gains a line a page.
MAX_ADDED_BYTES = 256 * 1024
SNAPSHOT_MESSAGE = f"{MANUAL_PREFIX} pre-ingest snapshot"
RAW_FOLDER = "raw"
# A pathspec for git: every path but raw/. Snapshots, the agent's change
# and the rollback leave raw/ alone; a parsed file goes into git only with
# the ingest of its source (commit_pending's `provenance`).
RAW_EXCLUDE = f":(exclude){RAW_FOLDER}"
# Written before an agent starts, removed after its change is verified or
# rolled back. When it is still there, the run before died mid-change.
CHANGE_MARKER = "kb-change-in-progress"
GIT_IDENTITY = ("kb wiki", "kb-wiki@localhost")


class WikiGitError(RuntimeError):
    """A git command in the wiki failed."""


@dataclass(frozen=True)
class Change:
    status: str  # A, M or D
    path: str


@dataclass
class BeforeChange:
    """What the wiki was before an agent run, so the worker can compare."""

    sha: str
    raw_files: dict[str, tuple[int, int]]
    index_links: set[str]
    # The files that .gitignore hides (Wiki.ignored_files): a change may not add or change one.
    ignored: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    sha: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


class Wiki(BaseModel):
    """The git-versioned Markdown wiki."""

    path: str
    # Push here after each commit; empty: no push. A secret: the URL can
    # hold a token (https://user:token@host/wiki.git), so the resource
    # shows the variable's name (KB_WIKI_REMOTE), never the URL.
    remote: SecretStr = SecretStr("")

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> Wiki:
        settings = settings or get_settings()
        return cls(**{"path": str(settings.wiki_dir), "remote": settings.kb_wiki_remote or SecretStr(""), **overrides})

    # --- the folder ---------------------------------------------------------------

    def root(self) -> Path:
        return Path(self.path).expanduser().resolve()

    def ensure(self) -> Path:
        """Create the wiki on first use: the files, the folders and the repository.
        A wiki that exists is left as it is, but missing folders come back."""
        root = self.root()
        root.mkdir(parents=True, exist_ok=True)
        new_repo = not (root / ".git").exists()
        if new_repo:
            self._run("init", "-q", "-b", BRANCH)
        # Local identity and no signing: the owner's global git settings must
        # not stop a commit that runs with nobody at the keyboard.
        self._run("config", "user.name", GIT_IDENTITY[0])
        self._run("config", "user.email", GIT_IDENTITY[1])
        self._run("config", "commit.gpgsign", "false")
        for name, text in (("CLAUDE.md", CLAUDE_MD), ("purpose.md", PURPOSE_MD), ("index.md", INDEX_MD),
                           ("log.md", LOG_MD), (".gitignore", GITIGNORE)):
            if not (root / name).exists():
                write_wiki_file(root, root / name, text.encode())
        # Each folder and file through inside_wiki: a link in the wiki
        # (raw -> a folder outside) must not take these writes out of it.
        for folder in PAGE_DIRS:
            make_wiki_folder(root, root / folder)
            keep = root / folder / ".gitkeep"  # git keeps no empty folders
            if not any((root / folder).iterdir()):
                write_wiki_file(root, keep, b"")
        make_wiki_folder(root, root / "raw" / "parsed")
        if new_repo:
            self._run("add", "-A")
            self._run("commit", "-q", "-m", "init: wiki")
        return root

    # --- git --------------------------------------------------------------------

    def _run(self, *args: str, check: bool = True, timeout: float = 60,
             input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        # kb's own git: none of the owner's git settings (kb.wiki.git_env).
        proc = subprocess.run(git_command(*args), cwd=self.root(), capture_output=True, text=True,
                              env=git_env(env), timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise WikiGitError(f"git {args[0]} failed in {self.root()}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def git(self, *args: str) -> str:
        return self._run(*args).stdout.strip()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def dirty_paths(self) -> list[str]:
        """Tracked changes and untracked files outside raw/ (ignored files do
        not count). raw/ goes into git only with the ingest that uses a file."""
        out = self._run("status", "--porcelain", "-z", "--no-renames", "--untracked-files=all", "--", ".",
                        RAW_EXCLUDE).stdout
        return [entry[3:] for entry in out.split("\0") if entry.strip()]

    def commit_all(self, message: str) -> str | None:
        """Commit everything that is dirty outside raw/. Returns the new SHA, or None when clean."""
        if not self.dirty_paths():
            return None
        self._run("add", "-A", "--", ".", RAW_EXCLUDE)
        self._run("commit", "-q", "-m", message)
        return self.head()

    def rollback(self, sha: str) -> None:
        """Put the wiki back to `sha`: tracked files reset, and every other
        file removed, ignored files too (-x), but for KEPT_OUTSIDE_GIT.
        Why -x: a file of the change that .gitignore hides is a file of the
        change too, and the index and the MCP server read it from disk.
        raw/ stays: a parsed file that the change committed comes back as an
        untracked file, because its source still waits for its ingest; the
        other files of raw/ are not the agent's."""
        root = self.root()
        committed = self._run("diff", "-z", "--name-only", "--no-renames", "--diff-filter=A", sha, "HEAD", "--",
                              RAW_FOLDER, check=False).stdout.split("\0")
        kept_files = {path: (root / path).read_bytes() for path in committed
                      if path and (root / path).is_file() and not (root / path).is_symlink()}
        self._run("reset", "-q", "--hard", sha)
        keep = [arg for folder in KEPT_OUTSIDE_GIT for arg in ("-e", f"/{folder}/")]
        self._run("clean", "-q", "-fdx", *keep)
        for path, data in kept_files.items():
            if not (root / path).exists():
                write_wiki_file(root, root / path, data)

    def ignored_files(self) -> dict[str, tuple[int, int]]:
        """Size and mtime of each file that the wiki's .gitignore hides,
        outside KEPT_OUTSIDE_GIT. git does not see these files, so the check
        of a change compares them with the state before the change."""
        kept = [f":(exclude){folder}/" for folder in KEPT_OUTSIDE_GIT]
        out = self._run("ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--", *kept).stdout
        manifest = {}
        for path in filter(None, out.split("\0")):
            try:
                stat = (self.root() / path).lstat()
            except OSError:
                continue
            manifest[path] = (stat.st_size, stat.st_mtime_ns)
        return manifest

    def ignored(self, path: str) -> bool:
        """True when the wiki's .gitignore keeps `path` out of git."""
        return self._run("check-ignore", "-q", "--no-index", "--", path, check=False).returncode == 0

    def tracked(self, path: str) -> bool:
        """True when git holds `path` (relative to the wiki root) in HEAD."""
        return self._run("ls-files", "--error-unmatch", "--", path, check=False).returncode == 0

    def commits_since(self, sha: str) -> list[tuple[str, str]]:
        out = self.git("log", "--format=%H%x09%s", f"{sha}..HEAD")
        return [tuple(line.split("\t", 1)) for line in out.splitlines() if line]  # type: ignore[misc]

    def changes_since(self, sha: str) -> list[Change]:
        # --no-renames: a rename is a delete and an add, so a moved source
        # page counts as a deleted one. -z: without it git quotes a name
        # that is not plain ASCII ("wiki/G\303\266del.md"), and the rules
        # refused every change of such a page.
        fields = self.git("diff", "-z", "--name-status", "--no-renames", f"{sha}..HEAD").split("\0")
        return [Change(status[:1], path) for status, path in zip(fields[0::2], fields[1::2]) if status]

    def paths_changed_in(self, sha: str) -> list[str]:
        """The paths that one commit added or changed (not the deleted ones)."""
        out = self.git("show", "-z", "--name-only", "--no-renames", "--diff-filter=AM", "--format=", sha)
        return [path for path in out.split("\0") if path]

    def show(self, sha: str, path: str) -> str | None:
        proc = self._run("show", f"{sha}:{path}", check=False)
        return proc.stdout if proc.returncode == 0 else None

    def log_between(self, since_iso: str, until_iso: str, prefix: str) -> list[tuple[str, str]]:
        """Commits whose subject starts with prefix, in [since, until)."""
        out = self.git("log", "--format=%H%x09%s", f"--since={since_iso}", f"--until={until_iso}")
        return [tuple(line.split("\t", 1)) for line in out.splitlines()  # type: ignore[misc]
                if line and line.split("\t", 1)[1].startswith(prefix)]

    # --- one change -------------------------------------------------------------

    def _marker(self) -> Path:
        return self.root() / ".git" / CHANGE_MARKER

    def recover_interrupted_change(self) -> str | None:
        """When the run before died during an agent run, roll its work back.
        Returns the SHA it went back to, or None when there was nothing."""
        marker = self._marker()
        if not marker.exists():
            return None
        sha = marker.read_text().strip()
        self.clear_stale_lock()
        self.rollback(sha)
        marker.unlink()
        return sha

    def clear_stale_lock(self) -> bool:
        """A run killed during `git commit` leaves index.lock, and then every
        git command fails. Only one wiki change runs at a time (pool `wiki`),
        so a lock that is older than a minute is stale."""
        lock = self.root() / ".git" / "index.lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > 60:
            lock.unlink()
            return True
        return False

    def begin_change(self) -> BeforeChange:
        """Pre-flight: commit the owner's edits, then note the state to compare with."""
        self.ensure()
        self.recover_interrupted_change()
        self.clear_stale_lock()
        self.commit_all(SNAPSHOT_MESSAGE)
        before = BeforeChange(sha=self.head(), raw_files=self.raw_manifest(), index_links=self.index_links(),
                              ignored=self.ignored_files())
        write_atomic(self._marker(), before.sha.encode())
        return before

    def end_change(self) -> None:
        self._marker().unlink(missing_ok=True)

    def raw_manifest(self) -> dict[str, tuple[int, int]]:
        """Size and mtime of every file in raw/. Most of raw/ is not in git, so
        this is how the worker sees that the agent changed it. Size and mtime, not a
        hash: raw/ grows with every source, and this runs on every change."""
        raw = self.root() / "raw"
        manifest = {}
        if raw.exists():
            for file in raw.rglob("*"):
                if file.is_file():
                    stat = file.stat()
                    manifest[str(file.relative_to(self.root()))] = (stat.st_size, stat.st_mtime_ns)
        return manifest

    def index_links(self) -> set[str]:
        index = self.root() / "index.md"
        if not index.exists():
            return set()
        return {_link_target(m) for m in WIKILINK.findall(index.read_text(errors="replace"))}

    def verify_change(self, before: BeforeChange, prefix: str, *, may_delete_pages: bool,
                      provenance: tuple[str, ...] = ()) -> Verdict:
        """Check the agent's change against the rules. Each broken rule is one problem."""
        verdict = Verdict()
        head = self.head()
        verdict.sha = head
        if head == before.sha:
            verdict.problems.append("HEAD did not move: the agent made no commit")
            return verdict
        commits = self.commits_since(before.sha)
        if len(commits) != 1 or self.git("rev-parse", "HEAD^") != before.sha:
            verdict.problems.append(f"expected exactly one commit on top of {before.sha[:10]}, found {len(commits)}")
        subject = self.git("log", "-1", "--format=%s", "HEAD")
        if not subject.startswith(prefix):
            verdict.problems.append(f"the commit message {subject!r} does not start with {prefix!r}")
        changes = self.changes_since(before.sha)  # one git diff for every rule below
        marked: set[str] = set()
        for change in changes:
            if change.path.startswith(RAW_FOLDER + "/"):
                # The parsed file of the source goes into git with its ingest,
                # once; after that it changes only by the mark of a later parse.
                superseded = change.status == "M" and only_key_added(
                    self.show(before.sha, change.path) or "", self.show("HEAD", change.path) or "", "superseded_by")
                if change.status == "M" and change.path in provenance:
                    marked.add(change.path)
                if change.path not in provenance or not (change.status == "A" or superseded):
                    verdict.problems.append(f"refused: {change.path}: a file in raw/ goes into git only with "
                                            f"the ingest of its source, and never changes after it")
                continue
            if change.path.endswith("/.gitkeep") and change.status == "D":
                pass  # a folder's first page makes its placeholder needless
            elif (rule := agent_path_problem(change.path)) is not None:
                verdict.problems.append(f"refused: {rule}")
            if change.status == "D":
                verdict.deleted.append(change.path)
                if change.path.startswith("wiki/sources/") and not change.path.endswith(".gitkeep"):
                    verdict.problems.append(f"the source page {change.path} was deleted")
                elif not may_delete_pages and not change.path.endswith(".gitkeep"):
                    verdict.problems.append(f"the page {change.path} was deleted")
            elif change.status == "A":
                verdict.created.append(change.path)
            else:
                verdict.updated.append(change.path)
        after_raw = self.raw_manifest()
        for path, stat in before.raw_files.items():
            if path not in after_raw:
                verdict.problems.append(f"{path} was deleted from raw/")
            elif after_raw[path] != stat and path not in marked:
                verdict.problems.append(f"{path} in raw/ was changed")
        verdict.problems += self._lost_claims(before.sha, changes, may_delete_pages)
        lost = sorted(before.index_links - self.index_links())
        if lost and not may_delete_pages:
            verdict.problems.append(f"index.md lost {len(lost)} entries, for example {lost[0]}")
        left = self.dirty_paths()
        if left:
            verdict.problems.append(f"the agent left changes that are not committed: {', '.join(left[:5])}")
        return verdict

    def _lost_claims(self, sha: str, changes: list[Change], may_delete_pages: bool = False) -> list[str]:
        """A change may move a cited claim, mark it or add a citation, never
        delete or reword it; and it keeps the owner's lines above the marker
        (kb.wiki.change_rules). A source can ask the agent to "delete the
        contradicting page" or to "correct" a claim; these checks do not
        read the source, so the source cannot talk them round."""
        changed = [c.path for c in changes
                   if c.status in ("M", "D") and c.path.startswith("wiki/") and c.path.endswith(".md")]
        before = {path: self.show(sha, path) or "" for path in changed}
        if not any(before.values()):
            return []
        root = self.root()
        after = {f.relative_to(root).as_posix(): f.read_text(encoding="utf-8", errors="replace")
                 for f in wiki_page_files(root)}
        # A lint may merge a page into another (a redirect page): a link to
        # it is a link to the other page (kb.wiki.finish.finish_merges).
        merged = redirects(after) if may_delete_pages else {}
        live = self.page_targets(sha)
        kept = KeptLines(after.values(), merged=merged, old=before.values())
        problems = [f"refused: {item['page']}: the cited claim {item['claim']!r} was removed or changed. Keep its "
                    f"words and its citations: move it, add a citation, or mark it {DISPUTED_MARK} (and record it "
                    f"in a Contradictions section) or {UNSUPPORTED_MARK}; never delete or reword a cited claim"
                    for item in lost_cited_claims(before, after, live=live, merged=merged, kept=kept)]
        for path, text in before.items():
            problem = owner_section_problem(path, text, after.get(path), may_merge=may_delete_pages, kept=kept,
                                            merged=merged, live=live)
            if problem:
                problems.append(f"refused: {problem}")
        return problems

    def page_targets(self, sha: str) -> set[str]:
        """How links name the pages of commit `sha`: `entities/Ada-Lovelace`,
        and the bare name `Ada-Lovelace` (Obsidian resolves it too)."""
        out = self._run("ls-tree", "-z", "-r", "--name-only", sha, "--", "wiki/").stdout
        targets = {path.removeprefix("wiki/").removesuffix(".md") for path in out.split("\0")
                   if path.endswith(".md")}
        return targets | {target.rsplit("/", 1)[-1] for target in targets}

    # --- the agent's change, before kb commits it --------------------------------

    def pending_changes(self) -> list[Change]:
        """Every change of the working tree against HEAD: tracked and
        untracked files (ignored files do not count; raw/ has its own check)."""
        out = self._run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                        "--", ".", RAW_EXCLUDE).stdout
        changes = []
        for entry in out.split("\0"):
            if len(entry) < 4:
                continue
            code, path = entry[:2], entry[3:]
            status = "D" if "D" in code else "A" if code == "??" or "A" in code else "M"
            changes.append(Change(status, path))
        return changes

    def refusals(self, before: BeforeChange, message: str, secrets: dict[str, str] | None = None) -> list[str]:
        """The rules that the change in the working tree breaks, before kb
        commits it: each changed path must be on the allowlist
        (kb.wiki_files.agent_path_problem), a regular UTF-8 Markdown file and
        not a symbolic link; log.md only grows; and no added text or commit
        message holds the value of a secret. Each problem starts with
        `refused:` and names the rule, never the secret's value."""
        secrets = guarded_secrets() if secrets is None else secrets
        problems = [f"refused: the commit message holds the value of {name}"
                    for name in secrets_in(message, secrets)]
        # git does not see a file that .gitignore hides: no path rule and no
        # secret scan would read it, so such a file may not come or change.
        problems += [f"refused: {path} is a file that the wiki's .gitignore hides"
                     for path, stat in sorted(self.ignored_files().items()) if before.ignored.get(path) != stat]
        for change in self.pending_changes():
            if change.status == "D" and change.path.endswith("/.gitkeep"):
                continue
            rule = agent_path_problem(change.path)
            if rule:
                problems.append(f"refused: {rule}")
                continue
            if change.status == "A" and change.path.startswith("wiki/") \
                    and (name_rule := new_page_problem(change.path.removeprefix("wiki/"))) is not None:
                problems.append(f"refused: {name_rule}")
            if change.status != "D":
                problems += self._file_refusals(before.sha, change.path, secrets)
        return problems

    def _file_refusals(self, sha: str, path: str, secrets: dict[str, str]) -> list[str]:
        file = self.root() / path
        if file.is_symlink():
            return [f"refused: {path} is a symbolic link"]
        if not file.is_file():
            return [f"refused: {path} is not a regular file"]
        try:
            new = file.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return [f"refused: {path} is not UTF-8 text"]
        if "\0" in new:
            return [f"refused: {path} holds a NUL byte: it is not Markdown"]
        old = self.show(sha, path) or ""
        added = len(new.encode()) - len(old.encode())
        if added > MAX_ADDED_BYTES:
            return [f"refused: {path} grows by {added:,} bytes; a change adds at most {MAX_ADDED_BYTES:,} bytes "
                    "to one file"]
        problems = [f"refused: {path} holds the value of {name}" for name in secrets_in(new, secrets, already=old)]
        if path in APPEND_ONLY_FILES and not new.startswith(old):
            problems.append(f"refused: {path} is append-only, and the change alters an earlier line")
        return problems

    def commit_pending(self, message: str, provenance: tuple[str, ...] = ()) -> str | None:
        """Stage the whole change, and the parsed files in `provenance` (the
        source of an ingest: what its citations point to), and make one
        commit with `message`. Returns the new SHA, or None when nothing
        changed. Call refusals() first."""
        if not self.pending_changes():
            return None
        self._run("add", "-A", "--", ".", RAW_EXCLUDE)
        for path in provenance:
            # A wiki whose .gitignore keeps raw/ out (kb's earlier rule, or
            # the owner's) keeps it out: `kb wiki migrate` changes kb's rule.
            if path.startswith(f"{RAW_FOLDER}/parsed/") and (self.root() / path).is_file() and not self.ignored(path):
                self._run("add", "--", path)
        self._run("commit", "-q", "--no-verify", "-F", "-", input=message.strip() + "\n")
        return self.head()

    def pending_diff(self) -> str:
        """The diff of the working tree against HEAD, new files included, for
        the agent's read-only show_change tool."""
        parts = [self._run("diff", "--no-ext-diff", "--no-textconv", "HEAD", check=False).stdout]
        for change in self.pending_changes():
            file = self.root() / change.path
            if change.status == "A" and file.is_file() and not file.is_symlink():
                text = file.read_text(encoding="utf-8", errors="replace")
                parts.append(f"new file {change.path}\n" + "".join(f"+{line}\n" for line in text.splitlines()))
        diff = "\n".join(p for p in parts if p.strip()) or "no change yet"
        return diff if len(diff) <= MAX_DIFF_CHARS else diff[:MAX_DIFF_CHARS] + "\n[the diff is cut here]"

    def unpushed_secret_problem(self, secrets: dict[str, str] | None = None) -> str | None:
        """The second scan, before a push: the text that the commits after
        the last push added, and their messages. None when it holds no secret."""
        secrets = guarded_secrets() if secrets is None else secrets
        if not secrets:
            return None
        base = self._run("rev-parse", "--verify", "-q", PUSHED_REF, check=False).stdout.strip()
        span = f"{base}..HEAD" if base else "HEAD"
        # The whole text of the patches and messages: a secret on a removed
        # line is in the history that the push carries, too.
        added = self._run("log", "-p", "--format=%B", "--no-ext-diff", "--no-textconv", span).stdout
        found = secrets_in(added, secrets)
        if found:
            return (f"the push is stopped: the commits since the last push hold the value of {', '.join(found)}. "
                    f"Remove it from the wiki history before the next push")
        return None

    # --- push ---------------------------------------------------------------------

    def push(self) -> str | None:
        """Push the branch when a remote is set. Returns an error text, or None.
        A failed push is not a failed change: the commit stays, and the next
        push takes it."""
        remote = self.remote.get_secret_value().strip()
        if not remote:
            return None
        problem = self.unpushed_secret_problem()
        if problem:
            return problem
        url, credential_env = split_remote_credentials(remote)
        helper = ("-c", "credential.helper=", "-c", f"credential.helper={CREDENTIAL_HELPER}") if credential_env else ()
        proc = self._run(*helper, "push", "-q", url, f"HEAD:refs/heads/{BRANCH}", check=False, timeout=120,
                         env=credential_env)
        if proc.returncode != 0:
            detail = _redact_userinfo((proc.stderr or proc.stdout).strip())[:300]
            return f"push to the wiki remote failed: {detail}"
        self._run("update-ref", PUSHED_REF, "HEAD")
        return None


# The token of the wiki remote goes to git by a credential helper that reads
# it from git's environment: never in git's command line (`ps` and
# /proc/<pid>/cmdline show it to every user), in .git/config, or in the URL
# that git prints. The first, empty helper clears the helpers of the
# owner's git config, so that none of them (`store`) writes the token to a
# file. The helper text holds the names of the variables only.
CREDENTIAL_HELPER = ('!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n" '
                     '"$KB_WIKI_REMOTE_USERNAME" "$KB_WIKI_REMOTE_PASSWORD"; }; f')


def split_remote_credentials(remote: str) -> tuple[str, dict[str, str]]:
    """(the URL without user and token, the environment that carries them
    to the credential helper). A remote with no user part (a path, an ssh
    address, a plain URL) comes back as it is, with no environment."""
    parts = urlsplit(remote)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return remote, {}
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, token = userinfo.partition(":")
    url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return url, {"KB_WIKI_REMOTE_USERNAME": unquote(user), "KB_WIKI_REMOTE_PASSWORD": unquote(token)}


def _redact_userinfo(text: str) -> str:
    """A remote URL can hold a token (https://user:token@host/...): never log it."""
    return re.sub(r"//[^/@\s]+@", "//***@", text)


def _link_target(inner: str) -> str:
    """`sources/a#para3|text` -> `sources/a`."""
    return inner.split("|", 1)[0].split("#", 1)[0].strip()
