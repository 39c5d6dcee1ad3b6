"""The one door from stored to routed (messaging.handoff): committed deliveries reach the workers'
routing queue by task name, in tasks of a bounded size; webhook calls leave the same way."""

from __future__ import annotations

import base64
import json

from config.celery import app
from messaging import tasks
from messaging.handoff import (
    ROUTE_TASK,
    ROUTING_QUEUE,
    ROUTING_TASK_MAX_IDS,
    WEBHOOK_TASK,
    routing_enqueue,
    webhook_calls_enqueue,
)


def _queued(redis_client, queue: str) -> list[tuple[str, list]]:
    """(task name, args) of every task waiting in `queue` on the broker, oldest first."""
    messages = [json.loads(raw) for raw in reversed(redis_client.lrange(queue, 0, -1))]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0]) for m in messages]


def test_committed_deliveries_reach_the_routing_queue_in_tasks_of_at_most_500(redis_client):
    redis_client.delete(ROUTING_QUEUE)
    routing_enqueue(list(range(1, 1201)))
    queued = _queued(redis_client, ROUTING_QUEUE)
    assert [name for name, _ in queued] == [ROUTE_TASK] * 3
    assert [args[0] for _, args in queued] == [list(range(1, 501)), list(range(501, 1001)), list(range(1001, 1201))]
    assert ROUTING_TASK_MAX_IDS == 500


def test_nothing_is_queued_for_no_deliveries(redis_client):
    redis_client.delete(ROUTING_QUEUE)
    routing_enqueue([])
    assert _queued(redis_client, ROUTING_QUEUE) == []


def test_each_webhook_call_is_a_task_of_its_own_under_its_claim(redis_client):
    redis_client.delete("celery")
    webhook_calls_enqueue(["a1", "b2"], 77)
    assert _queued(redis_client, "celery") == [(WEBHOOK_TASK, ["a1", 77]), (WEBHOOK_TASK, ["b2", 77])]


def test_every_task_the_door_names_is_one_the_workers_run():
    assert (tasks.route_deliveries.name, tasks.webhook_deliver.name) == (ROUTE_TASK, WEBHOOK_TASK)
    assert {ROUTE_TASK, WEBHOOK_TASK} <= set(app.tasks)
