"""The base of every kb resource: a thin Dagster wrapper that hands out a
Dagster-free client from the core (kb/), the pattern of Dagster's own
integrations.

A resource owns its configuration: its fields are the client's fields, and
definitions.py builds it from the settings once. The Dagster UI shows the
fields, so a secret never goes into one: a secret that the environment
holds is an `EnvVar` (the UI shows the variable's name), and a secret from
the settings file is named in `secrets_from_settings` (the UI shows the
field's name). The client gets the secret as a constructor argument, read
from the settings of the process that builds it. A run worker reads the
same settings file. Why not export the secret to `os.environ`: every
process that kb starts then gets it (git, the agent's CLI, Chromium), and
the environment of a process is readable in /proc by the same user.
The MCP server, the web page and the bot build the same clients from the
settings (`Client.from_settings()`) and never touch these classes.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import dagster as dg
from pydantic import BaseModel, PrivateAttr, SecretStr

from kb.settings import Settings, get_settings
from kb_resources.run_worker import tag_run_with_worker


class ClientResource(dg.ConfigurableResource):
    """A subclass sets `client_class` and declares the client's fields.
    SECRETS maps a secret field to the environment variable that holds it."""

    client_class: ClassVar[type[BaseModel]]
    SECRETS: ClassVar[dict[str, str]] = {}
    # The secret fields whose value the client reads from kb's settings
    # when it is built (a secret of the settings file). Only names of
    # SECRETS are allowed.
    secrets_from_settings: list[str] = []

    # One client per resource instance: a run shares its model, its
    # connection cache and its counters between the steps of one process.
    _client: Any = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides):
        """The resource with the client's values from the settings."""
        client = cls.client_class.from_settings(settings, **overrides)
        values: dict[str, Any] = {"secrets_from_settings": []}
        for name in cls.client_fields():
            value = getattr(client, name)
            if name in cls.SECRETS:
                value = _secret_field(f"{cls.__name__}.{name}", cls.SECRETS[name], value)
                if value is FROM_SETTINGS:
                    values["secrets_from_settings"].append(name)
                    value = ""
            values[name] = value
        return cls(**values)

    @classmethod
    def client_fields(cls) -> list[str]:
        """The fields that the client has too: every field but secrets_from_settings."""
        return [name for name in cls.model_fields if name != "secrets_from_settings"]

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # In a run worker: tag the run with the worker's host and boot, so
        # that run monitoring checks its process ids only on that host.
        if context.dagster_run is not None and context.instance is not None:
            tag_run_with_worker(context.instance, context.dagster_run)

    def get_client(self):
        if self._client is None:
            values = {name: _resolved(getattr(self, name)) for name in self.client_fields()}
            values.update(self._secrets_from_settings())
            self._client = self.client_class(**values)
        return self._client

    def _secrets_from_settings(self) -> dict[str, Any]:
        unknown = [name for name in self.secrets_from_settings if name not in self.SECRETS]
        if unknown:
            raise ValueError(f"{type(self).__name__}.secrets_from_settings={unknown}: these fields hold no "
                             f"secret. Allowed: {sorted(self.SECRETS)}.")
        return {name: _setting(self.SECRETS[name]) for name in self.secrets_from_settings}


# The secret is in the settings file, not in the environment.
FROM_SETTINGS = object()


def _secret_field(field: str, name: str, value: SecretStr | None) -> str | dg.EnvVar | object:
    """The field value of a secret: "" when none is set, an EnvVar when
    the environment holds it, FROM_SETTINGS when kb's settings hold it.
    Nothing is written to the environment."""
    secret = value.get_secret_value() if value else ""
    if not secret:
        return ""
    if os.environ.get(name) == secret:
        return dg.EnvVar(name)
    if _setting(name) == secret:
        return FROM_SETTINGS
    # A run worker builds the client again from its own settings, so a
    # secret that neither they nor the environment hold cannot reach it.
    raise ValueError(f"{field}: the secret is not the value of {name} in the environment or in kb's "
                     "settings file. A resource carries no secret of its own: put it in the settings file "
                     "or the environment.")


def _setting(name: str) -> str:
    """The secret of kb's settings for the variable `name` ("" when unset).
    The settings field of a secret has the name of its variable (kb/settings.py)."""
    secret = getattr(get_settings(), name.lower())
    return secret.get_secret_value() if secret else ""


def _resolved(value):
    # Outside a run Dagster does not resolve an EnvVar: read it here.
    return value.get_value() if isinstance(value, dg.EnvVar) else value
