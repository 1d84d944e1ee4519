"""The status panel's answer of `kb web` (kb/apps/web/app.py): a page that
polls /api/status does not make each service answer again each time."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

import kb.apps.web.app as web_app
from kb.settings import get_settings


@pytest.fixture
def collections(monkeypatch):
    """Each collection of the status, counted; the services are not asked."""
    made = []

    def collect(settings, index, wiki):
        made.append(len(made) + 1)
        return {"collection": len(made)}

    monkeypatch.setattr(web_app, "collect_web_status", collect)
    return made


def test_the_status_is_collected_once_for_many_requests(collections):
    client = TestClient(web_app.create_app(get_settings()), base_url="http://127.0.0.1")
    answers = [client.get("/api/status").json() for _ in range(5)]
    assert answers == [{"collection": 1}] * 5 and collections == [1]


def test_an_expired_status_is_collected_again(collections, monkeypatch):
    monkeypatch.setattr(web_app, "STATUS_CACHE_S", 0)  # each answer expires at once
    client = TestClient(web_app.create_app(get_settings()), base_url="http://127.0.0.1")
    assert [client.get("/api/status").json()["collection"] for _ in range(3)] == [1, 2, 3]
