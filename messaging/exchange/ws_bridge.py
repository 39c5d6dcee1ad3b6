"""EVENT frames for an app's users connected over /ws (to build: the ws helper).

The engine (messaging.exchange.adapter) calls `events_to_ws` after each committed batch, and only
when `ws_listeners` says the app has /ws users online, so the TCP path pays nothing otherwise.
The bodies below are stubs until the ws helper's version is merged.
"""

from __future__ import annotations


def ws_listeners(app_id: int) -> bool:
    """Whether the app has users connected over /ws (stub: never)."""
    return False


def events_to_ws(app_id: int, batch: list[tuple[int, str, int | None, int | None]]) -> None:
    """The applied events of a committed batch, in order: (seq, kind, from, to) (stub: dropped)."""
    return None
