"""HTTP views of messaging: the demo client page."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from apps_registry.services import DEMO_APP


def demo_client(request: HttpRequest) -> HttpResponse:
    """A page to try the WebSocket protocol by hand; it holds no secrets (auth happens on the socket),
    but it names the demo app's appId, so it is served only where DEMO_ENABLED (off in production)."""
    if not settings.DEMO_ENABLED:
        raise Http404("the demo page is disabled (DEMO_ENABLED)")
    user_id = request.GET.get("user") or f"{DEMO_APP['app_name']}-{secrets.randbelow(900000) + 100000}"
    return render(request, "demo/client.html", {"app_id": DEMO_APP["app_id"], "user_id": user_id})
