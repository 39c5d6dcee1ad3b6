"""HTTP request latency by endpoint, for /metrics.

Labelled by the resolved URL pattern's name (`api-messages`, `admin:index`), never the raw path:
paths carry ids and user names, and a label per distinct path would grow without bound. A request
that matched no pattern is `unmatched`. The middleware works in both modes (daphne runs Django
async): a sync-only middleware would cost every request a thread hop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware
from prometheus_client import Histogram

from foundation.metrics import REGISTRY

REQUEST_LATENCY = Histogram(
    "switchboard_http_request_duration_seconds", "HTTP requests by endpoint (URL pattern name), method and status class",
    ["route", "method", "status"], registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


def _observe(request: HttpRequest, response: HttpResponseBase, started: float) -> None:
    match = getattr(request, "resolver_match", None)
    route = (match.view_name or match.route or "unnamed") if match is not None else "unmatched"
    method = request.method if request.method in METHODS else "other"
    REQUEST_LATENCY.labels(route, method, f"{response.status_code // 100}xx").observe(time.perf_counter() - started)


@sync_and_async_middleware
def request_latency_middleware(get_response: Callable) -> Callable:
    if iscoroutinefunction(get_response):
        async def middleware(request: HttpRequest) -> HttpResponseBase:
            started = time.perf_counter()
            response = await get_response(request)
            _observe(request, response, started)
            return response
    else:
        def middleware(request: HttpRequest) -> HttpResponseBase:
            started = time.perf_counter()
            response = get_response(request)
            _observe(request, response, started)
            return response
    return middleware
