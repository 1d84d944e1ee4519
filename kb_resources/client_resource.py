"""The base of every kb resource: a thin Dagster wrapper that hands out a
Dagster-free client from the core (kb/), the pattern of Dagster's own
integrations.

A resource is the one path from the settings to its client: get_client()
builds the client with `Client.from_settings()` from the settings of the
process, as the MCP server, the web page and the bot do. The resource
holds no copy of the client's fields, so a setting has one place (its
field in kb/settings.py) and no list of fields can drift. A run worker
reads the same settings file as the code location that loaded the
Definitions (kb_assets/definitions.py), and a Reload reads it again.

`overrides` holds the values that differ from the settings: a test or a
command gives them to from_settings(). An override names a field of the
client, and never a secret: the client reads each secret from the
settings, so a secret is never in the resource config that the Dagster UI
shows, nor in `os.environ` (every process that kb starts gets that: git,
the agent's CLI, Chromium, and /proc shows it to the same user). Run
config cannot set a resource at all (kb_assets/run_config_rules.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

import dagster as dg
from pydantic import BaseModel, PrivateAttr

from kb.settings import Settings
from kb_resources.run_worker import tag_run_with_worker


class ClientResource(dg.ConfigurableResource):
    """A subclass sets `client_class`: a pydantic model with from_settings()."""

    client_class: ClassVar[type[BaseModel]]
    # Values that differ from the settings: client fields that hold no secret.
    overrides: dict[str, Any] = {}

    # One client per resource instance: a run shares its model, its
    # connection cache and its counters between the steps of one process.
    _client: Any = PrivateAttr(default=None)
    # The settings that from_settings() got, in the process that built the
    # resource. Dagster builds the resource again in a run (a copy of its
    # config, without this): that copy reads the settings of its process.
    _settings: Settings | None = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides):
        """The resource whose client takes its values from the settings, but
        for `overrides`."""
        check_overrides(cls, overrides)
        resource = cls(overrides=overrides)
        resource._settings = settings
        return resource

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # In a run worker: tag the run with the worker's host and boot, so
        # that run monitoring checks its process ids only on that host.
        if context.run is not None and context.instance is not None:
            tag_run_with_worker(context.instance, context.run)

    def get_client(self):
        if self._client is None:
            # Again here: the UI's launchpad can edit resource config when a
            # run does not go through kb's run launcher (a test, a script).
            check_overrides(type(self), self.overrides)
            self._client = self.client_class.from_settings(self._settings, **self.overrides)
        return self._client


def secret_fields(client_class: type[BaseModel]) -> list[str]:
    """The fields of the client that hold a secret (typed SecretStr)."""
    return sorted(name for name, field in client_class.model_fields.items() if "SecretStr" in str(field.annotation))


def check_overrides(cls: type[ClientResource], overrides: dict[str, Any]) -> None:
    """Refuse an override that names no field of the client, or a secret."""
    fields, secret = cls.client_class.model_fields, set(secret_fields(cls.client_class))
    unknown = sorted(name for name in overrides if name not in fields)
    if unknown:
        raise ValueError(f"{cls.__name__}.overrides: {unknown} are not fields of {cls.client_class.__name__}. "
                         f"Allowed: {sorted(set(fields) - secret)}.")
    secrets = sorted(name for name in overrides if name in secret)
    if secrets:
        raise ValueError(f"{cls.__name__}.overrides: {secrets} hold a secret. A resource carries no secret of its "
                         "own: the client reads it from kb's settings file or the environment.")
