"""The per-message statements run prepared, with one plan, on Django's own connection (foundation.db)."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import override_settings

from foundation.db import hot_cursor
from messaging.core.delivery.delivered import deliveries_mark_delivered
from messaging.core.store import OutgoingMessage, messages_store
from messaging.models import Delivery
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


def _probe() -> tuple[str, str]:
    """A statement text no other test runs (prepared statements live as long as the connection)."""
    marker = f"probe {uuid.uuid4().hex}"
    return f"SELECT count(*) FROM messaging_delivery WHERE id = ANY(%s::bigint[]) /* {marker} */", marker


def _prepared(marker: str) -> list[tuple[int, int]]:
    with connection.cursor() as cur:
        cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                    [f"%{marker}%"])
        return cur.fetchall()


def test_a_hot_statement_is_prepared_once_and_never_planned_again():
    probe, marker = _probe()
    for _ in range(8):
        with hot_cursor() as cur:
            cur.execute(probe, [[1]])  # one id: a custom plan would look cheaper every time
            assert cur.fetchone() == (0,)
    [(generic, custom)] = _prepared(marker)
    assert custom == 0 and generic == 8


def test_the_orm_and_plain_cursors_are_not_prepared():
    probe, marker = _probe()
    for _ in range(8):
        Delivery.objects.filter(id__in=[1]).count()
        with connection.cursor() as cur:
            cur.execute(probe, [[1]])
    assert _prepared(marker) == []
    assert _prepared("__count") == []


@override_settings(DB_PREPARED_STATEMENTS=False)
def test_with_prepared_statements_off_the_hot_statements_run_unprepared():
    probe, marker = _probe()
    with hot_cursor() as cur:
        cur.execute(probe, [[1]])
        assert cur.fetchone() == (0,)
    assert _prepared(marker) == []


def test_a_database_error_in_a_hot_statement_is_djangos_and_the_connection_stays_usable():
    app = make_app()
    [stored] = messages_store(messages=[OutgoingMessage(app_id=app.pk, sender=f"{app.app_name}-1",
                                                        recipients=(f"{app.app_name}-2",), content="hi")])
    delivery = Delivery.objects.get(pk=stored.delivery_ids[0])
    with pytest.raises(IntegrityError), transaction.atomic(), hot_cursor() as cur:
        cur.execute("INSERT INTO messaging_delivery (message_id, app_id, recipient, seq, state, attempts, last_error,"
                    " created_at) VALUES (%s, %s, %s, %s, 'pending', 0, '', now())",
                    [stored.message_id, app.pk, delivery.recipient, delivery.seq])
    assert deliveries_mark_delivered(delivery_ids=[delivery.pk]) == 1
    assert Delivery.objects.get(pk=delivery.pk).state == "delivered"
