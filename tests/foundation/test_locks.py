"""Every "one at a time" (foundation.locks): the Postgres advisory lock, which cannot outlive its
work, and the Redis lease, which a holder that dies gives up after its ttl."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from foundation.locks import LEASE_KEY, lease, lock_held_elsewhere, one_at_a_time
from foundation.transport.redis_clients import sync_client

pytestmark = pytest.mark.django_db


def taken_elsewhere(key: str) -> bool:
    """Whether another session could take `key` now (asked from a session of its own)."""
    result: list[bool] = []

    def ask() -> None:
        with one_at_a_time(key) as held:
            result.append(held)

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join(10)
    return not result[0]


# --- the advisory lock ---------------------------------------------------------------------------------------


def test_a_key_has_one_holder_at_a_time_and_is_free_once_the_work_ends():
    with one_at_a_time("test:link:domain-02") as held:
        assert held
        assert taken_elsewhere("test:link:domain-02")
        assert lock_held_elsewhere("test:link:domain-02")
        assert not taken_elsewhere("test:link:domain-04")  # another key is another sender
    assert not taken_elsewhere("test:link:domain-02")
    assert not lock_held_elsewhere("test:link:domain-02")


def test_the_lock_is_released_when_the_work_fails():
    with pytest.raises(RuntimeError), one_at_a_time("test:failing") as held:
        assert held
        raise RuntimeError("the neighbour's answer made no sense")
    assert not taken_elsewhere("test:failing")


@pytest.mark.django_db(transaction=True)  # a test transaction would not let the work's connection go
def test_the_lock_is_transaction_scoped_so_no_session_keeps_it_after_the_work():
    """Behind a pooler in transaction mode a session-level lock could stay on a pooled server
    session after its work: this one is a transaction's, which a pooler never splits and which
    ends with the block, whatever becomes of the connection the work itself used."""
    from foundation import locks

    keys = ["test:pooled", "test:pooled-2", "link:domain-02", "flood:domain-04"]  # hashes of either sign
    for key in keys:
        with one_at_a_time(key) as held:
            assert held and lock_held_elsewhere(key)
            with connection.cursor() as cur:  # held by a session inside a transaction, never by a session alone
                cur.execute("SELECT a.state, a.xact_start IS NOT NULL FROM pg_locks l JOIN pg_stat_activity a"
                            " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.pid = %s",
                            [locks._locks.conn.info.backend_pid])
                assert cur.fetchall() == [("idle in transaction", True)]
            # The work's own connection is handed back and another taken (what a pooler does between
            # transactions): the lock is unaffected, and still ends with the block.
            connection.close()
            connections.create_connection("default").close()
        assert not lock_held_elsewhere(key)


def test_a_lock_connection_that_broke_frees_the_lock_and_the_next_take_reconnects():
    from foundation import locks

    with one_at_a_time("test:broken") as held:
        assert held
        locks._locks.conn.close()  # the server session is gone (a restart, a pooler reset)
        assert not taken_elsewhere("test:broken")
    with one_at_a_time("test:broken") as held:
        assert held


def test_locks_do_not_nest_within_a_thread():
    with one_at_a_time("test:outer"), pytest.raises(RuntimeError), one_at_a_time("test:inner"):
        pass


# --- the lease --------------------------------------------------------------------------------------


def test_a_lease_has_one_holder_at_a_time_and_is_free_once_the_work_ends():
    sync_client().delete(LEASE_KEY.format(name="test-reaper"))
    with lease("test-reaper", ttl=60) as held:
        assert held
        with lease("test-reaper", ttl=60) as again:
            assert not again  # another worker's beat tick goes away
        with lease("test-other", ttl=60) as other:
            assert other
    with lease("test-reaper", ttl=60) as held:
        assert held


def test_a_lease_whose_holder_died_is_free_after_its_ttl(redis_client):
    redis_client.set(LEASE_KEY.format(name="test-dead"), b"a dead worker's token", px=300)  # its ttl, nearly over
    with lease("test-dead", ttl=60) as held:
        assert not held
    time.sleep(0.4)
    with lease("test-dead", ttl=60) as held:
        assert held


def test_a_lease_that_expired_under_a_slow_run_is_not_taken_from_the_next_holder(redis_client, caplog):
    key = LEASE_KEY.format(name="test-slow")
    redis_client.delete(key)
    with lease("test-slow", ttl=60) as held:
        assert held
        redis_client.set(key, b"the next holder's token")  # ours expired; another worker took it
    assert redis_client.get(key) == b"the next holder's token"
    assert "lease test-slow had expired before its release" in caplog.text
