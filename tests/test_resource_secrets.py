"""The secrets of kb's resources (kb_resources/client_resource.py): a key
from the settings file or the environment reaches the client, and never
the environment of the process or the resource config that the Dagster
UI shows. A resource carries no secret of its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import pytest

from kb_resources.services import (CaptionerResource, QualityGateResource, TelegramNotifierResource,
                                   TranslatorResource, WikiAgentResource)
from kb_resources.stores import ChunkIndexResource, WikiResource

TOKEN = "TEST-SECRET-remote-token-5555"
FILE_SECRETS = {
    "GROQ_API_KEY": "gsk-TEST-SECRET-file-1111",
    "DEEPSEEK_API_KEY": "sk-TEST-SECRET-file-2222",
    "ANTHROPIC_AUTH_TOKEN": "sk-TEST-SECRET-file-3333",
    "TELEGRAM_BOT_TOKEN": "123456:TEST-SECRET-file-4444",
    "KB_CAPTION_API_KEY": "TEST-SECRET-caption-6666",
    "KB_S3_ACCESS_KEY_ID": "TEST-SECRET-s3-id-7777",
    "KB_S3_SECRET_ACCESS_KEY": "TEST-SECRET-s3-key-8888",
    "KB_WIKI_REMOTE": f"https://owner:{TOKEN}@git.example.org/wiki.git",
}
# Each resource with its secret fields, and the variable of each.
RESOURCES = [(TranslatorResource, "api_key", "GROQ_API_KEY"), (QualityGateResource, "api_key", "DEEPSEEK_API_KEY"),
             (WikiAgentResource, "auth_token", "ANTHROPIC_AUTH_TOKEN"),
             (TelegramNotifierResource, "bot_token", "TELEGRAM_BOT_TOKEN"),
             (CaptionerResource, "api_key", "KB_CAPTION_API_KEY"),
             (ChunkIndexResource, "s3_access_key_id", "KB_S3_ACCESS_KEY_ID"),
             (ChunkIndexResource, "s3_secret_access_key", "KB_S3_SECRET_ACCESS_KEY"),
             (WikiResource, "remote", "KB_WIKI_REMOTE")]


@pytest.fixture
def settings_file(kb_home):
    path = Path(os.environ["KB_ENV_FILE"])
    path.write_text("".join(f"{name}={value}\n" for name, value in FILE_SECRETS.items()))
    return path


def leaked_into_environment() -> list[str]:
    secrets = [*FILE_SECRETS.values(), TOKEN]
    return sorted(name for name, value in os.environ.items() if any(s in value for s in secrets))


def shown_config(resource: dg.ConfigurableResource) -> str:
    """The config values that the Dagster UI shows for the resource."""
    return json.dumps(resource.get_resource_definition().config_schema.as_field().default_value)


def test_a_key_of_the_settings_file_reaches_the_client_and_not_the_environment(settings_file):
    for resource_class, field, name in RESOURCES:
        resource = resource_class.from_settings()
        shown = shown_config(resource)
        assert not [s for s in FILE_SECRETS.values() if s in shown] and TOKEN not in shown
        client = resource.get_client()
        assert getattr(client, field).get_secret_value() == FILE_SECRETS[name], (resource_class.__name__, field)
    assert leaked_into_environment() == []


def test_a_run_rebuilds_the_resource_and_its_client_gets_the_key(settings_file):
    """Dagster builds the resource again from its config in a run: the
    config holds no key, so the client reads it from the settings."""
    seen = {}

    @dg.asset
    def translated(translator: TranslatorResource) -> None:
        seen["key"] = translator.get_client().api_key.get_secret_value()
        seen["environment"] = leaked_into_environment()

    result = dg.materialize([translated], resources={"translator": TranslatorResource.from_settings()})
    assert result.success
    assert seen == {"key": FILE_SECRETS["GROQ_API_KEY"], "environment": []}
    assert leaked_into_environment() == []


def test_a_key_of_the_environment_reaches_the_client_and_not_the_config(settings_file, monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", "gsk-TEST-SECRET-environment-9999")
    resource = TranslatorResource.from_settings()
    assert "gsk-TEST-SECRET-environment-9999" not in shown_config(resource)
    assert resource.get_client().api_key.get_secret_value() == "gsk-TEST-SECRET-environment-9999"


def test_an_override_cannot_carry_a_secret(settings_file):
    """A command or a test that gives a key as an override: refused, and the
    message names the field, not the value."""
    for resource_class, field, _ in RESOURCES:
        with pytest.raises(ValueError, match=rf"{resource_class.__name__}.overrides: \['{field}'\] hold a secret") as refused:
            resource_class.from_settings(**{field: "gsk-TEST-SECRET-elsewhere-0000"})
        assert "gsk-TEST-SECRET-elsewhere-0000" not in str(refused.value)
    assert leaked_into_environment() == []


def test_a_resource_config_edited_in_the_launchpad_cannot_point_a_secret_elsewhere(settings_file):
    """An attacker who edits the resource config (the launchpad, when a run
    does not pass kb's run launcher) sets the key or a field that the client
    does not have: the client is not built, and nothing is sent."""
    resource = ChunkIndexResource.from_settings()
    for overrides, reason in (({"s3_access_key_id": "AKIA-TEST-attacker"}, "hold a secret"),
                              ({"s3_endpoint": "http://127.0.0.1:9", "aws_key": "x"}, "are not fields of ChunkIndex")):
        edited = resource.model_copy(update={"overrides": overrides})
        with pytest.raises(ValueError, match=rf"ChunkIndexResource.overrides: .* {reason}"):
            edited.get_client()


def test_an_honest_override_reaches_the_client_with_the_key_of_the_settings(settings_file):
    client = TranslatorResource.from_settings(model="llama-test", max_retries=0).get_client()
    assert (client.model, client.max_retries) == ("llama-test", 0)
    assert client.api_key.get_secret_value() == FILE_SECRETS["GROQ_API_KEY"]


# --- a run worker: another process, which builds the resource from its own settings ----------


@dg.asset
def key_check(translator: TranslatorResource) -> dg.MaterializeResult:
    key = translator.get_client().api_key
    return dg.MaterializeResult(metadata={
        "key_matches": key is not None and key.get_secret_value() == FILE_SECRETS["GROQ_API_KEY"],
        "environment": ",".join(leaked_into_environment()), "pid": os.getpid()})


def key_check_job() -> dg.JobDefinition:
    """Built in the worker process too, as a code location builds its
    resources from the settings (kb_assets/definitions.py)."""
    return dg.Definitions(assets=[key_check], jobs=[dg.define_asset_job("key_check_job")],
                          resources={"translator": TranslatorResource.from_settings()}).resolve_job_def("key_check_job")


@pytest.mark.slow  # a run worker process imports Dagster
def test_a_run_worker_process_gets_the_key_from_the_settings_file(settings_file, monkeypatch):
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    # multiprocessing gives the worker this process's sys.path, not PYTHONPATH:
    # the worker imports this module (tests.test_resource_secrets) from the repo.
    monkeypatch.syspath_prepend(str(repo))
    assert "GROQ_API_KEY" not in os.environ
    with dg.instance_for_test() as instance:
        result = dg.execute_job(dg.reconstructable(key_check_job), instance=instance)
        assert result.success
        [event] = result.get_asset_materialization_events()
        metadata = {k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()}
    assert metadata["pid"] != os.getpid()  # the step ran in its own process
    assert metadata["key_matches"] is True and metadata["environment"] == ""
    assert leaked_into_environment() == []
