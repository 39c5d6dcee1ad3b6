"""/metrics: HTTP request latency by endpoint (the URL pattern's name, never the raw path), and
the server API's sends and errors."""

from __future__ import annotations

import pytest
from switchboard_client import ApiError

pytestmark = pytest.mark.django_db


def _metrics(client) -> str:
    return client.get("/metrics").content.decode()


def test_request_latency_is_counted_by_route_name_not_path(client, api, http):
    api.presence("ANZ-424242")
    http.get("/api/v1/no/such/path/ANZ-777")
    text = _metrics(client)
    assert 'switchboard_http_request_duration_seconds_count{method="GET",route="api-user-presence",status="2xx"}' in text
    assert 'route="api-not-found"' in text
    assert "ANZ-424242" not in text and "ANZ-777" not in text


def test_api_sends_are_counted_by_feature_and_errors_by_code(client, api):
    api.send("ANZ-1", "x")
    api.send("ANZ-1", "x", feature="FAST")
    api.publish("news", "x")
    with pytest.raises(ApiError):
        api.send("BNZ-1", "x")
    text = _metrics(client)
    for feature in ("RELIABLE", "FAST", "CHANNEL"):
        assert f'switchboard_api_sends_total{{feature="{feature}"}}' in text
    assert 'switchboard_api_errors_total{code="unknown_user"}' in text
