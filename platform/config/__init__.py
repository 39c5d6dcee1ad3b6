"""The composition root: settings, urls, asgi and the Celery app wire the apps together (lives in
platform/config; see docs/architecture.md, "Layers")."""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ["celery_app"]
