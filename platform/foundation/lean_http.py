"""An ASGI handler for machine-to-machine endpoints: Django's, without the site's middleware.

The site's middleware chain (sessions, CSRF, authentication, messages, static files) serves people
and browsers, and WhiteNoise, which can only run synchronously, makes the whole chain synchronous:
every request through it crosses from the event loop to a thread and back before its view runs. A
call between domains (`/internal/v1/*`) needs none of it: it is signed, carries no cookie and
renders no page. `LeanASGIHandler` resolves and runs the view like Django's own handler, with only
the request-latency metric around it, so an async view (the internal endpoints are, running their
work on the web node's database threads) starts on the event loop and crosses to a thread once.
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

from foundation.http_metrics import request_latency_middleware


class LeanASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        view = convert_exception_to_response(self._get_response_async if is_async else self._get_response)
        self._middleware_chain = convert_exception_to_response(request_latency_middleware(view))


def lean_asgi_application() -> LeanASGIHandler:
    """The handler, for a path the ASGI router sends to it (Django must be set up first, as for
    django.core.asgi.get_asgi_application)."""
    return LeanASGIHandler()
