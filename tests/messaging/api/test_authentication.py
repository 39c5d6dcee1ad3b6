"""Per-app API keys: only a valid key of an app gets in, and only to that app."""

from __future__ import annotations

import pytest
from django.test import override_settings

from apps_registry.models import ApiKey
from apps_registry.services import api_key_revoke
from messaging.api.authentication import verified_keys_forget

pytestmark = pytest.mark.django_db

# One request per endpoint: (method, path, body).
ENDPOINTS = [
    ("POST", "/api/v1/messages", {"to": "ANZ-1", "content": "x"}),
    ("GET", "/api/v1/messages/1", None),
    ("POST", "/api/v1/channels/news/messages", {"content": "x"}),
    ("GET", "/api/v1/channels/news/messages", None),
    ("GET", "/api/v1/channels/news/subscribers", None),
    ("PUT", "/api/v1/channels/news/subscribers/ANZ-1", None),
    ("DELETE", "/api/v1/channels/news/subscribers/ANZ-1", None),
    ("GET", "/api/v1/channels/news/members", None),
    ("GET", "/api/v1/users/ANZ-1/subscriptions", None),
    ("PUT", "/api/v1/users/ANZ-1/follows/ANZ-2", None),
    ("DELETE", "/api/v1/users/ANZ-1/follows/ANZ-2", None),
    ("GET", "/api/v1/users/ANZ-1/presence", None),
    ("POST", "/api/v1/users/ANZ-1/disconnect", None),
    ("GET", "/api/v1/dead-letters", None),
    ("POST", "/api/v1/dead-letters/requeue", {"ids": [1]}),
    ("POST", "/api/v1/dead-letters/discard", {"ids": [1]}),
    ("POST", "/messages", {"channel": "news", "message": "x"}),
]


@pytest.mark.parametrize("method, path, body", ENDPOINTS)
def test_every_endpoint_refuses_a_request_without_a_key(anonymous_http, anz, method, path, body):
    response = anonymous_http.request(method, path, json=body)
    assert response.status_code == 401
    assert response.json() == {"error": "unauthenticated", "detail": "Authentication credentials were not provided."}
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("method, path, body", ENDPOINTS)
def test_every_endpoint_refuses_a_wrong_key(anonymous_http, anz_key, method, path, body):
    wrong = anz_key[:-2] + ("AA" if not anz_key.endswith("AA") else "BB")
    response = anonymous_http.request(method, path, json=body, headers={"Authorization": f"Bearer {wrong}"})
    assert response.status_code == 401 and response.json()["error"] == "invalid_api_key"


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer sb_nothing.at-all", "Token abc",
                                    "Bearer " + "x" * 300])
def test_malformed_or_unknown_credentials_are_refused(anonymous_http, anz, header):
    response = anonymous_http.get("/api/v1/users/ANZ-1/presence", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["error"] in ("invalid_api_key", "unauthenticated")


def test_a_revoked_key_is_refused_once_the_node_forgets_it(anonymous_http, anz_key):
    headers = {"Authorization": f"Bearer {anz_key}"}
    assert anonymous_http.get("/api/v1/users/ANZ-1/presence", headers=headers).status_code == 200
    api_key_revoke(api_key=ApiKey.objects.get())
    verified_keys_forget()  # what API_KEY_CACHE_SECONDS does on its own within seconds
    response = anonymous_http.get("/api/v1/users/ANZ-1/presence", headers=headers)
    assert response.status_code == 401 and response.json()["detail"] == "invalid or revoked API key"


@override_settings(API_KEY_CACHE_SECONDS=0)
def test_without_the_cache_a_revocation_applies_to_the_very_next_request(anonymous_http, anz_key):
    headers = {"Authorization": f"Bearer {anz_key}"}
    assert anonymous_http.get("/api/v1/users/ANZ-1/presence", headers=headers).status_code == 200
    api_key_revoke(api_key=ApiKey.objects.get())
    assert anonymous_http.get("/api/v1/users/ANZ-1/presence", headers=headers).status_code == 401


def test_a_verified_key_costs_no_query_on_later_requests(http, django_assert_num_queries):
    assert http.get("/api/v1/users/ANZ-1/presence").status_code == 200  # verifies the key (one query)
    with django_assert_num_queries(0):
        assert http.get("/api/v1/users/ANZ-1/presence").status_code == 200


def test_a_key_of_a_deleted_app_is_refused(anonymous_http, anz_key, anz):
    headers = {"Authorization": f"Bearer {anz_key}"}
    anz.delete()
    verified_keys_forget()
    assert anonymous_http.get("/api/v1/users/ANZ-1/presence", headers=headers).status_code == 401
