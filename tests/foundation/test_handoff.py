"""The one door from stored to routed (foundation.handoff): committed deliveries reach the workers'
routing queue by task name, in tasks of a bounded size; webhook calls leave the same way, on a queue
of their own that only the webhook worker serves. One dispatcher decides where named work goes: the
broker in production, the test process's inline pump in tests."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from config.celery import app
from foundation.handoff import (
    DEFAULT_QUEUE,
    FLOOD_TASK,
    FORWARD_LINK_TASK,
    FORWARD_RECEIPTS_TASK,
    FORWARDING_QUEUE,
    ROUTE_TASK,
    ROUTING_QUEUE,
    ROUTING_TASK_MAX_IDS,
    WAKE_KEY,
    WEBHOOK_HAND_OUT_MAX_IDS,
    WEBHOOK_HAND_OUT_TASK,
    WEBHOOK_QUEUE,
    WEBHOOK_TASK,
    CeleryDispatcher,
    InlineDispatcher,
    dispatcher,
    dispatcher_use,
    flood_links_enqueue,
    forward_links_kick,
    receipt_links_kick,
    routing_enqueue,
    task_enqueue,
    webhook_calls_enqueue,
    webhook_calls_hand_over,
)
from messaging.federation.senders.outbox import link_lock_key
from messaging.routing import tasks
from tests.network import held_by_another_worker


@pytest.fixture
def broker():
    """Hand-offs go to the broker, as in production."""
    previous = dispatcher_use(CeleryDispatcher())
    yield
    dispatcher_use(previous)


def _queued(redis_client, queue: str) -> list[tuple[str, list]]:
    """(task name, args) of every task waiting in `queue` on the broker, oldest first."""
    messages = [json.loads(raw) for raw in reversed(redis_client.lrange(queue, 0, -1))]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0]) for m in messages]


def test_committed_deliveries_reach_the_routing_queue_in_tasks_of_at_most_500(redis_client, broker):
    redis_client.delete(ROUTING_QUEUE)
    routing_enqueue(list(range(1, 1201)))
    queued = _queued(redis_client, ROUTING_QUEUE)
    assert [name for name, _ in queued] == [ROUTE_TASK] * 3
    assert [args[0] for _, args in queued] == [list(range(1, 501)), list(range(501, 1001)), list(range(1001, 1201))]
    assert ROUTING_TASK_MAX_IDS == 500


def test_nothing_is_queued_for_no_deliveries(redis_client, broker):
    redis_client.delete(ROUTING_QUEUE)
    routing_enqueue([])
    assert _queued(redis_client, ROUTING_QUEUE) == []


def test_an_apps_own_named_task_goes_through_the_door_on_celerys_default_queue(redis_client, broker, settings):
    """analytics' jobs (analytics.services.jobs): no route of their own, so Celery's default queue, as
    a task sent without a queue always went; the routing worker serves it (`-Q celery,routing`)."""
    redis_client.delete(DEFAULT_QUEUE)
    task_enqueue("analytics.tasks.export_run", [7])
    assert _queued(redis_client, DEFAULT_QUEUE) == [("analytics.tasks.export_run", [7])]
    assert "analytics.tasks.export_run" not in settings.CELERY_TASK_ROUTES
    assert app.conf.task_default_queue == DEFAULT_QUEUE


ROOT = Path(__file__).resolve().parents[2]


def test_each_webhook_call_is_a_task_of_its_own_under_its_claim_on_the_webhooks_queue(redis_client, broker):
    redis_client.delete("celery", WEBHOOK_QUEUE)
    webhook_calls_enqueue(["a1", "b2"], 77)
    assert _queued(redis_client, WEBHOOK_QUEUE) == [(WEBHOOK_TASK, ["a1", 77]), (WEBHOOK_TASK, ["b2", 77])]
    assert _queued(redis_client, "celery") == []
    assert settings.CELERY_TASK_ROUTES[WEBHOOK_TASK] == {"queue": WEBHOOK_QUEUE}


def test_calls_recorded_together_leave_in_one_hand_out_task_that_gives_each_its_own_on_the_webhooks_queue(
        redis_client, broker):
    redis_client.delete("celery", WEBHOOK_QUEUE)
    ids = [f"id{n}" for n in range(WEBHOOK_HAND_OUT_MAX_IDS + 2)]
    webhook_calls_hand_over(ids, 77)
    webhook_calls_hand_over(["alone"], 78)  # one call needs no hand-out
    queued = _queued(redis_client, WEBHOOK_QUEUE)
    assert queued == [(WEBHOOK_HAND_OUT_TASK, [ids[:WEBHOOK_HAND_OUT_MAX_IDS], 77]),
                      (WEBHOOK_HAND_OUT_TASK, [ids[WEBHOOK_HAND_OUT_MAX_IDS:], 77]), (WEBHOOK_TASK, ["alone", 78])]
    assert settings.CELERY_TASK_ROUTES[WEBHOOK_HAND_OUT_TASK] == {"queue": WEBHOOK_QUEUE}

    redis_client.delete(WEBHOOK_QUEUE)
    assert tasks.webhook_hand_out(["a1", "b2"], 77) == 2  # what the webhook worker runs
    assert _queued(redis_client, WEBHOOK_QUEUE) == [(WEBHOOK_TASK, ["a1", 77]), (WEBHOOK_TASK, ["b2", 77])]


def _queues_of_workers(text: str) -> list[str]:
    return re.findall(r'-Q"?,? "?([a-z,]+)', text)  # `-Q a,b` (a command line) or `"-Q", "a,b"` (an argv)


def test_webhook_and_forwarding_calls_have_a_worker_of_their_own_in_make_run_compose_and_the_procfile():
    procfile = (ROOT / "platform" / "Procfile").read_text()
    supervise = (ROOT / "platform" / "devstack" / "supervise.py").read_text()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    compose = [" ".join(s["command"]) for s in services.values() if "worker" in s.get("command", [])]
    for where, workers in (("Procfile", _queues_of_workers(procfile)), ("supervise", _queues_of_workers(supervise)),
                           ("compose", [c.split("-Q ")[1].split()[0] for c in compose])):
        served = [set(queues.split(",")) for queues in workers]
        # The outbound worker: the calls that wait on others (tenants' receivers, neighbour domains).
        assert {WEBHOOK_QUEUE, FORWARDING_QUEUE} in served, where
        assert any(ROUTING_QUEUE in q for q in served), where
        assert not any(ROUTING_QUEUE in q and (WEBHOOK_QUEUE in q or FORWARDING_QUEUE in q) for q in served), where


def test_every_task_the_door_names_is_one_the_workers_run():
    from foundation import handoff

    named = {value for name, value in vars(handoff).items() if name.endswith("_TASK")}
    assert (tasks.route_deliveries.name, tasks.webhook_deliver.name) == (ROUTE_TASK, WEBHOOK_TASK)
    assert named <= set(app.tasks)
    for task in named:  # and each is routed to the queue the door names for it
        assert task in settings.CELERY_TASK_ROUTES


def test_the_composition_root_chose_the_broker_for_production_and_the_inline_pump_for_tests():
    from config.settings import base

    assert base.HANDOFF_DISPATCHER == "foundation.handoff.CeleryDispatcher"
    assert settings.HANDOFF_DISPATCHER == "foundation.handoff.InlineDispatcher"
    assert isinstance(dispatcher(), InlineDispatcher)


@pytest.mark.django_db
def test_the_inline_pump_runs_handed_work_through_the_workers_task_functions_in_order(handoff, redis_client):
    redis_client.delete(ROUTING_QUEUE, FORWARDING_QUEUE)
    routing_enqueue([101, 102])
    receipt_links_kick(["domain-02"])
    assert [(h.task, h.args, h.queue) for h in handoff.tasks()] == [
        (ROUTE_TASK, [[101, 102]], ROUTING_QUEUE), (FORWARD_RECEIPTS_TASK, ["domain-02"], FORWARDING_QUEUE)]
    assert redis_client.llen(ROUTING_QUEUE) == 0  # nothing went to the broker
    ran = handoff.pump()
    assert [h.task for h in ran] == [ROUTE_TASK, FORWARD_RECEIPTS_TASK] and handoff.tasks() == []


def test_a_links_flood_sender_is_woken_once_however_many_publishes_wait_for_it(redis_client, broker):
    wakes = [WAKE_KEY.format(here="domain-01", task=FLOOD_TASK, peer=p) for p in ("domain-02", "domain-04")]
    redis_client.delete(FORWARDING_QUEUE, *wakes)
    for _ in range(3):
        flood_links_enqueue(["domain-02", "domain-04"])
    assert _queued(redis_client, FORWARDING_QUEUE) == [(FLOOD_TASK, ["domain-02"]), (FLOOD_TASK, ["domain-04"])]
    dispatcher().woken(FLOOD_TASK, "domain-02")  # the sender started: what is published from now on wakes it again
    flood_links_enqueue(["domain-02", "domain-04"])
    assert _queued(redis_client, FORWARDING_QUEUE)[2:] == [(FLOOD_TASK, ["domain-02"])]
    redis_client.delete(FORWARDING_QUEUE, *wakes)


def _etas(redis_client, queue: str) -> list[str | None]:
    return [json.loads(raw)["headers"].get("eta") for raw in reversed(redis_client.lrange(queue, 0, -1))]


def test_a_links_sender_is_woken_once_per_burst_its_receipts_a_moment_later_and_the_sweep_wakes_it_regardless(
        redis_client, broker):
    wakes = [WAKE_KEY.format(here="domain-01", task=t, peer="domain-02") for t in (FORWARD_LINK_TASK, FORWARD_RECEIPTS_TASK)]
    redis_client.delete(FORWARDING_QUEUE, *wakes)
    for _ in range(5):  # five routing batches queue rows on the link before its sender starts
        forward_links_kick(["domain-02"])
        receipt_links_kick(["domain-02"])
    assert _queued(redis_client, FORWARDING_QUEUE) == [(FORWARD_LINK_TASK, ["domain-02"]),
                                                       (FORWARD_RECEIPTS_TASK, ["domain-02"])]
    link_eta, receipts_eta = _etas(redis_client, FORWARDING_QUEUE)
    assert link_eta is None and receipts_eta is not None  # receipts linger, to go in one call
    dispatcher().woken(FORWARD_LINK_TASK, "domain-02")  # it started: what is queued from now on wakes it again
    forward_links_kick(["domain-02"])
    receipt_links_kick(["domain-02"])
    assert _queued(redis_client, FORWARDING_QUEUE)[2:] == [(FORWARD_LINK_TASK, ["domain-02"])]
    forward_links_kick(["domain-02"], again=True)  # the sweep: a wake-up may have been lost with its worker
    receipt_links_kick(["domain-02"], again=True)
    assert _queued(redis_client, FORWARDING_QUEUE)[3:] == [(FORWARD_LINK_TASK, ["domain-02"]),
                                                          (FORWARD_RECEIPTS_TASK, ["domain-02"])]
    redis_client.delete(FORWARDING_QUEUE, *wakes)


@pytest.mark.django_db
def test_a_links_sender_that_finds_another_run_sending_looks_again_a_moment_later(redis_client, broker):
    wake = WAKE_KEY.format(here=settings.DOMAIN_NAME, task=FORWARD_LINK_TASK, peer="domain-02")
    redis_client.delete(FORWARDING_QUEUE, wake)
    with held_by_another_worker(link_lock_key("domain-02")):
        assert tasks.forward_link("domain-02")["skipped"] == "busy"
        forward_links_kick(["domain-02"])  # rows queued meanwhile: that look is on its way already
    assert _queued(redis_client, FORWARDING_QUEUE) == [(FORWARD_LINK_TASK, ["domain-02"])]
    assert _etas(redis_client, FORWARDING_QUEUE)[0] is not None  # a moment later, when that run is likely done
    redis_client.delete(FORWARDING_QUEUE, wake)
