"""Every query parameter and header the platform reads answers bad input with a 4xx and says what is
wrong, never a 500: odd digits (which str.isdigit and int() take: '²', Arabic-Indic '١٢'), numbers
past a bigint, negative numbers, non-ASCII, NUL. Streams are called as the ASGI apps daphne runs;
the REST API, /metrics and the admin through Django in-process."""

from __future__ import annotations

import asyncio
import base64
import json
from urllib.parse import quote

import pytest
from channels.testing import WebsocketCommunicator

from messaging.gateway.streams.sse import SseStream
from messaging.gateway.streams.ws import PushStreamConsumer
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)  # streams read the app on the node's own pool

ODD_NUMBERS = {
    "superscript two": "²",
    "arabic-indic digits": "١٢",
    "fullwidth digits": "１２",
    "5000 digits": "9" * 5000,
    "past a bigint": str(2**63),
    "negative": "-1",
    "fraction": "1.5",
    "not a number": "abc",
    "non-ascii text": "é",
    "nul": "\x00",
}
CURSOR_GARBAGE = {
    **ODD_NUMBERS,
    "position with a nul": base64.b64encode(b"o=0&r=0&p=a%00b").decode(),
    "offset in odd digits": base64.b64encode("o=١٢&p=x".encode()).decode(),
}
BAD_TEXT = {"non-ascii": "é²", "nul": "\x00", "huge": "x" * 5000}


@pytest.fixture
def pub():
    """PUB: `news.*` public, so a stream gets past its identity to the parameters after it."""
    return make_app(app_name="PUB", app_id="app-id-pub", master="PUB-1", public_channel_patterns=["news.*"])


def _scope(query: str, headers: list[tuple[bytes, bytes]] = (), kind: str = "http") -> dict:
    return {"type": kind, "method": "GET", "path": "/sse/messages", "query_string": query.encode("latin-1"),
            "headers": list(headers), "client": ("127.0.0.1", 40000)}


def sse(query: str, headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, dict]:
    """Status and JSON body of a refused SSE stream."""
    sent: list[dict] = []

    async def receive() -> dict:
        await asyncio.sleep(60)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    async def call() -> None:
        await asyncio.wait_for(SseStream()(_scope(query, headers), receive, send), 20)

    asyncio.run(call())
    return sent[0]["status"], json.loads(sent[1]["body"])


def stream_socket(query: str) -> tuple[dict, int]:
    """The error frame and close code of a refused stream socket."""

    async def call() -> tuple[dict, int]:
        communicator = WebsocketCommunicator(PushStreamConsumer.as_asgi(), f"/ws/messages?{query}")
        communicator.scope["client"] = ("127.0.0.1", 40000)
        connected, _ = await communicator.connect(timeout=20)
        assert connected
        frame = json.loads(await communicator.receive_from(timeout=20))
        closed = await communicator.receive_output(timeout=20)
        # What daphne tells the consumer once the close handshake is done: its connection ended.
        await communicator.send_input({"type": "websocket.disconnect", "code": closed["code"]})
        await communicator.wait(timeout=20)
        return frame, closed["code"]

    return asyncio.run(call())


@pytest.mark.parametrize("value", ODD_NUMBERS.values(), ids=ODD_NUMBERS.keys())
def test_an_sse_last_event_id_query_parameter_that_is_no_offset_is_a_400(pub, value):
    for last in (value, f"news.a:{value}"):
        status, body = sse(f"channels=news.a&app=app-id-pub&lastEventId={quote(last)}")
        assert status == 400 and "lastEventId must be an offset" in body["detail"]


@pytest.mark.parametrize("value", ODD_NUMBERS.values(), ids=ODD_NUMBERS.keys())
def test_an_sse_last_event_id_header_that_is_no_offset_is_a_400(pub, value):
    status, body = sse("channels=news.a&app=app-id-pub", [(b"last-event-id", f"news.a:{value}".encode())])
    assert status == 400 and "Last-Event-ID" in body["detail"]


@pytest.mark.parametrize("param", ["channels", "app", "token"])
@pytest.mark.parametrize("value", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_sse_identity_parameters_with_bad_text_are_refused_with_a_reason(pub, param, value):
    params = {"channels": "news.a", "app": "app-id-pub", param: value}
    status, body = sse("&".join(f"{k}={quote(v)}" for k, v in params.items()))
    assert status in (400, 401, 403) and body["error"]


def test_raw_non_ascii_bytes_in_an_sse_query_or_header_are_refused(pub):
    status, _ = sse("channels=news.a&app=app-id-pub&lastEventId=\xc2\xb2")
    assert status == 400
    status, body = sse("channels=news.a&app=app-id-pub", [(b"last-event-id", b"news.a:\xc2\xb2")])
    assert status == 400 and body["detail"] == "the Last-Event-ID header must be printable ASCII"


@pytest.mark.parametrize("value", ODD_NUMBERS.values(), ids=ODD_NUMBERS.keys())
def test_a_stream_socket_since_that_is_no_offset_is_refused_with_1008(pub, value):
    frame, code = stream_socket(f"channels=news.a&app=app-id-pub&since={quote('news.a:' + value)}")
    assert code == 1008 and frame["error"] == "invalid_request" and "since must be an offset" in frame["detail"]


@pytest.mark.parametrize("param", ["channels", "app", "token"])
def test_stream_socket_identity_parameters_with_bad_text_are_refused_with_1008(pub, param):
    params = {"channels": "news.a", "app": "app-id-pub", param: "é\x00"}
    frame, code = stream_socket("&".join(f"{k}={quote(v)}" for k, v in params.items()))
    assert code == 1008 and frame["error"] in ("invalid_channel", "unauthorized")


# --- the REST API (through Django's ASGI handler, as daphne calls it: headers are raw bytes) ------

def asgi(method: str, path: str, query: dict[str, str] | None = None, headers: dict[str, bytes] | None = None,
         body: bytes = b"") -> tuple[int, dict]:
    """Status and JSON body of one request to the platform's Django app."""
    from django.core.asgi import get_asgi_application  # why: builds the handler once settings are configured

    raw_headers = [(name.lower().encode(), value) for name, value in (headers or {}).items()]
    if body:
        raw_headers += [(b"content-type", b"application/json")]
        if "Content-Length" not in (headers or {}):
            raw_headers += [(b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": quote(path).encode(), "root_path": "",
             "query_string": "&".join(f"{k}={quote(v)}" for k, v in (query or {}).items()).encode(),
             "headers": raw_headers, "client": ("127.0.0.1", 40000), "server": ("testserver", 80)}
    sent: list[dict] = []
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if requests:
            return requests.pop()
        await asyncio.sleep(60)  # the client stays until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(get_asgi_application()(scope, receive, send), 30))
    content = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], json.loads(content) if content else {}


@pytest.fixture
def key(anz_key) -> dict[str, bytes]:
    return {"Authorization": f"Bearer {anz_key}".encode()}


@pytest.mark.parametrize("value", ODD_NUMBERS.values(), ids=ODD_NUMBERS.keys())
@pytest.mark.parametrize("param", ["after", "limit"])
def test_channel_history_numbers_that_are_no_numbers_are_a_400(key, param, value):
    status, body = asgi("GET", "/api/v1/channels/news/messages", {param: value}, key)
    assert status == 400 and body["detail"].startswith(f"'{param}' must be an integer")


@pytest.mark.parametrize("path", ["/api/v1/dead-letters", "/api/v1/channels/news/subscribers",
                                  "/api/v1/users/ANZ-1/subscriptions", "/api/v1/channels/news/members"])
@pytest.mark.parametrize("value", CURSOR_GARBAGE.values(), ids=CURSOR_GARBAGE.keys())
def test_a_page_cursor_the_api_never_gave_out_is_a_400(key, path, value):
    status, body = asgi("GET", path, {"cursor": value}, key)
    assert status == 400 and "'cursor' must be" in body["detail"]


def test_a_cursor_whose_position_is_no_time_is_a_400_where_pages_are_ordered_by_time(key):
    cursor = base64.b64encode(b"o=0&r=0&p=not-a-date").decode()
    status, body = asgi("GET", "/api/v1/dead-letters", {"cursor": cursor}, key)
    assert status == 400 and "'cursor' must be" in body["detail"]


@pytest.mark.parametrize("value", ODD_NUMBERS.values(), ids=ODD_NUMBERS.keys())
def test_a_page_limit_that_is_no_number_is_a_400(key, value):
    status, body = asgi("GET", "/api/v1/dead-letters", {"limit": value}, key)
    assert status == 400 and "'limit' must be an integer" in body["detail"]


@pytest.mark.parametrize("value", ODD_NUMBERS.values(), ids=ODD_NUMBERS.keys())
def test_a_message_id_that_is_no_number_is_not_found(key, value):
    status, body = asgi("GET", f"/api/v1/messages/{value}", headers=key)
    assert status == 404 and body["error"] == "not_found"


@pytest.mark.parametrize("value", [b"\xc2\xb2", b"key with spaces", b"k" * 300, b"\xff\xfe", b"a\x00b"])
def test_an_idempotency_key_that_is_not_printable_ascii_is_a_400(key, value):
    status, body = asgi("POST", "/api/v1/channels/news/messages", headers={**key, "Idempotency-Key": value},
                        body=b'{"content":"x"}')
    assert status == 400 and "Idempotency-Key must be" in body["detail"]


@pytest.mark.parametrize("value", [b"Bearer \xc2\xb2\xc2\xb2", b"Bearer " + b"9" * 5000, b"\xff\xfe", b"Basic abc",
                                   b"Bearer a\x00b"])
def test_an_authorization_header_that_is_no_api_key_is_a_401(anz_key, value):
    status, body = asgi("GET", "/api/v1/dead-letters", headers={"Authorization": value})
    assert status == 401 and body["error"] in ("invalid_api_key", "unauthenticated")


@pytest.mark.parametrize("value", [b"\xc2\xb2", b"-5", b"9" * 5000])
def test_a_content_length_that_is_no_number_is_not_a_500(key, value):
    status, _ = asgi("POST", "/api/v1/channels/news/messages", headers={**key, "Content-Length": value},
                     body=b'{"content":"x"}')
    assert status < 500


# --- /metrics and the admin ----------------------------------------------------------------------

@pytest.mark.parametrize("token", ["²²", "é", "\x00", "9" * 5000])
def test_a_metrics_bearer_token_that_is_not_ascii_is_refused_not_raised(client, settings, token):
    settings.METRICS_TOKEN = "the-scrapers-token"
    answer = client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 403 and answer.json()["error"] == "forbidden"
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9",
                      HTTP_AUTHORIZATION="Bearer the-scrapers-token").status_code == 200


@pytest.mark.parametrize("path", [
    "/admin/messaging/message/", "/admin/messaging/delivery/", "/admin/presence/session/",
    "/admin/apps_registry/clientapp/", "/admin/apps_registry/apikey/",
])
@pytest.mark.parametrize("value", ["²", "١٢", "9" * 5000, "\x00", "é"])
def test_admin_search_and_filters_never_fail_on_odd_input(admin_client, path, value):
    assert admin_client.get(path, {"q": value}).status_code == 200
    assert admin_client.get(path, {"app__id__exact": value}).status_code < 500
    assert admin_client.get(path, {"p": value}).status_code < 500


@pytest.mark.parametrize("value", ["²", "ANZ-١٢", "ANZ-" + "9" * 5000, "\x00", "é"])
def test_the_admin_route_finder_never_fails_on_odd_input(admin_client, value):
    make_app()
    answer = admin_client.get("/admin/apps_registry/domain/graph/", {"user_id": value, "from": value})
    assert answer.status_code == 200
