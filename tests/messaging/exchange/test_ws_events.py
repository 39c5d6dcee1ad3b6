"""The event exchange's notifications reach /ws users of the app as EVENT frames: a web node in this
process (tests/inprocess.py), its clients, the bridge called as the engine calls it after a committed
batch."""

from __future__ import annotations

import pytest

from messaging.exchange.models import Follow
from messaging.exchange.ws_bridge import events_to_ws, ws_listeners, ws_listeners_forget
from tests.wsclient import FrameReader

pytestmark = pytest.mark.django_db


def events(client: FrameReader, expected: int) -> list[tuple[int, str, int | None, int | None]]:
    """The EVENT frames the client gets: the `expected` first ones (waited for, however busy the
    machine), then whatever else comes before the socket is quiet for a second."""
    frames = [client.recv_type("EVENT") for _ in range(expected)] + client.recv_all(quiet=1.0)
    return [(f["data"]["seq"], f["data"]["kind"], f["data"]["from"], f["data"]["to"])
            for f in frames if f["type"] == "EVENT"]


def test_ws_users_get_exactly_the_events_that_concern_them_in_order(node, demo_network):
    anz = demo_network["anz"]
    ws_listeners_forget()
    Follow.objects.create(app=anz, follower=3201, followee=3200)  # 3201 follows 3200; 3202 follows nobody
    with node.client() as follower, node.client() as other:
        follower.auth("ANZ-3201")
        other.auth("ANZ-3202")
        assert ws_listeners(anz.pk)
        batch = [(1, "F", 3202, 3201), (2, "U", 3201, 3202), (3, "P", 3201, 3202), (4, "S", 3200, None),
                 (5, "B", None, None), (6, "P", 3202, 3201), (7, "S", 3202, None)]
        events_to_ws(anz.pk, batch)
        assert events(follower, 4) == [(1, "F", 3202, 3201), (4, "S", 3200, None), (5, "B", None, None),
                                    (6, "P", 3202, 3201)]
        assert events(other, 2) == [(3, "P", 3201, 3202), (5, "B", None, None)]
