"""The Dockerfile and docker-compose.yml, checked without a container engine:
the services, the files that they name, and their commands must exist in
this repository and its environment; each service keeps the isolation of
section 13 of the specification. tests/test_containers.py builds and
starts them with podman."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import tomllib
from pathlib import Path

import yaml

from kb.settings import Settings

REPO = Path(__file__).resolve().parent.parent
# Not kb settings: the proxy variables that httpx and Node read (the model endpoints' clients, the Claude CLI).
EXTRA_VARIABLES = {"KB_CODE_SERVER_SOCKET", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"}
SERVICES = {"code", "daemon", "webserver", "bot", "web", "egress", "egress-bot"}
# The volumes that a part may write, and the parts that may mount each one.
WRITERS = {"kb-wiki": {"code"}, "kb-raw": {"code"}, "kb-index": {"code"}, "kb-data": {"code"}, "kb-cache": {"code"},
           "kb-inbox": {"code", "bot"}, "kb-dagster": {"code", "daemon", "webserver", "bot"}, "kb-grpc": {"code"}}
READERS = {"kb-wiki": {"web"}, "kb-index": {"web"}, "kb-cache": {"web"}, "kb-grpc": {"daemon", "webserver"}}


def _commands(command) -> list[list[str]]:
    """The argument lists of a compose command (a list, or `sh -c "a && b"`)."""
    if command[:2] != ["sh", "-c"]:
        return [command]
    commands = []
    for part in command[2].split("&&"):
        words = [w for w in shlex.split(part) if w != "exec"]
        if words[0] == "until":  # `until CMD; do sleep N; done`: the wait for the code server
            end = next(i for i, w in enumerate(words) if w.endswith(";"))
            words = words[1:end] + [words[end].rstrip(";")]
        commands.append(words)
    return commands


def _check_command(argv: list[str], copied: set[str]) -> None:
    from dagster._cli import cli as dagster_cli
    from dagster._daemon.cli import cli as daemon_cli

    program = argv[0]
    bin_dir = Path(sys.executable).parent
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    if program == "python":
        assert argv[1] == "-m" and importlib.util.find_spec(argv[2]), argv
        if argv[2] == "kb.apps.guarded_webserver":  # the guard runs the installed webserver script
            assert argv[3] == "$(command -v dagster-webserver)" and (bin_dir / "dagster-webserver").exists(), argv
    elif program == "dagster":
        group = dagster_cli.commands[argv[1]]
        assert argv[2] in group.commands, argv
    elif program == "rm":  # the code server's old socket
        assert argv[1:] == ["-f", "/run/kb-grpc/code.sock"], argv
        return
    elif program == "dagster-daemon":
        assert argv[1] in daemon_cli.commands, argv
    else:
        assert program in scripts or program == "dagster-webserver", argv
    assert program == "python" or (bin_dir / program).exists(), f"{program} is not installed"
    for flag, value in zip(argv, argv[1:]):
        if flag == "-m" and program != "python":
            assert importlib.util.find_spec(value), argv
        if flag == "-w":
            assert (REPO / value).is_file() and value in copied, f"{value} is not in the image"


def test_compose_and_dockerfile_refer_to_real_files_and_commands():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    dockerfile = (REPO / "Dockerfile").read_text()
    services = compose["services"]
    assert set(services) == SERVICES

    # Every package that pip installs is copied into the image, and every
    # copied path exists.
    copied = {word for line in re.findall(r"^COPY (.+)$", dockerfile, re.M) for word in line.split()[:-1]}
    packages = {name.rstrip("*") for name in
                tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, packages - copied
    assert all((REPO / path).exists() for path in copied), copied

    fields = {name.upper() for name in Settings.model_fields}
    for name, service in services.items():
        assert service["image"] == "kb:latest", name
        for argv in _commands(service["command"]):
            _check_command(argv, copied)
        for key in service.get("environment", {}):
            assert key in fields | EXTRA_VARIABLES, f"{name}: {key} is not a kb setting"
        for other in service.get("depends_on", []):
            assert other in services, f"{name} depends on {other}"
    # The image's default command is the code location's command.
    cmd = re.search(r"^CMD (.+)$", dockerfile, re.M).group(1)
    assert yaml.safe_load(cmd) == services["code"]["command"]
    # The workspace file names the variable that compose sets.
    workspace = yaml.safe_load((REPO / "workspace-grpc.yaml").read_text())
    server = workspace["load_from"][0]["grpc_server"]
    for name in ("daemon", "webserver"):
        assert services[name]["environment"][server["socket"]["env"]] == "/run/kb-grpc/code.sock"
    # Dagster's gRPC has no authentication (issue 56): the code server serves on a
    # Unix socket in a volume that only the code server, the webserver and the
    # daemon mount, never on a TCP port.
    code = _commands(services["code"]["command"])[-1]
    assert "-h" not in code and "-p" not in code and "--port" not in code, code
    socket = code[code.index("--socket") + 1]
    assert "4000" not in re.search(r"^EXPOSE (.+)$", dockerfile, re.M).group(1)
    folder = socket.rsplit("/", 1)[0]
    mounts = {name: {v.split(":")[1] for v in service.get("volumes", [])} for name, service in services.items()}
    assert sorted(name for name, paths in mounts.items() if folder in paths) == ["code", "daemon", "webserver"]


def test_each_service_keeps_the_isolation_of_the_specification():
    """Section 13: a read-only root, no capabilities, no new privileges, uid
    1000, a tmpfs for scratch; the volumes that a part writes are the ones
    it needs; ports on loopback only; each part its own secrets file."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert set(services) == SERVICES
    secret_files = []
    for name, service in services.items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"] and "cap_add" not in service, name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert not any(o.startswith(("seccomp", "apparmor", "label")) for o in service["security_opt"]), name
        assert service["user"] == "1000:1000" and "privileged" not in service, name
        assert any(t.startswith("/tmp:") for t in service["tmpfs"]), name
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source, target, *mode = volume.split(":")
            allowed = WRITERS.get(source, set()) if not mode else READERS.get(source, set()) | WRITERS.get(source, set())
            assert name in allowed, f"{name} mounts {source} at {target} {'read-only' if mode else 'writable'}"
            assert mode in ([], ["ro"]), volume
        files = service["env_file"] if isinstance(service["env_file"], list) else [service["env_file"]]
        assert files[0] == "deploy/settings.env" and files[1:] in ([], [f"deploy/secrets/{name}.env"]), name
        secret_files += files[1:]
    assert sorted(secret_files) == ["deploy/secrets/bot.env", "deploy/secrets/code.env"]
    # The shared file holds no secret: every name in it is a kb setting of another type.
    shared = (REPO / "deploy/settings.env").read_text()
    names = {line.split("=", 1)[0] for line in shared.splitlines() if line.strip() and not line.startswith("#")}
    secrets = {n.upper() for n, f in Settings.model_fields.items() if "Secret" in str(f.annotation)}
    assert names and not names & secrets, names & secrets
    # Only the code location's room needs its own /proc (bubblewrap), and it
    # runs the agent only in the room.
    assert [n for n, s in services.items() if "systempaths=unconfined" in s["security_opt"]] == ["code"]
    assert services["code"]["environment"]["KB_AGENT_SANDBOX"] == "bwrap"
    # The daemon alone on an internal network: no way out, no other part.
    networks = yaml.safe_load((REPO / "docker-compose.yml").read_text())["networks"]
    assert services["daemon"]["networks"] == ["kb-daemon"] and networks["kb-daemon"] == {"internal": True}
    assert [n for n, s in services.items() if "kb-daemon" in s.get("networks", [])] == ["daemon"]
    # Egress: `code` and `bot` each on an internal network with its proxy, and on no other
    # network; only the proxies are on kb-out. kb's clients and the others use the part's own proxy.
    members = {net: sorted(n for n, s in services.items() if net in s.get("networks", [])) for net in networks}
    assert members["kb-out"] == ["egress", "egress-bot"] and networks["kb-out"] == {}
    for part, proxy, net in (("code", "egress", "kb-code-egress"), ("bot", "egress-bot", "kb-bot-egress")):
        assert services[part]["networks"] == [net] and networks[net] == {"internal": True}, part
        assert members[net] == sorted([part, proxy]), members[net]
        env = services[part]["environment"]
        assert env["KB_EGRESS_PROXY"] == env["HTTPS_PROXY"] == env["HTTP_PROXY"] == f"http://{proxy}:3128", part
        assert services[proxy]["command"][:3] == ["python", "-m", "kb.guards.egress_proxy"], proxy
    assert services["egress-bot"]["command"][-2:] == ["--only", "TELEGRAM_API_BASE"]
    assert "--only" not in services["egress"]["command"]


def test_no_doc_starts_an_unguarded_webserver_or_binds_grpc_to_every_address():
    """Issue 56: the docs started `dagster-webserver` without kb's guard and
    bound gRPC to 0.0.0.0:4000. Each command of the docs and the deployment
    files that starts the webserver goes through kb.apps.guarded_webserver."""
    files = [*REPO.glob("docs/*.md"), REPO / "README.md", REPO / "Dockerfile", REPO / "docker-compose.yml",
             *REPO.glob("workspace*.yaml")]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.name}:{number}: {line.strip()}"
            # One command: up to the next `;` or `&&` of a shell line.
            assert not re.search(r"(api grpc |code-server start)[^;&]*(-h|--host) 0\.0\.0\.0", line), where
            for match in re.finditer(r"(?<![\w\"/-])dagster-webserver\s+-", line):
                assert "guarded_webserver" in line, where
