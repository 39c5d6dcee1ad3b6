"""ASGI entry point for daphne: HTTP goes to Django, WebSockets to the Channels consumers."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from config import daphne_patches  # noqa: E402

daphne_patches.install()

from config.routing import websocket_urlpatterns  # noqa: E402  (needs the app registry)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
