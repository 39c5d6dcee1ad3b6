"""ASGI entry point of the baseline relay: `daphne bench.relay.asgi:application`.

WebSocket only: the relay serves `/ws` and nothing else.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.relay.settings")
django.setup()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs django.setup())
from django.urls import path  # noqa: E402

from bench.relay.consumers import RelayConsumer  # noqa: E402

application = ProtocolTypeRouter({"websocket": URLRouter([path("ws", RelayConsumer.as_asgi())])})
