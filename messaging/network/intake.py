"""What a domain does with deliveries, confirmations and receipts a neighbour forwards (to build)."""

from __future__ import annotations

from messaging.network.transport import PeerRefused


def forward_accept(*, sender: str, payload: dict) -> dict:
    raise PeerRefused(501, "forwarding is not built yet")
