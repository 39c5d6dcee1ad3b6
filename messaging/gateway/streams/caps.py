"""How many channel streams (SSE and stream sockets) this web node holds, per client address and per
app, each count capped: STREAM_MAX_PER_ADDRESS, STREAM_MAX_PER_APP.

A stream holds a socket, a place in the node's channel hub and, while it catches up, history
queries; without caps one address (or one tenant's clients) could take every stream a node can
hold. The address is taken before anything else is looked at (before the identity costs a query);
the app once the identity names it. In memory on purpose, like messaging.gateway.limits: a stream lives on
one node, and the node's resources are what the caps protect.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.conf import settings

from messaging.core import metrics
from messaging.gateway.streams.identity import StreamRefused

TOO_MANY = "too_many_streams"
_by_address: Counter[str] = Counter()
_by_app: Counter[int] = Counter()


@dataclass
class StreamSlot:
    """One stream's place in the counts; `release` gives it back (once)."""

    address: str
    transport: str
    app_pk: int | None = None
    released: bool = False

    def take_app(self, app_pk: int) -> None:
        """Count the stream against its app too; StreamRefused (429) beyond STREAM_MAX_PER_APP."""
        if _by_app[app_pk] >= settings.STREAM_MAX_PER_APP:
            metrics.STREAM_REFUSED.labels(self.transport, "app").inc()
            raise StreamRefused(429, TOO_MANY, f"this app has {settings.STREAM_MAX_PER_APP} streams open on this "
                                               "server; try again later")
        _by_app[app_pk] += 1
        self.app_pk = app_pk

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        _drop(_by_address, self.address)
        if self.app_pk is not None:
            _drop(_by_app, self.app_pk)


def stream_slot_take(*, address: str, transport: str) -> StreamSlot:
    """A slot for a stream from `address`; StreamRefused (429) beyond STREAM_MAX_PER_ADDRESS."""
    if _by_address[address] >= settings.STREAM_MAX_PER_ADDRESS:
        metrics.STREAM_REFUSED.labels(transport, "address").inc()
        raise StreamRefused(429, TOO_MANY, f"{settings.STREAM_MAX_PER_ADDRESS} streams are open from your address; "
                                           "close one or try again later")
    _by_address[address] += 1
    return StreamSlot(address=address, transport=transport)


def stream_counts() -> tuple[dict[str, int], dict[int, int]]:
    """(streams per address, streams per app) on this node; nothing is listed at 0."""
    return dict(_by_address), dict(_by_app)


def client_address(scope: dict) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _drop(counts: Counter, key: object) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
