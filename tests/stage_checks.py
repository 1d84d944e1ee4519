"""What a run says of a stage: the stage check of kb_assets/enrich/enrichment.py."""

import dagster as dg


def stage_failure(result, asset: str) -> str:
    """Why the stage check of `asset` failed in `result` (a run in this
    process); "" when it passed. The check must be there, with severity ERROR."""
    for evaluation in result.get_asset_check_evaluations():
        if evaluation.check_name == f"{asset}_stage":
            assert evaluation.severity == dg.AssetCheckSeverity.ERROR
            return "" if evaluation.passed else evaluation.description
    raise AssertionError(f"the run has no stage check of {asset}")


def coverage(result, asset: str):
    """The coverage check of `asset` in `result`."""
    [check] = [evaluation for evaluation in result.get_asset_check_evaluations()
               if evaluation.check_name == f"{asset}_coverage"]
    return check
