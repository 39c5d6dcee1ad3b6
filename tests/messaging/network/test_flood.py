"""Channel publishes flooded across domains (messaging.network.flood and flood_sender), one domain
played at a time in one database (tests/messaging/network/conftest.py)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from apps_registry.selectors import app_snapshot
from messaging.channels.models import ChannelMessage
from messaging.channels.services import channel_history, channel_publish
from messaging.network import flood, flood_sender
from messaging.network.flood import publishes_accept
from messaging.network.flood_sender import flood_link_send, flood_links_due
from messaging.network.models import ChannelForward, LinkHealth
from messaging.network.transport import PeerError, PeerRefused
from messaging.server_sends import server_channel_publish
from tests.messaging.network.one_db_ring import as_domain, link

pytestmark = pytest.mark.django_db


def item(content: str, *, offset: int, path=("domain-01", "domain-02"), channel: str = "news", app: str = "ANZ",
         **extra) -> dict:
    return {"app": app, "channel": channel, "content": content, "publisher": "ANZ-1", "origin_domain": path[0],
            "origin_offset": offset, "path": list(path), **extra}


def queue(peer: str) -> list[tuple[str, str]]:
    """(content, path) of the publishes waiting on the link to `peer`, in order."""
    return list(ChannelForward.objects.filter(peer=peer, dead_at__isnull=True).order_by("id")
                .values_list("publish__content", "path"))


def stored(channel: str = "news") -> list[tuple[int, str, str, int | None]]:
    return list(ChannelMessage.objects.filter(channel__name=channel).order_by("offset")
                .values_list("offset", "content", "origin_domain", "origin_offset"))


# --- a publish is queued to every neighbour ------------------------------------------------------


def test_a_publish_is_queued_to_every_neighbour_over_an_enabled_link_in_the_same_transaction(ring):
    disabled = link(ring, "domain-01", "domain-04")
    disabled.enabled = False
    disabled.save()
    with as_domain("domain-01"):
        published = server_channel_publish(app=app_snapshot("ANZ"), channel="news", content="hello")
    assert published.offset == 1
    assert queue("domain-02") == [("hello", "domain-01")]
    assert queue("domain-04") == []  # the link is disabled: the flood reaches 04 the other way round


def test_a_domain_without_neighbours_queues_nothing(db):
    from tests.factories import make_app

    app = make_app()
    assert channel_publish(app_id=app.pk, channel="news", content="alone") == 1
    assert not ChannelForward.objects.exists()


# --- receiving ------------------------------------------------------------------------------------


def test_flooded_publishes_are_stored_in_order_under_this_domains_own_offsets_and_passed_on(ring):
    app = app_snapshot("ANZ")
    with as_domain("domain-03"):
        channel_publish(app_id=app.pk, channel="news", content="local first")
        answer = publishes_accept(sender="domain-02", payload={"publishes": [
            item("one", offset=7), item("two", offset=8)]})
    assert answer == {"stored": 2, "duplicates": 0, "refused": []}
    assert stored() == [(1, "local first", "", None), (2, "one", "domain-01", 7), (3, "two", "domain-01", 8)]
    # On to 04 only: not back to the sender 02, nor to 01 where it started.
    assert queue("domain-04") == [("local first", "domain-03"), ("one", "domain-01,domain-02,domain-03"),
                                  ("two", "domain-01,domain-02,domain-03")]
    assert queue("domain-02") == [("local first", "domain-03")]
    assert LinkHealth.objects.get(peer="domain-02").forwarded_in == 2


def test_a_publish_that_arrives_again_is_a_duplicate_and_takes_no_offset(ring):
    with as_domain("domain-03"):
        publishes_accept(sender="domain-02", payload={"publishes": [item("one", offset=7)]})
        again = publishes_accept(sender="domain-04", payload={"publishes": [
            item("one", offset=7, path=("domain-01", "domain-04")), item("two", offset=8, path=("domain-01", "domain-04"))]})
        assert again == {"stored": 1, "duplicates": 1, "refused": []}
        assert channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content="next") == 3  # no gap
    assert [o for o, *_ in stored()] == [1, 2, 3]
    # The duplicate is not passed on again; "two" came from 04, so it goes on to 02 only.
    assert queue("domain-02") == [("two", "domain-01,domain-04,domain-03"), ("next", "domain-03")]


def test_readers_connected_here_get_a_flooded_publish_once_it_is_committed(ring, monkeypatch,
                                                                               django_capture_on_commit_callbacks):
    fanned = []
    monkeypatch.setattr(flood, "channel_fanout", lambda **kw: fanned.append((kw["channel"], kw["offset"], kw["content"])))
    monkeypatch.setattr(flood.handoff, "flood_links_enqueue", lambda peers: fanned.append(("wake", tuple(peers))))
    with as_domain("domain-03"), django_capture_on_commit_callbacks(execute=True):
        publishes_accept(sender="domain-02", payload={"publishes": [item("one", offset=7)]})
        assert fanned == []  # nothing leaves before the commit
    assert fanned == [("news", 1, "one"), ("wake", ("domain-04",))]


def test_a_publish_at_the_hop_limit_is_stored_but_not_passed_on(ring, settings):
    settings.FORWARD_HOP_LIMIT = 2
    with as_domain("domain-03"):
        answer = publishes_accept(sender="domain-02", payload={"publishes": [item("far", offset=1)]})
    assert answer["stored"] == 1
    assert not ChannelForward.objects.filter(peer="domain-04").exists()


@pytest.mark.parametrize(("payload", "status", "reason"), [
    ({}, 400, "the body must be"),
    ({"publishes": []}, 400, "non-empty list"),
    ({"publishes": ["x"]}, 400, "publishes[1] must be an object"),
    ({"publishes": [{"app": "ANZ"}]}, 400, "publishes[1] lacks channel, content"),
    ({"publishes": [item("x", offset=1, extra=1)]}, 400, "unexpected field(s) extra"),
    ({"publishes": [item("x", offset=True)]}, 400, "origin_offset must be an integer"),
    ({"publishes": [item("x", offset=0)]}, 400, "at least 1"),
    ({"publishes": [item("x", offset=1, path=("domain-01", "not a domain!"))]}, 400, "list of domain names"),
    ({"publishes": [item("x", offset=1, path=("domain-01", "domain-04"))]}, 422, "must end with the calling domain"),
    ({"publishes": [item("x", offset=1, path=("domain-01", "domain-03", "domain-02"))]}, 422, "already passes through"),
    ({"publishes": [item("x", offset=1, path=[f"domain-{n:02}" for n in range(10, 20)] + ["domain-02"])]}, 422,
     "over the hop limit"),
])
def test_a_malformed_or_impossible_call_is_refused_whole_with_its_reason(ring, payload, status, reason):
    with as_domain("domain-03"), pytest.raises(PeerRefused) as refused:
        publishes_accept(sender="domain-02", payload={"publishes": [item("fine", offset=9), *payload["publishes"]]}
                         if payload.get("publishes") else payload)
    assert refused.value.status == status
    assert reason in refused.value.reason
    assert not ChannelMessage.objects.exists()


def test_a_publish_this_domain_cannot_take_is_refused_alone(ring):
    with as_domain("domain-03"):
        answer = publishes_accept(sender="domain-02", payload={"publishes": [
            item("fine", offset=1), item("who?", offset=2, app="XYZ"), item("bad", offset=3, channel="@BNZ-1")]})
    assert answer["stored"] == 1
    assert [r["index"] for r in answer["refused"]] == [1, 2]
    assert "unknown_app" in answer["refused"][0]["reason"]
    assert [c for _, c, *_ in stored()] == ["fine"]


# --- sending ---------------------------------------------------------------------------------------


@pytest.fixture
def network(monkeypatch):
    """The flood senders' calls, answered in this process by the domain they are addressed to."""
    calls = []

    def call(*, peer, path, payload):
        calls.append((peer, payload))
        sender = flood_sender.settings.DOMAIN_NAME
        with override_settings(DOMAIN_NAME=peer):
            return publishes_accept(sender=sender, payload=payload)

    monkeypatch.setattr(flood_sender, "peer_call", call)
    return calls


def test_a_link_sends_its_queue_in_order_and_the_next_domain_stores_and_passes_it_on(ring, network):
    app = app_snapshot("ANZ")
    with as_domain("domain-01"):
        for n in range(3):
            channel_publish(app_id=app.pk, channel="news", content=f"m{n}")
        outcome = flood_link_send(peer="domain-02")
    assert (outcome.sent, outcome.failed) == (3, 0)
    [(peer, payload)] = network
    assert peer == "domain-02"
    assert payload["publishes"][0] == {"app": "ANZ", "channel": "news", "content": "m0", "publisher": "",
                                       "origin_domain": "domain-01", "origin_offset": 1, "path": ["domain-01"]}
    assert [p["content"] for p in payload["publishes"]] == ["m0", "m1", "m2"]
    assert queue("domain-02") == []
    # domain-02 stored them (its own offsets 4-6 here, the table being shared) and queued them for 03.
    assert [c for c, _ in queue("domain-03")] == ["m0", "m1", "m2"]
    assert LinkHealth.objects.get(peer="domain-02").forwarded_out == 3  # domain-01's view of its link to 02
    assert LinkHealth.objects.get(peer="domain-01").forwarded_in == 3  # and domain-02's of its link to 01


def test_a_large_queue_leaves_in_batches(ring, network, settings):
    settings.FORWARD_BATCH_SIZE = 2
    with as_domain("domain-01"):
        for n in range(5):
            channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content=f"m{n}")
        assert flood_link_send(peer="domain-02").sent == 5
    assert [len(p["publishes"]) for _, p in network] == [2, 2, 1]


def test_a_failed_call_counts_an_attempt_holds_the_link_back_and_dead_letters_at_the_apps_maximum(ring, monkeypatch):
    def unreachable(**kw):
        raise PeerError("domain-02: connection refused")

    monkeypatch.setattr(flood_sender, "peer_call", unreachable)
    app = app_snapshot("ANZ")
    with as_domain("domain-01"):
        channel_publish(app_id=app.pk, channel="news", content="m0")
        outcome = flood_link_send(peer="domain-02")
        assert (outcome.failed, outcome.dead, outcome.error) == (1, 0, "domain-02: connection refused")
        row = ChannelForward.objects.get(peer="domain-02")
        assert (row.attempts, row.last_error) == (1, "domain-02: connection refused")
        health = LinkHealth.objects.get(peer="domain-02")
        assert not health.up and health.retry_at is not None
        assert flood_link_send(peer="domain-02").skipped == "held back"
        assert "domain-02" not in flood_links_due()
        ChannelForward.objects.update(attempts=app.max_delivery_attempts - 1)
        LinkHealth.objects.update(retry_at=None)
        assert flood_links_due() == ["domain-02", "domain-04"]
        assert flood_link_send(peer="domain-02").dead == 1
    row.refresh_from_db()
    assert row.dead_at is not None and row.last_error == "domain-02: connection refused"
    assert queue("domain-02") == []


def test_a_publish_the_neighbour_refuses_alone_is_dead_with_its_reason_and_the_rest_go(ring, monkeypatch):
    monkeypatch.setattr(flood_sender, "peer_call", lambda **kw: {
        "stored": 1, "duplicates": 0, "refused": [{"index": 0, "reason": "unknown_app: no app named ANZ"}]})
    with as_domain("domain-01"):
        for n in range(2):
            channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content=f"m{n}")
        outcome = flood_link_send(peer="domain-02")
    assert (outcome.sent, outcome.refused) == (1, 1)
    dead = ChannelForward.objects.get(peer="domain-02")
    assert dead.publish.content == "m0" and dead.last_error == "refused: unknown_app: no app named ANZ"


def test_one_sender_per_link_at_a_time(ring, network):
    from django.db import connections

    with as_domain("domain-01"):
        channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content="m0")
        key = [flood_sender.FLOOD_LOCK_NAMESPACE, flood_sender._lock_key("domain-02")]
        other = connections.create_connection("default")  # another worker's sender, at work on the link
        try:
            with other.cursor() as cur:
                cur.execute("SELECT pg_advisory_lock(%s, %s)", key)
            assert flood_link_send(peer="domain-02").skipped == "busy"
            with other.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", key)
        finally:
            other.close()
        assert flood_link_send(peer="domain-02").sent == 1


def test_a_subscriber_resuming_with_since_gets_exactly_what_it_missed_from_its_domains_history(ring):
    app = app_snapshot("ANZ")
    with as_domain("domain-02"):
        publishes_accept(sender="domain-01", payload={"publishes": [
            item(f"m{n}", offset=n, path=("domain-01",)) for n in range(1, 6)]})
        assert [(h.offset, h.content) for h in channel_history(app_id=app.pk, channel="news", after=3)] == \
            [(4, "m4"), (5, "m5")]


def test_history_past_retention_takes_its_waiting_and_dead_flood_rows_with_it(ring):
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from messaging.channels.retention import channel_history_expire

    with as_domain("domain-01"):
        for n in range(3):
            channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content=f"m{n}")
    ChannelForward.objects.filter(peer="domain-04").update(dead_at=timezone.now(), last_error="gone")
    ChannelMessage.objects.filter(offset__lt=3).update(created_at=timezone.now() - timedelta(days=400))
    with transaction.atomic():  # the foreign key is checked at commit: a savepoint would not show it
        assert channel_history_expire() == 2
        with transaction.get_connection().cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert queue("domain-02") == [("m2", "domain-01")]
    assert list(ChannelForward.objects.filter(peer="domain-04").values_list("publish__content", flat=True)) == ["m2"]
