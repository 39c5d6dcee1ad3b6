"""A node opens and closes sessions in batches (a reconnect storm's group commit): each session
still gets exactly one row, one connect event and one disconnect event, and a batch commits whole
or not at all."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError
from django.utils import timezone

from presence.models import PresenceEvent, Session
from presence.services import SessionClosing, SessionOpening, node_register, sessions_close, sessions_open
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def anz():
    node_register(node_id="web-1", domain="domain-01")
    return make_app()


def opening(app, user_id: str, node_id: str = "web-1") -> SessionOpening:
    return SessionOpening(connection_id=uuid.uuid4(), app_id=app.pk, user_id=user_id, node_id=node_id,
                          channel_name=f"chan-{uuid.uuid4().hex}", acks=user_id.endswith("7"),
                          remote_addr="10.0.0.1", user_agent="storm" * 100, connected_at=timezone.now())


def test_a_batch_of_openings_gives_each_session_its_row_and_one_connect_event(anz):
    batch = [opening(anz, f"ANZ-{n}") for n in range(300)]

    sessions_open(openings=batch)

    rows = {s.connection_id: s for s in Session.objects.all()}
    assert set(rows) == {o.connection_id for o in batch}
    seventh = next(o for o in batch if o.user_id == "ANZ-7")
    assert (rows[seventh.connection_id].user_id, rows[seventh.connection_id].acks) == ("ANZ-7", True)
    assert rows[seventh.connection_id].user_agent == ("storm" * 100)[:300]
    connects = PresenceEvent.objects.filter(kind="connect")
    assert sorted(e.connection_id for e in connects) == sorted(o.connection_id for o in batch)
    assert {(e.app_name, e.domain) for e in connects} == {("ANZ", "domain-01")}


def test_a_batch_that_fails_commits_none_of_its_sessions(anz):
    batch = [opening(anz, "ANZ-1"), opening(anz, "ANZ-2", node_id="no-such-node")]

    with pytest.raises(IntegrityError):
        sessions_open(openings=batch)

    assert not Session.objects.exists()
    assert not PresenceEvent.objects.exists()


def test_a_batch_of_closings_records_each_disconnect_once_with_its_own_reason(anz):
    batch = [opening(anz, f"ANZ-{n}") for n in range(4)]
    sessions_open(openings=batch)
    reasons = ["client closed (1006)", "client closed (1006)", "server closed (1012)", "client closed (1000)"]

    sessions_close(closings=[SessionClosing(o.connection_id, r) for o, r in zip(batch, reasons, strict=True)])
    sessions_close(closings=[SessionClosing(batch[0].connection_id, "closed again")])

    assert not Session.objects.filter(disconnected_at__isnull=True).exists()
    disconnects = {e.connection_id: e for e in PresenceEvent.objects.filter(kind="disconnect")}
    assert [disconnects[o.connection_id].close_reason for o in batch] == reasons
    first = Session.objects.get(pk=batch[0].connection_id)
    assert disconnects[first.pk].at == first.disconnected_at
    assert disconnects[first.pk].connected_at == first.connected_at
