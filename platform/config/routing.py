"""WebSocket URL routes, one list for the whole project."""

from __future__ import annotations

from django.urls import path  # noqa: F401

websocket_urlpatterns: list = []
