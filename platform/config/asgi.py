"""ASGI entry point for daphne: HTTP goes to Django (SSE streams to their own app; the calls between
domains, /internal/, to Django without the site's middleware: foundation.lean_http; a server's send,
POST /api/v1/messages, to the event loop's own endpoint: messaging.api.send_endpoint, which hands
what it does not answer itself to Django), WebSockets to the Channels consumers."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.urls import re_path  # noqa: E402

django_asgi_app = get_asgi_application()

from foundation.lean_http import lean_asgi_application  # noqa: E402
from foundation.patches import daphne as daphne_patches  # noqa: E402

daphne_patches.install()

from config.routing import stream_urlpatterns, websocket_urlpatterns  # noqa: E402  (needs the app registry)
from messaging.api.send_endpoint import SendEndpoint  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": URLRouter([*stream_urlpatterns, re_path(r"^internal/", lean_asgi_application()),
                           re_path(r"^api/v1/messages$", SendEndpoint(django_asgi_app)),
                           re_path(r"", django_asgi_app)]),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
