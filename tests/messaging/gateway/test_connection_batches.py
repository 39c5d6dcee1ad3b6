"""A web node takes a reconnect storm in batches (messaging.gateway.connection.admission): many connections
authenticating at once share one Redis round trip, one session transaction and one pair of first
reads, and each still gets exactly what it would have got alone, refusals included."""

from __future__ import annotations

import asyncio

import pytest

from apps_registry.models import ClientApp
from apps_registry.selectors import app_snapshot
from foundation.handoff import WEBHOOK_HAND_OUT_TASK, WEBHOOK_TASK
from foundation.outbound import claim_token
from foundation.transport.frames import CLOSE_TRY_AGAIN
from messaging.channels.services import subscription_add
from messaging.core.delivery.claims import deliveries_claim
from messaging.core.store import OutgoingMessage, messages_store
from messaging.gateway.connection.admission import FirstReadsFor, first_reads
from messaging.gateway.connection.life import ConnectionLife, Refusal
from messaging.gateway.runtime import NodeRuntime
from messaging.intake.batching import LoopBatcher
from messaging.models import WebhookDelivery
from messaging.webhooks.selectors import webhook_events_forget
from messaging.webhooks.services import webhook_endpoint_create
from presence import cache
from presence.models import PresenceEvent, Session
from tests.factories import make_app
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_cache(redis_client):
    redis_client.flushdb()


@pytest.fixture
def anz():
    return make_app()


async def _closed(code: int, reason: str) -> None:
    pass


def lives(count: int) -> list[ConnectionLife]:
    node = NodeRuntime()
    out = []
    for n in range(count):
        life = ConnectionLife(channel_name=f"specific.test!{n}", close=_closed)
        life.node = node
        out.append(life)
    return out


async def admit_all(group: list[ConnectionLife], users: list[str]) -> list:
    return await asyncio.gather(*(
        life.admit(app_id="app-id-343", user_id=user, token="", acks=False, origin=None, remote_addr="10.0.0.9",
                   user_agent="storm") for life, user in zip(group, users, strict=True)))


def test_a_storm_of_logins_gives_each_connection_its_session_and_presence_and_their_ends_settle_all(anz):
    group = lives(60)
    users = [f"ANZ-{n % 40}" for n in range(60)]  # 20 users connect twice

    async def storm() -> list:
        firsts = await admit_all(group, users)
        for life in group:
            life.close_note = "client closed (1006)"
        await asyncio.gather(*(life.end(ledger=None, channels=None, position=None) for life in group))
        return firsts

    firsts = asyncio.run(storm())

    assert firsts.count(True) == 40 and firsts.count(False) == 20  # one first connection per user
    assert Session.objects.count() == 60 and not Session.objects.filter(disconnected_at__isnull=True).exists()
    assert PresenceEvent.objects.filter(kind="connect").count() == 60
    assert set(PresenceEvent.objects.filter(kind="disconnect").values_list("close_reason", flat=True)) == {
        "client closed (1006)"}
    assert PresenceEvent.objects.filter(kind="disconnect").count() == 60
    assert all(conns == [] for conns in cache.connections_of_many(users).values())


def _transactions(rows) -> set[str]:
    """The transactions that wrote these rows as they stand (their xmin: one per transaction)."""
    return {str(xmin) for xmin in rows.extra(select={"xmin": "xmin::text"}).values_list("xmin", flat=True)}


def test_a_storm_of_logins_records_its_webhooks_with_the_sessions_in_a_few_transactions_and_hand_offs(anz, handoff):
    webhook_events_forget()
    with WebhookReceiver() as receiver:
        _, secret = webhook_endpoint_create(app_id=anz.pk, url=receiver.url)  # every event
        group = lives(60)
        users = [f"ANZ-{n % 40}" for n in range(60)]  # 20 users connect twice: 40 first connections

        async def logins() -> list:
            return await admit_all(group, users)

        async def ends() -> None:
            for life in group:
                life.close_note = "client closed (1006)"
            await asyncio.gather(*(life.end(ledger=None, channels=None, position=None) for life in group))

        firsts = asyncio.run(logins())
        connected = WebhookDelivery.objects.filter(event="user.connected")
        # Every first connection's event is committed by the time its login is answered.
        assert firsts.count(True) == 40 and connected.count() == 40
        asyncio.run(ends())
        disconnected = WebhookDelivery.objects.filter(event="user.disconnected")

        expected = sorted(f"ANZ-{n}" for n in range(40))
        assert sorted(r.payload["data"]["userId"] for r in connected) == expected
        assert sorted(r.payload["data"]["userId"] for r in disconnected) == expected
        # Each event was written in the transaction of the sessions it announces, and a batch of
        # logins shares one transaction: far fewer than one per login.
        written = _transactions(connected), _transactions(disconnected)
        assert written[0] <= _transactions(PresenceEvent.objects.filter(kind="connect"))
        assert written[1] <= _transactions(PresenceEvent.objects.filter(kind="disconnect"))
        assert len(written[0]) + len(written[1]) <= 10
        # ... and handed over once per batch (a hand-out task a webhook worker fans out), not per call.
        handed = handoff.tasks()
        assert {h.task for h in handed} <= {WEBHOOK_TASK, WEBHOOK_HAND_OUT_TASK}
        assert len(handed) <= len(written[0]) + len(written[1])

        handoff.pump()

        calls = receiver.wait_for(lambda call: True, count=80)
        assert sorted((c.event, c.json["data"]["userId"]) for c in calls) == sorted(
            [("user.connected", u) for u in expected] + [("user.disconnected", u) for u in expected])
        assert all(c.signed_with(secret) for c in calls)
        assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"delivered"}
    webhook_events_forget()


def test_a_session_row_the_database_refuses_refuses_the_login_and_gives_back_its_presence(anz):
    assert app_snapshot("ANZ") is not None  # the node still believes in the app for a few seconds
    ClientApp.objects.filter(pk=anz.pk).delete()  # so its session rows break their foreign key
    group = lives(3)

    results = asyncio.run(admit_all(group, ["ANZ-1", "ANZ-2", "ANZ-2"]))

    assert all(isinstance(r, Refusal) and r.code == CLOSE_TRY_AGAIN for r in results)
    assert not Session.objects.exists()
    assert cache.connections_of_many(["ANZ-1", "ANZ-2"]) == {"ANZ-1": [], "ANZ-2": []}
    assert group[0].node.connections == {}


def test_first_reads_give_each_user_its_subscriptions_and_an_ack_user_its_unacked_deliveries_once(anz):
    subscription_add(app_id=anz.pk, subscriber="ANZ-1", channel="news")
    subscription_add(app_id=anz.pk, subscriber="ANZ-1", channel="alerts")
    [sent] = messages_store(messages=[OutgoingMessage(app_id=anz.pk, sender="ANZ-9", recipients=("ANZ-1",),
                                                      content="hello")], route=lambda ids: None)
    deliveries_claim(delivery_ids=list(sent.delivery_ids), token=claim_token())

    reads = first_reads([FirstReadsFor(anz.pk, "ANZ-1", acks=True), FirstReadsFor(anz.pk, "ANZ-1", acks=True),
                         FirstReadsFor(anz.pk, "ANZ-2", acks=False)])

    assert reads[0].channels == reads[1].channels == ["alerts", "news"]
    assert reads[0].unacked == list(sent.delivery_ids) and reads[1].unacked == []
    assert reads[2].channels == [] and reads[2].unacked == []


def test_a_loop_batch_answers_each_item_alone_and_a_failed_flush_refuses_all_of_its_items():
    flushed: list[list] = []

    async def flush(items: list) -> list:
        flushed.append(items)
        if "boom" in items:
            raise ConnectionError("redis away")
        return [ValueError(i) if i == "bad" else i.upper() for i in items]

    async def run() -> tuple[list, list]:
        batcher = LoopBatcher("test", flush)
        first = await asyncio.gather(*(batcher.submit(i) for i in ("a", "bad", "b")), return_exceptions=True)
        second = await asyncio.gather(*(batcher.submit(i) for i in ("c", "boom")), return_exceptions=True)
        return first, second

    first, second = asyncio.run(run())

    assert first[0] == "A" and first[2] == "B" and isinstance(first[1], ValueError)
    assert all(isinstance(r, ConnectionError) for r in second)
    assert flushed == [["a", "bad", "b"], ["c", "boom"]]  # what one turn of the loop queues goes together


def test_the_fast_sends_of_one_loop_turn_find_their_recipients_connections_in_one_redis_round_trip(monkeypatch):
    node = NodeRuntime()
    reads: list[list[str]] = []
    real = cache.connections_of_many_async

    async def counted(user_ids):
        users = list(user_ids)
        reads.append(users)
        return await real(users)

    monkeypatch.setattr(cache, "connections_of_many_async", counted)

    async def run() -> list[dict]:
        added = await cache.connections_add(entries=[
            cache.ConnectionEntry(user_id="ANZ-1", channel_name="specific.a!1", node_id="n1", limit=5),
            cache.ConnectionEntry(user_id="ANZ-1", channel_name="specific.b!2", node_id="n2", acks=True, limit=5),
            cache.ConnectionEntry(user_id="ANZ-2", channel_name="specific.a!3", node_id="n1", limit=5),
        ])
        assert added == [True, False, True]
        return await asyncio.gather(*(node.fast_lookups.submit(users)
                                      for users in (["ANZ-1"], ["ANZ-2", "ANZ-9"], ["ANZ-1", "ANZ-2"])))

    one, two, both = asyncio.run(run())

    assert sorted(c.channel_name for c in one["ANZ-1"]) == ["specific.a!1", "specific.b!2"]
    assert [c.channel_name for c in two["ANZ-2"]] == ["specific.a!3"] and two["ANZ-9"] == []  # offline: nobody
    assert both.keys() == {"ANZ-1", "ANZ-2"} and both["ANZ-1"] == one["ANZ-1"]
    assert reads == [["ANZ-1", "ANZ-2", "ANZ-9", "ANZ-1", "ANZ-2"]]  # three sends, one pipeline (each user read once)
