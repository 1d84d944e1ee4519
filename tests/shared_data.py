"""Locate ../shared (the design, real X captures, the eval set).

Tests read these files in place; they are never copied into the package.
Where ../shared is absent (a user's clone), such tests skip and say why;
with CI=true they fail instead, because CI must exercise them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KB_SHARED_DIR", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        reason = f"{path} is absent: the shared test data is not next to this clone"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason + " (CI=true: this must not skip)")
        pytest.skip(reason)
    return path


def x_fixture(name: str) -> Path:
    return shared_path("fixtures", "x", name)
