"""An ASGI handler for machine-to-machine endpoints: Django's, without the site's middleware.

The site's middleware chain (sessions, CSRF, authentication, messages, static files) serves people
and browsers, and WhiteNoise, which can only run synchronously, makes the whole chain synchronous:
every request through it crosses from the event loop to a thread and back before its view runs. A
call between domains (`/internal/v1/*`) needs none of it: it is signed, carries no cookie and
renders no page. `LeanASGIHandler` resolves and runs the view like Django's own handler, with only
the request-latency metric around it (set in Django's handler by foundation.patches.django), so an async view (the internal endpoints are, running their
work on the web node's database threads) starts on the event loop and crosses to a thread once.
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler

from foundation.http_metrics import request_latency_middleware
from foundation.patches.django import middleware_chain_set


class LeanASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        middleware_chain_set(self, request_latency_middleware, is_async)


def lean_asgi_application() -> LeanASGIHandler:
    """The handler, for a path the ASGI router sends to it (Django must be set up first, as for
    django.core.asgi.get_asgi_application)."""
    return LeanASGIHandler()
