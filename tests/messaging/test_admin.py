"""The operator's console for messages, dead letters, sessions and nodes."""

from __future__ import annotations

import pytest
from django.utils import timezone

from foundation.transport import sockets
from messaging.core.store import message_send
from messaging.models import Delivery
from presence.models import Node, Session
from tests.factories import make_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def traffic():
    app = make_app()
    for i in range(30):
        message_send(app_id=app.pk, sender="ANZ-1", recipients=[f"ANZ-{100 + i}", "ANZ-2"], content=f"m{i}",
                     kind="group")
    return app


def test_the_message_list_and_a_message_with_its_delivery_record(operator, traffic, django_assert_max_num_queries):
    with django_assert_max_num_queries(12):  # constant, however many rows: related rows come with the page
        page = operator.get("/admin/messaging/message/")
    assert page.status_code == 200 and "m29" in page.content.decode()
    message_id = Delivery.objects.filter(recipient="ANZ-2").first().message_id
    detail = operator.get(f"/admin/messaging/message/{message_id}/change/").content.decode()
    assert "ANZ-2" in detail and "pending" in detail


def test_dead_letters_can_be_requeued_and_discarded_from_the_console(operator, traffic):
    ids = list(Delivery.objects.filter(recipient="ANZ-2").values_list("id", flat=True)[:4])
    Delivery.objects.filter(pk__in=ids).update(state="dead", attempts=10, dead_at=timezone.now())
    listing = operator.get("/admin/messaging/deadletter/").content.decode()
    assert listing.count('name="_selected_action"') == 4
    operator.post("/admin/messaging/deadletter/", {"action": "requeue", "_selected_action": ids[:2]})
    operator.post("/admin/messaging/deadletter/", {"action": "discard", "_selected_action": ids[2:]})
    states = dict(Delivery.objects.filter(pk__in=ids).values_list("id", "state"))
    assert [states[i] for i in ids] == ["pending", "pending", "expired", "expired"]


def test_sessions_filter_by_node_and_an_operator_can_disconnect_one(operator, traffic):
    from channels.layers import get_channel_layer

    now = timezone.now()
    node = Node.objects.create(node_id="web-1", domain="domain-01", started_at=now, heartbeat_at=now)
    channel = sockets.run_async(get_channel_layer().new_channel())
    session = Session.objects.create(app=traffic, user_id="ANZ-7", node=node, channel_name=channel,
                                     connected_at=now, last_seen_at=now)
    listing = operator.get("/admin/presence/session/?live=yes&node__node_id__exact=web-1").content.decode()
    assert "ANZ-7" in listing
    operator.post("/admin/presence/session/", {"action": "disconnect", "_selected_action": [session.pk]})
    assert sockets.run_async(get_channel_layer().receive(channel)) == sockets.connection_close_event(
        1000, "disconnected by an operator", final=True)
    nodes = operator.get("/admin/presence/node/").content.decode()
    assert "web-1" in nodes and " s</td>" in nodes


def test_the_console_cannot_punch_holes_into_a_mailbox(operator, traffic):
    delivery = Delivery.objects.filter(recipient="ANZ-2").order_by("seq")[5]
    for model, pk in (("message", delivery.message_id), ("delivery", delivery.pk), ("deadletter", delivery.pk)):
        assert operator.get(f"/admin/messaging/{model}/{pk}/delete/").status_code == 403
        listing = operator.get(f"/admin/messaging/{model}/").content.decode()
        assert 'value="delete_selected"' not in listing
        operator.post(f"/admin/messaging/{model}/", {"action": "delete_selected", "_selected_action": [pk],
                                                      "post": "yes"})
    assert list(Delivery.objects.filter(recipient="ANZ-2").order_by("seq").values_list("seq", flat=True)) == \
        list(range(1, 31))
