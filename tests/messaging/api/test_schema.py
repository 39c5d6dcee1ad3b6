"""The API's OpenAPI schema and docs, and a property-based fuzz of the API driven by that schema."""

from __future__ import annotations

import re

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from apps_registry.selectors import app_snapshots_clear

pytestmark = pytest.mark.django_db


def test_the_schema_documents_every_endpoint_with_the_bearer_scheme(anonymous_http):
    schema = anonymous_http.get("/api/schema/", headers={"Accept": "application/json"}).json()
    assert set(schema["paths"]) == {
        "/api/v1/messages", "/api/v1/messages/batch", "/api/v1/messages/{message_id}", "/api/v1/channels/{channel}/messages",
        "/api/v1/channels/{channel}/subscribers", "/api/v1/channels/{channel}/subscribers/{user_id}",
        "/api/v1/channels/{channel}/members", "/api/v1/users/{user_id}/subscriptions",
        "/api/v1/users/{user_id}/follows/{target_id}", "/api/v1/users/{user_id}/presence",
        "/api/v1/users/{user_id}/disconnect", "/api/v1/presence/online", "/api/v1/dead-letters", "/api/v1/dead-letters/requeue",
        "/api/v1/dead-letters/discard", "/messages", "/api/v1/events", "/api/v1/requests/{request_id}", "/api/v1/users/{user_id}/requests",
        "/api/v1/requests/{request_id}/resolve", "/api/v1/requests/{request_id}/reject", "/api/v1/exchange/users/{n}/followers",
        "/api/v1/exchange/users/{n}/followees",
        "/api/v1/operator/selftest", "/api/v1/operator/selftest/{name}",
    }
    assert schema["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http", "scheme": "bearer", "description": schema["components"]["securitySchemes"]["ApiKey"][
            "description"]}
    operator = schema["paths"]["/api/v1/operator/selftest"]["post"]
    assert operator["security"] == [{"OperatorKey": []}] and {"201", "401"} <= set(operator["responses"])
    sends = [schema["paths"]["/api/v1/messages"]["post"], schema["paths"]["/messages"]["post"],
             schema["paths"]["/api/v1/channels/{channel}/messages"]["post"]]
    for operation in sends:
        assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in operation["parameters"])
        assert {"401", "409", "429"} <= set(operation["responses"])
    assert schema["paths"]["/messages"]["post"]["responses"]["202"]


def test_the_docs_page_needs_nothing_from_the_internet(anonymous_http):
    page = anonymous_http.get("/api/docs/").text
    assert "swagger-ui" in page and not re.search(r"""(src|href)=["']https?://""", page)
    assets = re.findall(r"""(?:src|href)=["'](/static/[^"']+)["']""", page)
    assert assets and all(anonymous_http.get(asset).status_code == 200 for asset in assets)


# --- the fuzz ------------------------------------------------------------------------------------
# The schema is read from the app itself, in-process (the schema view needs no database); each
# generated request then runs against the test database through the same WSGI app. Every answer
# must be no 5xx, with a documented status, content type and body shape. Two checks are left out
# on purpose: a schema-valid request may still be refused (a well-formed user id of no user is a
# 404), and unknown query parameters are ignored, not refused.

fuzzed = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler())


@pytest.fixture
def fuzz_key(wsgi_app, anz, anz_key) -> str:
    anz.api_rate_limit_per_second = 100000  # the fuzz is not about the rate limit
    anz.api_rate_limit_burst = 100000
    anz.save()
    app_snapshots_clear()
    return anz_key


@fuzzed.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_the_schema_allows_makes_the_server_fail(case, fuzz_key):
    case.call_and_validate(headers={"Authorization": f"Bearer {fuzz_key}"},
                           excluded_checks=[positive_data_acceptance, negative_data_rejection])
