"""A small code location for tests/test_control_plane.py: the Dagster
webserver behind kb's guard loads it in seconds, and a launched run of
`touch_job` shows in the instance (an attack that gets through leaves a run).
It also holds two real jobs of kb with their real resources and config:
`wiki_index_job` (the resources lance, wiki and embedder) and `backup_job`
(op config), which the run config attacks use."""

import dagster as dg

from kb_assets.backups import backup_job
from kb_assets.index.wiki_index import wiki_index
from kb_assets.jobs import wiki_index_job
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, WikiResource


@dg.op
def touch() -> None:
    pass


@dg.job
def touch_job() -> None:
    touch()


defs = dg.Definitions(assets=[wiki_index], jobs=[touch_job, wiki_index_job, backup_job],
                      resources={"wiki": WikiResource.from_settings(), "embedder": EmbedderResource.from_settings(),
                                 "lance": ChunkIndexResource.from_settings()})
