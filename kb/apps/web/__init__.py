"""The search page in the browser (`kb web`). See app.py."""

from kb.apps.web.app import create_app, serve

__all__ = ["create_app", "serve"]
