"""Connects and disconnects are recorded in the append-only presence history."""

from __future__ import annotations

import pytest

from presence.lost_nodes import node_restart_cleanup
from presence.models import Node, PresenceEvent, Session
from presence.services import node_register, session_close, session_open
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def anz():
    return make_app()


def _open(app, user_id: str = "ANZ-7", node_id: str = "web-1"):
    return session_open(app_id=app.pk, user_id=user_id, node_id=node_id, channel_name=f"chan-{user_id}",
                        acks=False, remote_addr="10.0.0.1", user_agent="test")


def test_opening_a_session_records_who_connected_where(anz):
    node_register(node_id="web-1", domain="domain-07")
    connection_id = _open(anz)

    event = PresenceEvent.objects.get(connection_id=connection_id)
    session = Session.objects.get(pk=connection_id)
    assert (event.kind, event.connection_id, event.app_name, event.app_id, event.user_id) == (
        "connect", connection_id, "ANZ", anz.pk, "ANZ-7")
    assert (event.node_id, event.domain, event.transport) == ("web-1", "domain-07", "ws")
    assert event.at == event.connected_at == session.connected_at


def test_closing_a_session_records_its_end_and_reason_once(anz):
    node_register(node_id="web-1", domain="domain-01")
    connection_id = _open(anz)

    session_close(connection_id=connection_id, close_reason="client closed (1000)")
    session_close(connection_id=connection_id, close_reason="closed again")

    session = Session.objects.get(pk=connection_id)
    disconnect = PresenceEvent.objects.get(connection_id=connection_id, kind="disconnect")
    assert disconnect.at == session.disconnected_at
    assert disconnect.connected_at == session.connected_at
    assert disconnect.close_reason == "client closed (1000)"
    assert PresenceEvent.objects.filter(connection_id=connection_id).count() == 2


def test_a_restarted_nodes_old_sessions_are_recorded_as_closed_because_the_node_restarted(anz):
    node_register(node_id="web-1", domain="domain-01")
    node_register(node_id="web-2", domain="domain-01")
    dead = [_open(anz, "ANZ-1"), _open(anz, "ANZ-2")]
    _open(anz, "ANZ-3", node_id="web-2")

    node_restart_cleanup(node_id="web-1")

    closed = PresenceEvent.objects.filter(kind="disconnect")
    assert sorted(e.connection_id for e in closed) == sorted(dead)
    assert {e.close_reason for e in closed} == {"node restarted"}


def test_the_history_outlives_session_cleanup_and_app_deletion(anz):
    node_register(node_id="web-1", domain="domain-01")
    session_close(connection_id=_open(anz))

    Session.objects.all().delete()
    Node.objects.all().delete()
    anz.delete()

    assert sorted(PresenceEvent.objects.values_list("kind", "app_name", "user_id")) == [
        ("connect", "ANZ", "ANZ-7"), ("disconnect", "ANZ", "ANZ-7")]
