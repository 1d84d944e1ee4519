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
    # The workspace file names the variables that compose sets.
    workspace = yaml.safe_load((REPO / "workspace-grpc.yaml").read_text())
    server = workspace["load_from"][0]["grpc_server"]
    assert {server["host"]["env"], server["port"]["env"]} <= set(services["webserver"]["environment"])
