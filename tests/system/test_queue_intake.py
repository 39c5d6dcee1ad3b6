"""The queue intake with real workers: a send an app's backend puts on its stream reaches its
recipient, and the consumer group survives a worker killed with SIGKILL mid-batch with nothing lost
and nothing sent twice."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from apps_registry.models import ClientApp
from foundation.transport.queue_names import GROUP, acl_user_prefix, intake_key, queue_client
from foundation.transport.redis_clients import sync_client
from messaging.intake.stream.credentials import queue_credential_create
from messaging.intake.stream.models import QueueCredential
from messaging.intake.throttling import KEY
from messaging.models import Delivery, Message
from tests.messaging.intake.stream.conftest import writer_for
from tests.wsclient import WsClient

pytestmark = pytest.mark.system

# Entries left pending by a dead consumer are claimed after 2 s (30 s by default); small batches,
# so a kill lands between batches' commits and acknowledgements.
ENV = {"QUEUE_INTAKE_RECLAIM_SECONDS": "2", "QUEUE_INTAKE_BATCH": "100"}


@pytest.fixture(scope="module")
def anz_password(demo_network, django_db_blocker):
    """ANZ's queue credential, committed for the module (the workers read it). Its API rate limit is
    lifted meanwhile: these tests time the intake, not the limit (which queued sends draw on; the
    test of the limit sets its own)."""
    anz = ClientApp.objects.filter(pk=demo_network["anz"].pk)
    with django_db_blocker.unblock():
        limits = anz.values("api_rate_limit_per_second", "api_rate_limit_burst").get()
        anz.update(api_rate_limit_per_second=100_000, api_rate_limit_burst=100_000)
        _, password = queue_credential_create(app=demo_network["anz"])  # applied at once: autocommit
    yield password
    client = queue_client()
    with django_db_blocker.unblock():
        QueueCredential.objects.all().delete()
        anz.update(**limits)
    for user in client.execute_command("ACL", "USERS"):
        if user.decode().startswith(acl_user_prefix()):
            client.execute_command("ACL", "DELUSER", user)
    for key in client.scan_iter(match="sbq:*"):
        client.delete(key)


@pytest.mark.django_db
def test_a_send_put_on_the_stream_reaches_its_online_recipient(processes, anz_password):
    web = processes.web("web")
    processes.worker("worker", **ENV)
    with WsClient(web.ws_url) as bob:
        bob.auth("ANZ-70002")
        writer_for("ANZ", anz_password).xadd(intake_key("ANZ"), {"to": "ANZ-70002", "content": "from the queue",
                                                                 "reference": "order-1"})
        frame = bob.recv_type("MESSAGE", timeout=20)
    assert (frame["data"]["content"], frame["data"]["from"]) == ("from the queue", "ANZ-123223")


@pytest.mark.django_db
def test_the_consumer_group_survives_a_worker_killed_mid_batch(processes, anz_password):
    total = 3000
    admin = queue_client()
    writer = writer_for("ANZ", anz_password)
    pipe = writer.pipeline(transaction=False)
    for i in range(total):  # the backlog waits in the stream, not in any process
        pipe.xadd(intake_key("ANZ"), {"to": f"ANZ-{81000 + i % 40}", "content": f"backlog {i}"})
    pipe.execute()
    backlog = Message.objects.filter(content__startswith="backlog ")

    first = processes.worker("first", **ENV)
    deadline = time.monotonic() + 30

    def pending() -> int:
        try:
            return admin.xpending(intake_key("ANZ"), GROUP)["pending"]
        except redis.ResponseError:  # NOGROUP: the worker has not made its group yet
            return 0

    while True:  # until it is caught holding entries read and not acknowledged
        assert time.monotonic() < deadline, first.output()[-3000:]
        if pending() and backlog.exists():
            os.killpg(first.popen.pid, signal.SIGSTOP)  # frozen: what it holds now stays held (it may have just acked)
            time.sleep(0.05)  # (an XACK it wrote just before it froze may still be on its way to Redis)
            if pending():
                break
            os.killpg(first.popen.pid, signal.SIGCONT)
        time.sleep(0.005)
    first.kill()  # SIGKILL, with entries read and not acknowledged
    stored_at_kill, pending_at_kill = backlog.count(), admin.xpending(intake_key("ANZ"), GROUP)["pending"]
    assert stored_at_kill < total and pending_at_kill > 0

    second = processes.worker("second", **ENV)
    deadline = time.monotonic() + 60
    while backlog.count() < total or admin.xlen(intake_key("ANZ")) or admin.xpending(intake_key("ANZ"), GROUP)["pending"]:
        assert time.monotonic() < deadline, (backlog.count(), second.output()[-3000:])
        time.sleep(0.2)
    assert "claimed from consumers gone quiet" in second.output()
    assert backlog.count() == total  # nothing lost, nothing stored twice
    assert backlog.values("content").distinct().count() == total
    assert Delivery.objects.filter(message__in=backlog).count() == total  # one delivery each: routed once
    assert admin.xlen("sbq:ANZ:dead") == 0


@pytest.mark.django_db
def test_a_full_intake_refuses_its_writer_and_accepts_again_once_consumed(processes, anz_password):
    processes.worker("worker", **ENV, QUEUE_INTAKE_MAX_BYTES=str(256 * 1024))
    writer = writer_for("ANZ", anz_password)
    sent, deadline = 0, time.monotonic() + 20
    with pytest.raises(redis.exceptions.NoPermissionError):  # faster than one worker stores: the gate closes
        while time.monotonic() < deadline:
            pipe = writer.pipeline(transaction=False)
            for i in range(200):
                pipe.xadd(intake_key("ANZ"), {"to": f"ANZ-{82000 + i % 40}", "content": "full " + "x" * 1000})
            pipe.execute()
            sent += 200
    while time.monotonic() < deadline:  # and opens again once the worker has drained it
        try:
            writer.xadd(intake_key("ANZ"), {"to": "ANZ-82000", "content": "full again"})
            break
        except redis.exceptions.NoPermissionError:
            time.sleep(0.05)
    else:
        pytest.fail("the intake never accepted again")
    assert queue_client().hget("sbq:ANZ:stats", "closed_full") is not None  # counted for /metrics


@pytest.mark.django_db
def test_the_consumer_comes_back_after_a_redis_restart_with_the_users_reapplied(private_redis, processes, anz_password):
    env = {**ENV, "REDIS_URL": private_redis.url, "QUEUE_SYNC_SECONDS": "1"}
    worker = processes.worker("worker", **env)
    writer = redis.Redis.from_url(private_redis.url.replace("redis://", f"redis://sbq-ANZ:{anz_password}@"),
                                  retry=None, socket_timeout=5)  # that server's database 0: user sbq-ANZ
    deadline = time.monotonic() + 20
    while True:  # the worker applied the credential to its Redis at its start
        try:
            writer.xadd(intake_key("ANZ"), {"to": "ANZ-83001", "content": "before the restart"})
            break
        except redis.exceptions.AuthenticationError:
            assert time.monotonic() < deadline, worker.output()[-3000:]
            time.sleep(0.1)
    private_redis.kill()
    time.sleep(1)
    private_redis.start()  # append-only: the stream is back; the ACL users are not, until the consumer re-applies them
    deadline = time.monotonic() + 30
    while True:
        try:
            writer.xadd(intake_key("ANZ"), {"to": "ANZ-83001", "content": "after the restart"})
            break
        except (redis.exceptions.AuthenticationError, redis.exceptions.ConnectionError):
            assert time.monotonic() < deadline, worker.output()[-3000:]
            time.sleep(0.2)
    while Message.objects.filter(content__endswith="the restart").count() < 2:
        assert time.monotonic() < deadline, worker.output()[-3000:]
        time.sleep(0.2)
    assert "queue intake consumer" in worker.output() and "starting again" in worker.output()


def _peak_rss_kib(proc) -> int:
    """The most memory the process has held (its high-water mark, VmHWM)."""
    for line in open(f"/proc/{proc.popen.pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.django_db
def test_a_64_mb_entry_is_dead_lettered_without_being_read_and_the_entries_after_it_flow(processes, anz_password):
    worker = processes.worker("worker", **ENV)
    writer = writer_for("ANZ", anz_password)
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-84000", "content": "warm"})
    deadline = time.monotonic() + 20
    while not Message.objects.filter(content="warm").exists():
        assert time.monotonic() < deadline, worker.output()[-3000:]
        time.sleep(0.05)
    before = _peak_rss_kib(worker)
    huge = writer.xadd(intake_key("ANZ"), {"to": "ANZ-84000", "content": "x" * (64 * 1024 * 1024)})
    # Behind it in the stream (written by Switchboard's own user: the gate may close its writer at once).
    queue_client().xadd(intake_key("ANZ"), {"to": "ANZ-84000", "content": "after the huge one"})
    deadline = time.monotonic() + 30
    # Stored, then acknowledged with the dead letter (nothing left pending for another worker to reclaim).
    while not Message.objects.filter(content="after the huge one").exists() or \
            queue_client().xpending(intake_key("ANZ"), GROUP)["pending"]:
        assert time.monotonic() < deadline, worker.output()[-3000:]
        time.sleep(0.05)
    assert _peak_rss_kib(worker) - before < 32 * 1024  # it held 260 MB more when it read the entry whole
    [(_, dead)] = queue_client().xrange("sbq:ANZ:dead")
    assert dead[b"entry"] == huge and dead[b"reason"].startswith(b"request_too_large: ")
    assert queue_client().memory_usage("sbq:ANZ:dead", samples=0) < 16 * 1024
    assert worker.alive()


@pytest.fixture
def anz_limited(demo_network, anz_password, django_db_blocker):
    """ANZ's API rate limit set to 50 requests a second, a burst of 10, committed for the workers."""
    anz = ClientApp.objects.filter(pk=demo_network["anz"].pk)
    with django_db_blocker.unblock():
        limits = anz.values("api_rate_limit_per_second", "api_rate_limit_burst").get()
        anz.update(api_rate_limit_per_second=50, api_rate_limit_burst=10)
    yield
    with django_db_blocker.unblock():
        anz.update(**limits)
    sync_client().delete(KEY.format(app_pk=demo_network["anz"].pk))


def test_a_backlog_is_sent_at_the_apps_rate_limit_with_nothing_lost_or_dead(processes, anz_password, anz_limited,
                                                                             django_db_blocker):
    total = 150
    dead_before = queue_client().xlen("sbq:ANZ:dead")
    worker = processes.worker("worker", **ENV)
    pipe = writer_for("ANZ", anz_password).pipeline(transaction=False)
    for i in range(total):
        pipe.xadd(intake_key("ANZ"), {"to": f"ANZ-{85000 + i % 20}", "content": f"limited {i}"})
    began = time.monotonic()
    pipe.execute()
    deadline = began + 30
    with django_db_blocker.unblock():  # no test transaction: the limit above is committed, for the worker
        sent = Message.objects.filter(content__startswith="limited ")
        while sent.count() < total:
            assert time.monotonic() < deadline, (sent.count(), worker.output()[-3000:])
            time.sleep(0.1)
        took = time.monotonic() - began
        assert sent.values("content").distinct().count() == total  # each once
    assert took >= (total - 10) / 50 * 0.9  # its burst at once, then 50 a second: 2.8 s (a tenth for the clocks)
    assert queue_client().xlen("sbq:ANZ:dead") == dead_before
