"""The base of every kb resource: a thin Dagster wrapper that hands out a
Dagster-free client from the core (kb/), the pattern of Dagster's own
integrations.

A resource owns its configuration: its fields are the client's fields, and
definitions.py builds it from the settings once. A secret field holds an
`EnvVar`, so the Dagster UI shows the variable's name, never its value.
The MCP server, the web page and the bot build the same clients from the
settings (`Client.from_settings()`) and never touch these classes.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import dagster as dg
from pydantic import BaseModel, PrivateAttr, SecretStr

from kb.settings import Settings
from kb_resources.run_worker import tag_run_with_worker


class ClientResource(dg.ConfigurableResource):
    """A subclass sets `client_class` and declares the client's fields.
    SECRETS maps a secret field to the environment variable that holds it."""

    client_class: ClassVar[type[BaseModel]]
    SECRETS: ClassVar[dict[str, str]] = {}

    # One client per resource instance: a run shares its model, its
    # connection cache and its counters between the steps of one process.
    _client: Any = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides):
        """The resource with the client's values from the settings."""
        client = cls.client_class.from_settings(settings, **overrides)
        values = {}
        for name in cls.model_fields:
            value = getattr(client, name)
            if name in cls.SECRETS:
                value = _secret_env(cls.SECRETS[name], value)
            values[name] = value
        return cls(**values)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # In a run worker: tag the run with the worker's host and boot, so
        # that run monitoring checks its process ids only on that host.
        if context.dagster_run is not None and context.instance is not None:
            tag_run_with_worker(context.instance, context.dagster_run)

    def get_client(self):
        if self._client is None:
            values = {name: _resolved(getattr(self, name)) for name in type(self).model_fields}
            self._client = self.client_class(**values)
        return self._client


def _secret_env(name: str, value: SecretStr | None) -> str | dg.EnvVar:
    """An EnvVar for a secret that is set. A key from the settings file
    (not the environment) goes into this process's environment first, so
    that the run workers that Dagster starts see it too."""
    secret = value.get_secret_value() if value else ""
    if not secret:
        return ""
    if os.environ.get(name) != secret:
        os.environ[name] = secret
    return dg.EnvVar(name)


def _resolved(value):
    # Outside a run Dagster does not resolve an EnvVar: read it here.
    return value.get_value() if isinstance(value, dg.EnvVar) else value
