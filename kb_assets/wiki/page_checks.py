"""The deterministic wiki checks as Dagster asset checks on `wiki_pages`.
The rules themselves live in kb/wiki/checks.py, so `kb wiki check` and these
checks give the same findings."""

from kb_assets.keys import WIKI_PAGES
import dagster as dg

from kb.wiki.checks import FINDING_KINDS, check_wiki
from kb_resources.stores import WikiResource



@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name=f"wiki_{kind}", asset=WIKI_PAGES, description=f"No {kind.replace('_', ' ')} in the wiki.")
           for kind in FINDING_KINDS],
    can_subset=False,
)
def wiki_quality(wiki: WikiResource):
    """The deterministic findings on the whole wiki, one check per kind.
    They warn and do not block: the daily lint agent fixes them."""
    wiki = wiki.get_client()
    root = wiki.ensure()
    findings = check_wiki(root)
    for kind in FINDING_KINDS:
        items = findings[kind]
        yield dg.AssetCheckResult(
            asset_key=WIKI_PAGES,
            check_name=f"wiki_{kind}",
            passed=not items,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"count": len(items), "first": dg.MetadataValue.json(items[:20])},
        )
