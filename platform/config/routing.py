"""WebSocket URL routes, one list for the whole project."""

from __future__ import annotations

from django.urls import re_path

from messaging.consumers import ClientConsumer

websocket_urlpatterns = [
    re_path(r"^ws/?$", ClientConsumer.as_asgi()),
]
