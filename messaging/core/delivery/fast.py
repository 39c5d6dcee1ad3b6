"""FAST sends: pushed to the recipients' live connections through the socket door, never stored,
never retried. A recipient who is offline (or whose node is gone) simply does not get it. From a
client on /ws (`message_fast_send_async`, on the node's event loop) or from sync code (the REST
API, `manage.py send`). A recipient homed in another domain gets it there, if connected there: the
item is handed to a worker that carries it over the domain network (messaging.federation.senders.fast_forward),
with the same promise."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from django.conf import settings

from apps_registry.selectors import AppSnapshot
from foundation import handoff
from foundation.transport import sockets
from messaging.core.protocol import fast_frame
from presence import cache

# Looks the live connections of a list of users up (presence.cache.connections_of_many_async's answer);
# a web node's batches the lookups of one turn of its loop into one Redis round trip
# (messaging.gateway.runtime, `fast_lookups`).
Lookup = Callable[[Sequence[str]], Awaitable[dict[str, list[cache.LiveConnection]]]]


def fast_item(*, app_name: str, sender: str, content: str, reference: str, recipients: Sequence[str],
              path: Sequence[str]) -> dict:
    """A FAST item on its way over the domain network (`path`: the domains it passed, origin first)."""
    return {"app": app_name, "sender": sender, "content": content, "reference": reference,
            "recipients": sorted(set(recipients)), "path": list(path)}


def _split(app: AppSnapshot, recipients: Sequence[str], *, sender: str, content: str, reference: str | None,
           path: Sequence[str]) -> tuple[list[str], dict | None]:
    """(recipients homed here, the FAST item for those homed in another domain, or None)."""
    here, elsewhere = [], []
    for recipient in recipients:
        home = app.home_of(recipient)
        (elsewhere if home is not None and home != settings.DOMAIN_NAME else here).append(recipient)
    if not elsewhere:
        return here, None
    return here, fast_item(app_name=app.app_name, sender=sender, content=content, reference=reference or "",
                           recipients=elsewhere, path=[*path, settings.DOMAIN_NAME])


def message_fast_send(*, app: AppSnapshot, sender: str, recipients: Sequence[str], content: str,
                      reference: str = "", path: Sequence[str] = ()) -> int:
    """Push one FAST message to every live connection of `recipients` homed here (returns how many
    connections took it: a connection whose node no longer listens does not count), and hand the
    others to the domain network (`path`: the domains the message already passed, for one a
    neighbour carried here)."""
    here, elsewhere = _split(app, recipients, sender=sender, content=content, reference=reference, path=path)
    if elsewhere:
        handoff.fast_forward_enqueue(elsewhere)
    event = sockets.message_fast_event(fast_frame(sender=sender, content=content, reference=reference or None))
    connections = cache.connections_of_many(here)
    sends = [(c.channel_name, event) for conns in connections.values() for c in conns]
    failures = sockets.send_many_sync(sends)
    return len(sends) - len(failures)


async def message_fast_send_async(*, app: AppSnapshot, sender: str, recipients: Sequence[str], content: str,
                                  reference: str | None = None, lookup: Lookup | None = None) -> int:
    """The same from an event loop (a /ws client's FAST MESSAGE, the REST API's FAST send): how
    many connections took it. `lookup`: how the recipients' connections are looked up (default: a
    Redis round trip of this send's own)."""
    here, elsewhere = _split(app, recipients, sender=sender, content=content, reference=reference, path=())
    if elsewhere:
        await asyncio.to_thread(handoff.fast_forward_enqueue, elsewhere)
    event = sockets.message_fast_event(fast_frame(sender=sender, content=content, reference=reference or None))
    connections = await (lookup or cache.connections_of_many_async)(here)
    sends = [(c.channel_name, event) for conns in connections.values() for c in conns]
    return len(sends) - len(await sockets.send_many(sends))
