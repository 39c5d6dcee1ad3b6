"""Every error of the API has the documented shape `{"error": code, "detail": text}` and the right status."""

from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings

from messaging.api import views
from messaging.api.errors import server_error

pytestmark = pytest.mark.django_db


def _shape(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"] == code and isinstance(body["detail"], str) and body["detail"]
    return body


@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/messages/", "/api/v2/messages", "/api/"])
def test_a_path_with_no_endpoint_is_a_json_404(http, path):
    _shape(http.get(path), 404, "not_found")


def test_a_method_the_endpoint_lacks_is_a_405(http):
    _shape(http.delete("/api/v1/messages"), 405, "method_not_allowed")
    _shape(http.get("/messages"), 405, "method_not_allowed")


def test_a_body_that_is_not_json_is_a_415(http):
    _shape(http.post("/api/v1/messages", content=b"to=ANZ-1", headers={"Content-Type": "application/x-www-form-"
                                                                                      "urlencoded"}),
           415, "unsupported_media_type")


def test_malformed_json_is_a_400(http):
    _shape(http.post("/api/v1/messages", content=b'{"to": ', headers={"Content-Type": "application/json"}),
           400, "malformed_request")
    _shape(http.post("/api/v1/messages", content=b'{"to": "ANZ-1", "content": NaN}',
                     headers={"Content-Type": "application/json"}), 400, "malformed_request")


def test_a_body_of_the_wrong_shape_names_each_field(http):
    body = _shape(http.post("/api/v1/messages", json={"to": 5, "feature": "SLOW"}), 400, "invalid_request")
    assert set(body["fields"]) == {"to", "content", "feature"}
    assert "to:" in body["detail"] and "content:" in body["detail"]
    _shape(http.post("/api/v1/messages", json=["not", "an", "object"]), 400, "invalid_request")


def test_text_no_socket_could_carry_is_refused_and_never_echoed_raw(http):
    headers = {"Content-Type": "application/json"}
    _shape(http.post("/api/v1/messages", content=b'{"to": "ANZ-1", "content": "a\\u0000b"}', headers=headers),
           400, "invalid_request")
    body = _shape(http.post("/api/v1/messages", content=b'{"to": "ANZ-1", "content": "x", "feature": "\\udc00"}',
                            headers=headers), 400, "invalid_request")
    assert "\\udc00" in body["detail"]


def test_a_body_over_the_server_limit_is_a_413(http):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        _shape(http.post("/api/v1/messages", json={"to": "ANZ-1", "content": "x" * 2000}), 413, "request_too_large")


def test_an_unexpected_failure_is_a_500_in_the_same_shape(http, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(views, "user_presence", broken)
    body = _shape(http.get("/api/v1/users/ANZ-1/presence"), 500, "internal_error")
    assert "boom" not in body["detail"]


def test_a_failure_outside_any_view_on_an_api_path_is_a_json_500():
    response = server_error(RequestFactory().get("/api/v1/messages"))
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    assert server_error(RequestFactory().get("/admin/"))["Content-Type"].startswith("text/html")


def test_an_accept_header_the_api_cannot_satisfy_still_gets_json_not_a_406(http):
    for accept in ("AJ+9", "text/csv", "image/png;q=1"):
        answer = http.get("/api/v1/dead-letters", headers={"Accept": accept})
        assert answer.status_code == 200, (accept, answer.status_code)
        assert answer.headers["Content-Type"].startswith("application/json")
