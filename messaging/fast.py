"""FAST sends: pushed to the recipients' live connections through the socket door, never stored,
never retried. A recipient who is offline (or whose node is gone) simply does not get it. From a
client on /ws (`message_fast_send_async`, on the node's event loop) or from sync code (the REST
API, `manage.py send`)."""

from __future__ import annotations

from collections.abc import Sequence

from foundation.transport import sockets
from messaging.protocol import fast_frame
from presence import cache


def message_fast_send(*, sender: str, recipients: Sequence[str], content: str, reference: str = "") -> int:
    """Push one FAST message to every live connection of `recipients`; returns how many connections
    took it (a connection whose node no longer listens does not count)."""
    event = sockets.message_fast_event(fast_frame(sender=sender, content=content, reference=reference or None))
    connections = cache.connections_of_many(recipients)
    sends = [(c.channel_name, event) for conns in connections.values() for c in conns]
    failures = sockets.send_many_sync(sends)
    return len(sends) - len(failures)


async def message_fast_send_async(*, sender: str, recipients: Sequence[str], content: str,
                                  reference: str | None = None) -> None:
    """The same from an event loop (a /ws client's FAST MESSAGE); nobody waits for how many took it."""
    event = sockets.message_fast_event(fast_frame(sender=sender, content=content, reference=reference or None))
    connections = await cache.connections_of_many_async(recipients)
    await sockets.send_many((c.channel_name, event) for conns in connections.values() for c in conns)
