"""The Dockerfile and docker-compose.yml, checked without Docker (there is
none on the development machine): the services, the files that they name,
and their commands must exist in this repository and its environment.
docs/deploy.md says what stays untested."""

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
EXTRA_VARIABLES = {"KB_CODE_SERVER_HOST", "KB_CODE_SERVER_PORT", "KB_POSTGRES_PASSWORD"}


def _commands(command) -> list[list[str]]:
    """The argument lists of a compose command (a list, or `sh -c "a && b"`)."""
    if command[:2] == ["sh", "-c"]:
        return [[w for w in shlex.split(part) if w != "exec"] for part in command[2].split("&&")]
    return [command]


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
    assert set(services) == {"postgres", "code", "webserver", "daemon", "bot"}

    # Every package that pip installs is copied into the image, and every
    # copied path exists.
    copied = {word for line in re.findall(r"^COPY (.+)$", dockerfile, re.M) for word in line.split()[:-1]}
    packages = {name.rstrip("*") for name in
                tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, packages - copied
    assert all((REPO / path).exists() for path in copied), copied

    fields = {name.upper() for name in Settings.model_fields}
    password = "a-test-password"
    for name, service in services.items():
        if service.get("image") != "kb:latest":
            continue
        for argv in _commands(service["command"]):
            _check_command(argv, copied)
        for key in service["environment"]:
            assert key in fields | EXTRA_VARIABLES | {"DAGSTER_HOME"}, f"{name}: {key} is not a kb setting"
        for other in service.get("depends_on", {}):
            assert other in services, f"{name} depends on {other}"
        url = service["environment"]["KB_DAGSTER_POSTGRES_URL"]
        url = re.sub(r"\$\{KB_POSTGRES_PASSWORD[^}]*\}", password, url)
        assert Settings(kb_dagster_postgres_url=url).kb_dagster_postgres_url.get_secret_value() == url
        assert url.split("@")[1].split(":")[0] in services  # the host is a service name
    # The image's default command is the code location's command.
    cmd = re.search(r"^CMD (.+)$", dockerfile, re.M).group(1)
    assert yaml.safe_load(cmd) == services["code"]["command"]
    # Dagster's gRPC has no authentication (issue 56): the code server serves on a
    # Unix socket in a volume that only the code server, the webserver and the
    # daemon mount, never on a TCP port. The workspace file names that socket.
    code = _commands(services["code"]["command"])[-1]
    assert "-h" not in code and "-p" not in code and "--port" not in code, code
    socket = code[code.index("--socket") + 1]
    assert "4000" not in re.search(r"^EXPOSE (.+)$", dockerfile, re.M).group(1)
    workspace = yaml.safe_load((REPO / "workspace-socket.yaml").read_text())
    assert workspace["load_from"] == [{"grpc_server": {"socket": socket, "location_name": "kb"}}]
    for name in ("webserver", "daemon"):
        assert "workspace-socket.yaml" in _commands(services[name]["command"])[-1], name
    folder = socket.rsplit("/", 1)[0]
    mounts = {name: {v.split(":")[1] for v in service.get("volumes", [])} for name, service in services.items()}
    assert [name for name, paths in mounts.items() if folder in paths] == ["code", "webserver", "daemon"]
    assert f"RUN mkdir -m 0700 {folder}" in dockerfile  # a new volume takes the mode of its folder in the image
    assert services["code"]["healthcheck"]["test"][-2:] == ["--socket", socket]
    # The cross-host workspace file names variables, and its note binds no 0.0.0.0.
    text = (REPO / "workspace-grpc.yaml").read_text()
    server = yaml.safe_load(text)["load_from"][0]["grpc_server"]
    assert (server["host"], server["port"]) == ({"env": "KB_CODE_SERVER_HOST"}, {"env": "KB_CODE_SERVER_PORT"})
    assert "-h 0.0.0.0 -p 4000" not in text


def test_no_doc_starts_an_unguarded_webserver_or_binds_grpc_to_every_address():
    """Issue 56: the docs started `dagster-webserver` without kb's guard and
    bound gRPC to 0.0.0.0:4000. Each command of the docs and the deployment
    files that starts the webserver goes through kb.apps.guarded_webserver."""
    files = [*REPO.glob("docs/*.md"), REPO / "README.md", REPO / "Dockerfile", REPO / "docker-compose.yml",
             *REPO.glob("workspace*.yaml")]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.name}:{number}: {line.strip()}"
            assert not re.search(r"(api grpc|code-server start).*(-h|--host) 0\.0\.0\.0", line), where
            for match in re.finditer(r"(?<![\w\"/-])dagster-webserver\s+-", line):
                assert "guarded_webserver" in line, where

