"""The outbound core (foundation.outbound): one give-up rule, claim tokens, and the skeleton every
sender runs on (its lock: tests/foundation/test_locks.py; its backoff: test_backoff.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from django.db import connection

from foundation.locks import one_at_a_time
from foundation.outbound import (
    Batch,
    CallFailed,
    Failed,
    Limits,
    NotNow,
    Settled,
    claim_token,
    out_of_attempts,
    send_batches,
)

pytestmark = pytest.mark.django_db


# --- give-up, claims ----------------------------------------------------------------------------


def test_an_item_is_given_up_once_its_failed_attempts_reach_the_maximum():
    with connection.cursor() as cur:
        cur.execute(f"SELECT {out_of_attempts('%s', '3')}, {out_of_attempts('%s', '3')}", [2, 3])
        assert cur.fetchone() == (False, True)


def test_claim_tokens_fit_a_bigint_and_do_not_repeat():
    tokens = {claim_token() for _ in range(1000)}
    assert len(tokens) == 1000 and all(0 <= t < 2 ** 63 for t in tokens)


def test_a_call_takes_rows_up_to_its_byte_limit_and_always_at_least_one():
    limits = Limits(rows=4, bytes=100)
    assert limits.cut([30, 30, 30, 30, 30]) == 3
    assert limits.cut([500, 10]) == 1  # a large item goes alone
    assert limits.cut([10, 500]) == 1
    assert limits.cut([1] * 10) == 4
    assert limits.cut([]) == 0


# --- the skeleton ------------------------------------------------------------------------------------


@dataclass
class Queue:
    """A sender over an in-memory queue; `answers` says what each call does."""

    items: list[tuple[str, int]]
    answers: list = field(default_factory=list)
    name: str = "test"
    lock_key: str | None = "test:queue"
    held: bool = False
    max_attempts: int = 2
    rows: int = 2
    sent: list[list[str]] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    put_back_count: int = 0
    knows_drained: bool = False  # its take says when it saw the whole queue
    takes: int = 0
    held_asked: int = 0

    def limits(self) -> Limits:
        return Limits(rows=self.rows, bytes=1000)

    def held_back(self) -> bool:
        self.held_asked += 1
        return self.held

    def take(self, limits: Limits) -> Batch:
        self.takes += 1
        fetched = self.items[:limits.rows]
        head = fetched[:limits.cut([size for _, size in fetched])]
        drained = self.knows_drained and limits.drained(fetched=len(fetched), kept=len(head))
        return Batch(items=[i for i in head if not i[0].startswith("!")], drained=drained,
                     refused=[(i, "refused before any call") for i in head if i[0].startswith("!")])

    def send(self, batch: Batch):
        answer = self.answers.pop(0) if self.answers else "ok"
        if isinstance(answer, Exception):
            raise answer
        self.sent.append([name for name, _ in batch.items])
        return answer

    def settle(self, batch: Batch, answer) -> Settled:
        for item in batch.items:
            self.items.remove(item)
        return Settled(sent=len(batch.items))

    def fail(self, batch: Batch, error: CallFailed) -> Failed:
        dead = 0
        for item in batch.items:
            self.attempts[item[0]] = self.attempts.get(item[0], 0) + 1
            if self.attempts[item[0]] >= self.max_attempts:
                self.items.remove(item)
                self.dead[item[0]] = error.reason
                dead += 1
        self.held = True  # the backoff holds the queue back
        return Failed(failed=len(batch.items), dead=dead)

    def give_up(self, refused) -> int:
        for item, reason in refused:
            self.items.remove(item)
            self.dead[item[0]] = reason
        return len(refused)

    def put_back(self, batch: Batch) -> None:
        self.put_back_count += 1


def test_a_sender_sends_its_queue_in_order_in_bounded_batches_until_it_is_empty():
    queue = Queue(items=[("a", 10), ("b", 10), ("c", 900), ("d", 900), ("e", 10)])
    outcome = send_batches(queue)
    assert queue.sent == [["a", "b"], ["c"], ["d", "e"]] and queue.items == []
    assert (outcome.sent, outcome.calls, outcome.failed, outcome.skipped) == (5, 3, 0, "")


def test_a_run_whose_batch_was_the_whole_queue_ends_after_it_without_looking_again():
    queue = Queue(items=[("a", 10), ("b", 10), ("c", 10)], rows=2, knows_drained=True)
    outcome = send_batches(queue)
    assert queue.sent == [["a", "b"], ["c"]] and queue.items == []
    assert (outcome.calls, queue.takes) == (2, 2)  # no third look at an empty queue
    queue.items = [("d", 900), ("e", 900)]  # cut for bytes: more was left behind the first call
    send_batches(queue)
    assert queue.sent[2:] == [["d"], ["e"]] and queue.takes == 4


def test_a_sender_that_cannot_tell_looks_at_its_queue_once_more_before_it_stops():
    queue = Queue(items=[("a", 10)], rows=2)
    send_batches(queue)
    assert queue.sent == [["a"]] and queue.takes == 2


def test_a_run_asks_whether_it_is_held_back_once_not_before_every_batch():
    queue = Queue(items=[("a", 1), ("b", 1), ("c", 1)], rows=1)
    assert send_batches(queue).calls == 3 and queue.held_asked == 1


def test_a_sender_out_of_its_time_budget_stops_after_the_call_in_hand_and_says_more_waits():
    queue = Queue(items=[("a", 10), ("b", 10), ("c", 10), ("d", 10)], rows=1)
    first = send_batches(queue, budget_seconds=0)  # one call always; then the budget is spent
    assert (queue.sent, first.skipped) == ([["a"]], "budget")
    rest = send_batches(queue, budget_seconds=60)
    assert (queue.sent[1:], rest.skipped, queue.items) == ([["b"], ["c"], ["d"]], "", [])


def test_a_failed_call_counts_an_attempt_on_its_items_and_stops_until_the_backoff_lets_it_go_again():
    queue = Queue(items=[("a", 1), ("b", 1), ("c", 1)], answers=[CallFailed("domain-02: connection refused")])
    outcome = send_batches(queue)
    assert (outcome.failed, outcome.dead, outcome.error) == (2, 0, "domain-02: connection refused")
    assert queue.attempts == {"a": 1, "b": 1} and queue.sent == []
    assert send_batches(queue).skipped == "held back"
    queue.held, queue.answers = False, [CallFailed("domain-02: no answer within 5 s")]
    outcome = send_batches(queue)
    assert (outcome.failed, outcome.dead) == (0, 2)
    assert queue.dead == {"a": "domain-02: no answer within 5 s", "b": "domain-02: no answer within 5 s"}
    queue.held = False
    assert send_batches(queue).sent == 1 and queue.items == []


def test_items_refused_before_any_call_are_given_up_with_their_reason_and_the_rest_go():
    queue = Queue(items=[("!x", 1), ("a", 1), ("!y", 1), ("!z", 1), ("b", 1)])
    outcome = send_batches(queue)
    assert queue.sent == [["a"], ["b"]] and outcome.refused == 3
    assert queue.dead == {"!x": "refused before any call", "!y": "refused before any call",
                          "!z": "refused before any call"}


def test_a_second_sender_of_the_same_key_finds_it_busy_and_sends_nothing():
    queue = Queue(items=[("a", 1)])
    with one_at_a_time("test:queue"):
        result: list = []
        thread = threading.Thread(target=lambda: result.append(send_batches(queue)))
        thread.start()
        thread.join(10)
    assert result[0].skipped == "busy" and queue.sent == []
    assert send_batches(queue).sent == 1


def test_a_sender_that_cannot_send_now_puts_its_batch_back_without_counting_an_attempt():
    queue = Queue(items=[("a", 1)], answers=[NotNow("its tenant's calls are at their cap")], lock_key=None)
    outcome = send_batches(queue, max_batches=1)
    assert (outcome.skipped, outcome.failed, queue.put_back_count, queue.attempts) == ("not now", 0, 1, {})
    assert queue.items == [("a", 1)]
