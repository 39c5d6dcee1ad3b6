"""What every /ws frame handler shares (messaging.gateway.connection.handlers and its neighbours):
the connection a handler acts on, the user's delivery budget, and a clientMessageId checked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from messaging.channels.cursor import ChannelCursor
from messaging.core import metrics
from messaging.core.protocol import CLIENT_MESSAGE_ID_MAX, QUEUE_CLIENT_MESSAGE_ID_PREFIX, Frame, FrameError
from messaging.gateway.connection.ledger import DeliveryLedger
from messaging.gateway.connection.life import ConnectionLife
from presence.master_view import MasterView


class Connection(Protocol):
    """What a handler acts on: the consumer of one /ws connection."""

    scope: dict
    life: ConnectionLife
    ledger: DeliveryLedger | None  # set once authenticated, as are the two below
    channels: ChannelCursor | None
    durable: set[str]  # channels of the user's server-managed subscriptions

    async def write(self, text: str) -> bool: ...  # False when the socket took nothing
    async def close_with(self, code: int, reason: str = "") -> None: ...
    def write_position(self) -> int | None: ...  # bytes queued on the socket so far (None: not counted)
    def admitted(self) -> None: ...  # authenticated: the ledger and the channel cursor exist from now
    def master_watch(self, view: MasterView) -> None: ...  # the app's master: what it was told, kept right

    @property
    def answers_sends(self) -> bool: ...  # every stored send is answered (MESSAGE_ACCEPTED), ACK mode or not


Handler = Callable[[Connection, Frame], Awaitable[None]]

# Refusals answered without the frame's data: it is large, or holds what no socket can carry back.
NO_ECHO = {"too_many_recipients", "content_too_large", "content_unsafe"}


def retry_after_ms(seconds: float) -> int:
    return 60_000 if seconds == float("inf") else max(1, int(seconds * 1000 + 0.999))


def charge(conn: Connection, deliveries: int, data: Any) -> None:
    """Each delivery a send creates draws on the user's budget on this node."""
    wait = conn.life.user_bucket.take(deliveries)
    if wait:
        metrics.LIMITED.labels("deliveries").inc()
        raise FrameError("delivery rate limit exceeded", data, limit=conn.life.app.deliveries_per_second,
                         retryAfterMs=retry_after_ms(wait))


def client_message_id_of(data: dict) -> str | None:
    value = data.get("clientMessageId")
    if value is not None and (not isinstance(value, str) or not value or len(value) > CLIENT_MESSAGE_ID_MAX):
        raise FrameError(f"clientMessageId must be a string of 1 to {CLIENT_MESSAGE_ID_MAX} characters", data)
    if value is not None and value.startswith(QUEUE_CLIENT_MESSAGE_ID_PREFIX):
        raise FrameError(f"clientMessageId must not start with {QUEUE_CLIENT_MESSAGE_ID_PREFIX!r}: reserved for the "
                         "app's sends from its queue", data)
    return value
