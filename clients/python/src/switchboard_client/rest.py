"""A small typed Python client of Switchboard's server REST API (over httpx; nothing of the server).

    from switchboard_client import SwitchboardClient

    with SwitchboardClient("http://localhost:8000", api_key) as sb:
        sent = sb.send("ANZ-1002", "your order shipped", reference="order-7781")
        print(sb.message(sent["id"])["deliveries"])

Every send carries an `Idempotency-Key` (one is made up per call unless you pass yours), so a send
that is retried (after a 429, a 503 or a dropped connection: `retries` times, honouring
`Retry-After`) is stored once. Errors raise `ApiError` with the API's `error` code and `detail`.
Lists are iterators that follow the pages' `next` links.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Literal, TypedDict
from urllib.parse import quote

import httpx

from .backoff import Backoff

Feature = Literal["RELIABLE", "FAST"]
RETRY_STATUSES = {429, 503}
RETRY_AFTER_MAX = 30.0
# The wait before trying again after a dropped connection: 0.4 s, doubling, at most RETRY_AFTER_MAX.
CONNECTION_RETRY = Backoff(base=0.4, cap=RETRY_AFTER_MAX, jitter=0.0)


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, body: Any = None, retry_after: float | None = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body
        self.retry_after = retry_after


# The answers' shapes (the schema at /api/schema/ is the reference). `from` is a Python keyword,
# hence the functional syntax.
MessageAccepted = TypedDict("MessageAccepted", {"id": str, "feature": str, "from": str, "recipients": list[str],
                                                "deliveries": int})
FastSent = TypedDict("FastSent", {"feature": str, "from": str, "recipients": list[str], "connections": int})


class ChannelPublished(TypedDict):
    channel: str
    offset: int
    subscribers: int


class Delivery(TypedDict):
    recipient: str
    seq: int
    state: str
    attempts: int
    created_at: str
    sent_at: str | None
    delivered_at: str | None
    dead_at: str | None
    expired_at: str | None
    last_error: str


MessageStatus = TypedDict("MessageStatus", {"id": str, "kind": str, "from": str, "content": str, "reference": str,
                                            "created_at": str, "deliveries": list[Delivery]})


class Subscription(TypedDict):
    user_id: str
    channel: str
    created_at: str


class Subscribed(TypedDict):
    user_id: str
    channel: str
    created: bool


class Presence(TypedDict):
    user_id: str
    domain: str | None
    online: bool | None
    connections: int | None


class ChannelMember(TypedDict):
    user_id: str
    connections: int


class HistoryItem(TypedDict):
    offset: int
    content: str


DeadLetter = TypedDict("DeadLetter", {"id": int, "message_id": str, "from": str, "kind": str, "reference": str,
                                      "recipient": str, "seq": int, "attempts": int, "last_error": str,
                                      "created_at": str, "sent_at": str | None, "dead_at": str})


def _segment(value: str) -> str:
    return quote(value, safe="@")


class SwitchboardClient:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 10.0, retries: int = 2,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.retries = retries
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, transport=transport,
                                 headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"})

    # --- plumbing ------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
                idempotency_key: str | None = None) -> Any:
        """One API call (retried on 429, 503 and connection errors); the decoded answer, or None (204)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        attempt = 0
        while True:
            try:
                response = self.http.request(method, path, json=json, params=params, headers=headers)
            except httpx.TransportError:
                if attempt >= self.retries:
                    raise
                attempt += 1
                time.sleep(CONNECTION_RETRY.seconds(attempt))
                continue
            if response.status_code < 400:
                return response.json() if response.content else None
            error = self._error(response)
            if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                raise error
            attempt += 1
            time.sleep(min(RETRY_AFTER_MAX, error.retry_after or 1.0))

    @staticmethod
    def _error(response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": "http_error", "detail": response.text[:500]}
        retry_after = response.headers.get("Retry-After")
        return ApiError(response.status_code, str(body.get("error")), str(body.get("detail")), body,
                        float(retry_after) if retry_after and retry_after.isdigit() else None)

    def pages(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every page of a list, following `next`."""
        page = self.request("GET", path, params=params)
        while True:
            yield page
            if not page.get("next"):
                return
            page = self.request("GET", page["next"])

    def items(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Any]:
        for page in self.pages(path, params):
            yield from page["results"]

    # --- sends ---------------------------------------------------------------------------------

    def send(self, to: str | Sequence[str], content: str, *, feature: Feature = "RELIABLE", sender: str | None = None,
             reference: str | None = None, confirmation: bool = False,
             idempotency_key: str | None = None) -> MessageAccepted | FastSent:
        """To one user (`to` a user id) or several (a list). RELIABLE answers with the message `id`."""
        body: dict[str, Any] = {"to": to if isinstance(to, str) else list(to), "content": content, "feature": feature}
        if sender is not None:
            body["from"] = sender
        if reference:
            body["reference"] = reference
        if confirmation:
            body["confirmation"] = True
        return self.request("POST", "/api/v1/messages", json=body,
                            idempotency_key=idempotency_key or uuid.uuid4().hex)

    def send_batch(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Up to 1,000 messages in one call, each a `send`'s body (`to`, `content`, `feature`, `from`,
        `reference`, `confirmation`) with an optional `idempotencyKey`: a result per message, in order,
        `{"id": ...}` or `{"error": code, "detail": text}`. Give each message a key to retry safely."""
        return self.request("POST", "/api/v1/messages/batch", json={"messages": list(messages)})["results"]

    def publish(self, channel: str, content: str, *, idempotency_key: str | None = None) -> ChannelPublished:
        return self.request("POST", f"/api/v1/channels/{_segment(channel)}/messages", json={"content": content},
                            idempotency_key=idempotency_key or uuid.uuid4().hex)

    def push_publish(self, channel: str, message: Any, *, idempotency_key: str | None = None) -> int:
        """The push service's `POST /messages`; returns how many live subscribers it reached."""
        answer = self.request("POST", "/messages", json={"channel": channel, "message": message},
                              idempotency_key=idempotency_key or uuid.uuid4().hex)
        return int(answer["subscribers"])

    # --- messages and dead letters ---------------------------------------------------------------

    def message(self, message_id: str | int) -> MessageStatus:
        return self.request("GET", f"/api/v1/messages/{message_id}")

    def dead_letters(self, *, limit: int = 100) -> Iterator[DeadLetter]:
        return self.items("/api/v1/dead-letters", {"limit": limit})

    def requeue(self, ids: Sequence[int]) -> int:
        return int(self.request("POST", "/api/v1/dead-letters/requeue", json={"ids": list(ids)})["requeued"])

    def discard(self, ids: Sequence[int]) -> int:
        return int(self.request("POST", "/api/v1/dead-letters/discard", json={"ids": list(ids)})["discarded"])

    # --- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, channel: str, user_id: str) -> Subscribed:
        return self.request("PUT", f"/api/v1/channels/{_segment(channel)}/subscribers/{_segment(user_id)}")

    def unsubscribe(self, channel: str, user_id: str) -> None:
        self.request("DELETE", f"/api/v1/channels/{_segment(channel)}/subscribers/{_segment(user_id)}")

    def follow(self, user_id: str, target_id: str) -> Subscribed:
        return self.request("PUT", f"/api/v1/users/{_segment(user_id)}/follows/{_segment(target_id)}")

    def unfollow(self, user_id: str, target_id: str) -> None:
        self.request("DELETE", f"/api/v1/users/{_segment(user_id)}/follows/{_segment(target_id)}")

    def subscriptions(self, user_id: str, *, limit: int = 100) -> Iterator[Subscription]:
        return self.items(f"/api/v1/users/{_segment(user_id)}/subscriptions", {"limit": limit})

    def subscribers(self, channel: str, *, limit: int = 100) -> Iterator[Subscription]:
        return self.items(f"/api/v1/channels/{_segment(channel)}/subscribers", {"limit": limit})

    # --- presence --------------------------------------------------------------------------------

    def presence(self, user_id: str) -> Presence:
        return self.request("GET", f"/api/v1/users/{_segment(user_id)}/presence")

    def channel_members(self, channel: str, *, limit: int = 100) -> tuple[int, list[ChannelMember]]:
        """(live readers of the channel, its durable subscribers who are connected)."""
        readers, members = 0, []
        for page in self.pages(f"/api/v1/channels/{_segment(channel)}/members", {"limit": limit}):
            readers = page["readers"]
            members.extend(page["results"])
        return readers, members

    def online_users(self, *, limit: int = 1000) -> list[str]:
        """The app's users connected now, in user id order (each page a point-in-time view)."""
        users: list[str] = []
        for page in self.pages("/api/v1/presence/online", {"limit": limit}):
            users.extend(page["results"])
        return users

    def disconnect(self, user_id: str) -> int:
        return int(self.request("POST", f"/api/v1/users/{_segment(user_id)}/disconnect")["closed"])

    # --- the event exchange ---------------------------------------------------------------------

    def events_send(self, events: Sequence[str]) -> dict[str, Any]:
        """Event lines (`seq|kind|from|to`) for the app's exchange: {"accepted": n, "stream": entry id}.
        Safe to retry: the exchange ignores sequence numbers it already has."""
        return self.request("POST", "/api/v1/events", json={"events": list(events)})

    def exchange_followers(self, user: int, *, limit: int = 100) -> Iterator[dict[str, Any]]:
        """Who follows `user` in the exchange's graph: {"user": n, "since": time} each."""
        return self.items(f"/api/v1/exchange/users/{int(user)}/followers", {"limit": limit})

    def exchange_followees(self, user: int, *, limit: int = 100) -> Iterator[dict[str, Any]]:
        return self.items(f"/api/v1/exchange/users/{int(user)}/followees", {"limit": limit})

    # --- channel history -------------------------------------------------------------------------

    def history(self, channel: str, *, after: int = 0, limit: int = 100) -> Iterator[HistoryItem]:
        return self.items(f"/api/v1/channels/{_segment(channel)}/messages", {"after": after, "limit": limit})

    # --- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> SwitchboardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
