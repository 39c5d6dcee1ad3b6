"""Channel publishes flooded across domains (messaging.federation.flood and flood_sender), on the seed's
ring in one database (tests/network.py): each domain its own tables, calls to the neighbour's view."""

from __future__ import annotations

import json

import pytest

from apps_registry.selectors import app_snapshot
from foundation.handoff import FLOOD_TASK
from foundation.outgoing import Answer
from messaging.channels.models import ChannelMessage
from messaging.channels.services import channel_history, channel_publish
from messaging.federation import flood
from messaging.federation.flood import publishes_accept
from messaging.federation.models import ChannelForward, LinkHealth
from messaging.federation.senders.flood_sender import flood_link_send, flood_links_due, flood_lock_key
from messaging.federation.wire.transport import PeerRefused, wire_use
from messaging.intake.server_sends import server_channel_publish
from tests.network import held_by_another_worker

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


def test_a_publish_is_queued_to_every_neighbour_over_an_enabled_link_in_the_same_transaction(net_ring):
    net_ring.disable("domain-01", "domain-04")
    with net_ring.at("domain-01"):
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


def test_flooded_publishes_are_stored_in_order_under_this_domains_own_offsets_and_passed_on(net_ring):
    app = app_snapshot("ANZ")
    with net_ring.at("domain-03"):
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


def test_a_publish_that_arrives_again_is_a_duplicate_and_takes_no_offset(net_ring):
    with net_ring.at("domain-03"):
        publishes_accept(sender="domain-02", payload={"publishes": [item("one", offset=7)]})
        again = publishes_accept(sender="domain-04", payload={"publishes": [
            item("one", offset=7, path=("domain-01", "domain-04")), item("two", offset=8, path=("domain-01", "domain-04"))]})
        assert again == {"stored": 1, "duplicates": 1, "refused": []}
        assert channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content="next") == 3  # no gap
        assert [o for o, *_ in stored()] == [1, 2, 3]
        # The duplicate is not passed on again; "two" came from 04, so it goes on to 02 only.
        assert queue("domain-02") == [("two", "domain-01,domain-04,domain-03"), ("next", "domain-03")]


def test_readers_connected_here_get_a_flooded_publish_once_it_is_committed(net_ring, monkeypatch):
    fanned = []
    monkeypatch.setattr(flood, "channel_fanout", lambda **kw: fanned.append((kw["channel"], kw["offset"], kw["content"])))
    with net_ring.at("domain-03"):  # its work commits as the block ends
        publishes_accept(sender="domain-02", payload={"publishes": [item("one", offset=7)]})
        assert fanned == [] and net_ring.waiting() == []  # nothing leaves before the commit
    assert fanned == [("news", 1, "one")]
    assert [(h.task, h.args, h.context) for h in net_ring.waiting()] == [(FLOOD_TASK, ["domain-04"], "domain-03")]


def test_a_publish_at_the_hop_limit_is_stored_but_not_passed_on(net_ring, settings):
    settings.FORWARD_HOP_LIMIT = 2
    with net_ring.at("domain-03"):
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
def test_a_malformed_or_impossible_call_is_refused_whole_with_its_reason(net_ring, payload, status, reason):
    with net_ring.at("domain-03"):
        with pytest.raises(PeerRefused) as refused:
            publishes_accept(sender="domain-02", payload={"publishes": [item("fine", offset=9), *payload["publishes"]]}
                             if payload.get("publishes") else payload)
        assert refused.value.status == status
        assert reason in refused.value.reason
        assert not ChannelMessage.objects.exists()


def test_a_publish_this_domain_cannot_take_is_refused_alone(net_ring):
    with net_ring.at("domain-03"):
        answer = publishes_accept(sender="domain-02", payload={"publishes": [
            item("fine", offset=1), item("who?", offset=2, app="XYZ"), item("bad", offset=3, channel="@BNZ-1")]})
        assert answer["stored"] == 1
        assert [r["index"] for r in answer["refused"]] == [1, 2]
        assert "unknown_app" in answer["refused"][0]["reason"]
        assert [c for _, c, *_ in stored()] == ["fine"]


# --- sending ---------------------------------------------------------------------------------------


def publish(net_ring, n: int, at: str = "domain-01") -> None:
    with net_ring.at(at):
        for i in range(n):
            channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content=f"m{i}")


def test_a_link_sends_its_queue_in_order_and_the_next_domain_stores_and_passes_it_on(net_ring):
    publish(net_ring, 3)
    with net_ring.at("domain-01"):
        outcome = flood_link_send(peer="domain-02")
    assert (outcome.sent, outcome.failed) == (3, 0)
    [call] = net_ring.calls
    assert (call.sender, call.peer, call.path) == ("domain-01", "domain-02", "/internal/v1/publishes")
    assert call.payload["publishes"][0] == {"app": "ANZ", "channel": "news", "content": "m0", "publisher": "",
                                            "origin_domain": "domain-01", "origin_offset": 1, "path": ["domain-01"]}
    assert [p["content"] for p in call.payload["publishes"]] == ["m0", "m1", "m2"]
    with net_ring.at("domain-01"):
        assert queue("domain-02") == []
        assert LinkHealth.objects.get(peer="domain-02").forwarded_out == 3  # domain-01's view of its link to 02
    with net_ring.at("domain-02"):
        # domain-02 stored them under its own offsets and queued them for 03 (not back to 01).
        assert [(o, c, origin, oo) for o, c, origin, oo in stored()] == [
            (1, "m0", "domain-01", 1), (2, "m1", "domain-01", 2), (3, "m2", "domain-01", 3)]
        assert [c for c, _ in queue("domain-03")] == ["m0", "m1", "m2"] and queue("domain-01") == []
        assert LinkHealth.objects.get(peer="domain-01").forwarded_in == 3  # and domain-02's of its link to 01


def test_the_flood_reaches_every_domain_of_the_ring_once_by_whichever_path_comes_first(net_ring):
    publish(net_ring, 2)
    net_ring.pump()
    for domain in ("domain-02", "domain-03", "domain-04"):
        with net_ring.at(domain):
            assert [(c, origin, oo) for _, c, origin, oo in stored()] == [("m0", "domain-01", 1), ("m1", "domain-01", 2)]
            assert not ChannelForward.objects.filter(dead_at__isnull=True).exists()  # nothing left to send


def test_a_large_queue_leaves_in_batches(net_ring, settings):
    settings.FORWARD_BATCH_SIZE = 2
    publish(net_ring, 5)
    with net_ring.at("domain-01"):
        assert flood_link_send(peer="domain-02").sent == 5
    assert [len(c.payload["publishes"]) for c in net_ring.calls] == [2, 2, 1]


def test_a_queue_of_large_publishes_leaves_in_calls_bounded_by_bytes(net_ring, settings):
    settings.FORWARD_BATCH_BYTES = 25_000
    with net_ring.at("domain-01"):
        for i in range(5):
            channel_publish(app_id=app_snapshot("ANZ").pk, channel="news", content=f"{i}" + "x" * 10_000)
        assert flood_link_send(peer="domain-02").sent == 5
    assert [len(c.payload["publishes"]) for c in net_ring.calls] == [2, 2, 1]
    with net_ring.at("domain-02"):
        assert [c[0] for _, c, *_ in stored()] == ["0", "1", "2", "3", "4"]


def test_a_failed_call_counts_an_attempt_holds_the_link_back_and_dead_letters_at_the_apps_maximum(net_ring):
    net_ring.down.add("domain-02")
    app = app_snapshot("ANZ")
    publish(net_ring, 1)
    with net_ring.at("domain-01"):
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


class RefusingFirst:
    """A neighbour that takes a call's publishes but the first, which it refuses alone."""

    def post(self, call, *, deadline):
        answer = {"stored": 1, "duplicates": 0, "refused": [{"index": 0, "reason": "unknown_app: no app named ANZ"}]}
        return Answer(200, json.dumps(answer).encode(), complete=True)


def test_a_publish_the_neighbour_refuses_alone_is_dead_with_its_reason_and_the_rest_go(net_ring):
    publish(net_ring, 2)
    previous = wire_use(RefusingFirst())
    try:
        with net_ring.at("domain-01"):
            outcome = flood_link_send(peer="domain-02")
            assert (outcome.sent, outcome.refused) == (1, 1)
            dead = ChannelForward.objects.get(peer="domain-02")
            assert dead.publish.content == "m0" and dead.last_error == "refused: unknown_app: no app named ANZ"
    finally:
        wire_use(previous)


def test_one_sender_per_link_at_a_time(net_ring):
    publish(net_ring, 1)
    with held_by_another_worker(flood_lock_key("domain-02")), net_ring.at("domain-01"):
        assert flood_link_send(peer="domain-02").skipped == "busy"
    with net_ring.at("domain-01"):
        assert flood_link_send(peer="domain-02").sent == 1


def test_a_subscriber_resuming_with_since_gets_exactly_what_it_missed_from_its_domains_history(net_ring):
    app = app_snapshot("ANZ")
    with net_ring.at("domain-02"):
        publishes_accept(sender="domain-01", payload={"publishes": [
            item(f"m{n}", offset=n, path=("domain-01",)) for n in range(1, 6)]})
        assert [(h.offset, h.content) for h in channel_history(app_id=app.pk, channel="news", after=3)] == \
            [(4, "m4"), (5, "m5")]


def test_history_past_retention_takes_its_waiting_and_dead_flood_rows_with_it(net_ring):
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from messaging.channels.retention import channel_history_expire

    publish(net_ring, 3)
    ChannelForward.objects.filter(peer="domain-04").update(dead_at=timezone.now(), last_error="gone")
    ChannelMessage.objects.filter(offset__lt=3).update(created_at=timezone.now() - timedelta(days=400))
    with transaction.atomic():  # the foreign key is checked at commit: a savepoint would not show it
        assert channel_history_expire() == 2
        with transaction.get_connection().cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert queue("domain-02") == [("m2", "domain-01")]
    assert list(ChannelForward.objects.filter(peer="domain-04").values_list("publish__content", flat=True)) == ["m2"]
