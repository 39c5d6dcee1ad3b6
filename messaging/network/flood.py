"""Channel publishes flooded to every domain (to build)."""

from __future__ import annotations

from messaging.network.transport import PeerRefused


def publishes_accept(*, sender: str, payload: dict) -> dict:
    raise PeerRefused(501, "channel flooding is not built yet")
