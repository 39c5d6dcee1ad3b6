"""The domain network end to end on the four-domain ring of `make network` (tests/ring.py): four
domains that answer, each whole from the start, that admit a user only at its home, and one of which
stops and starts alone; messages, confirmations and channel publishes forwarded hop by hop on
shortest paths, around a disabled link, waiting for a stopped domain, a user sent to its home, and
forged internal calls refused. (One module: the ring starts once for all of them.)

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      ANZ users: 0-999999 on 01, 1000000-2999999 on 02,
                                3000000-5999999 on 03, 6000000+ on 04
    (and the diagonals 01-03, 02-04: liveness-only links, no message takes them)
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from psycopg.types.json import Jsonb

from foundation.signed_calls import signed_headers
from tests.link_fault import LinkFault
from tests.ring import RING_ENV, RingRefused
from tests.webhook_receiver import WebhookReceiver
from tests.wsclient import WsClient

pytestmark = pytest.mark.system

DOMAINS = ["domain-01", "domain-02", "domain-03", "domain-04"]
LINKS = ["domain-01 — domain-02", "domain-02 — domain-03", "domain-03 — domain-04", "domain-01 — domain-04",
         "domain-01 — domain-03", "domain-02 — domain-04"]  # (the last two: the diagonals, liveness only)


def _admin_lists(ring, n: int) -> tuple[list[str], list[str]]:
    """The domains and the links domain n's admin lists."""
    with ring.admin(n) as admin:
        domains = admin.get("/admin/apps_registry/domain/").text
        links = admin.get("/admin/apps_registry/domainlink/").text
    return [d for d in DOMAINS if f">{d}<" in domains], [link for link in LINKS if link in links]


def test_every_domain_is_ready_and_its_admin_lists_the_four_domains_and_the_six_links(ring):
    print(f"the ring started in {ring.start_seconds:.1f}s")
    for n in ring.domains():
        assert ring.ready(n), f"domain-0{n} is not ready"
        assert _admin_lists(ring, n) == (DOMAINS, LINKS)


def test_a_user_is_admitted_at_home_and_refused_elsewhere_with_its_home_named(ring):
    with ring.client(3, "ANZ-3123456") as carol:
        assert carol.frames[-1]["data"]["isAuthenticated"] is True
    with pytest.raises(RingRefused) as refused:
        ring.client(1, "ANZ-3123456")
    assert "domain-03" in refused.value.reason


def test_a_stopped_domain_leaves_the_others_serving_and_comes_back_with_the_same_configuration(ring):
    ring.stop_domain(2)
    try:
        assert [n for n in ring.domains() if ring.ready(n)] == [1, 3, 4]
        with ring.client(3, "ANZ-3000001"), ring.client(4, "ANZ-6000001"), ring.client(1, "ANZ-1"):
            pass
    finally:
        ring.start_domain(2)
    assert ring.ready(2)
    assert _admin_lists(ring, 2) == (DOMAINS, LINKS)
    assert ring.query(2, "select count(*) from apps_registry_userdistribution") == [(4,)]
    with ring.client(2, "ANZ-1500000"):
        pass
    _links_up_everywhere(ring)


def test_a_domain_back_after_a_long_absence_says_it_is_ready_only_once_it_admits_its_users(ring):
    """Away longer than its fence (or fresh from `make network`), a domain is cut off until the first
    gossip reaches it and refuses its users with a standby meanwhile: the moment its /readyz answers
    200, such a user is admitted there (it used to answer 200 a gossip round before)."""
    ring.stop_domain(3)
    # As if it had been away an hour: nothing it heard is recent enough to keep it in the network.
    ring.query(3, "update messaging_domainheard set heard_at = now() - interval '1 hour'")
    starting = threading.Thread(target=ring.start_domain, args=(3,))
    starting.start()
    try:
        assert _eventually(lambda: ring.ready(3), 60, every=0.05), "domain-03 never said it was ready"
        with ring.client(3, "ANZ-3000041") as carol:  # (RingRefused: "cut off from the network")
            assert carol.frames[-1]["data"]["isAuthenticated"] is True
    finally:
        starting.join()
    _links_up_everywhere(ring)


FORWARD_PATH = "/internal/v1/forward"


def _copy_path(ring, n: int, content: str) -> str | None:
    """The forward path of domain n's copy of the message with `content` (None: no copy there)."""
    rows = ring.query(n, "select forward_path from messaging_message where content = %s", (content,))
    return rows[0][0] if rows else None


def _links_up_everywhere(ring) -> None:
    """Every domain has seen each of its links answer again since one was stopped (probes run every
    second), and its processes' link state (cached for a second) has read it: the next message takes
    a shortest path, not the detour of the outage."""
    assert _eventually(lambda: all(ring.query(n, "select count(*) from messaging_linkhealth where not up") == [(0,)]
                                   for n in ring.domains()), 30)
    time.sleep(1.5)


def _eventually(check, timeout: float = 30.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def _frames_from(client: WsClient, sender: str, count: int, timeout: float = 30) -> list[dict]:
    got = client.collect_frames(
        lambda frames: sum(f["type"] == "MESSAGE" and f["data"].get("from") == sender for f in frames) >= count,
        timeout)
    return [f for f in got if f["type"] == "MESSAGE" and f["data"].get("from") == sender]


def _messages_from(client: WsClient, sender: str, count: int, timeout: float = 30) -> list[str]:
    return [f["data"]["content"] for f in _frames_from(client, sender, count, timeout)]


def _set_link(ring, a: str, b: str, *, enabled: bool) -> None:
    """Switch a link on the meta domain (domain-01) and wait until every running domain has pulled it."""
    statement = """update apps_registry_domainlink l set enabled = %s
                     from apps_registry_domain d1, apps_registry_domain d2
                    where l.n1_id = d1.id and l.n2_id = d2.id
                      and ((d1.name = %s and d2.name = %s) or (d1.name = %s and d2.name = %s))"""
    ring.query(1, statement, (enabled, a, b, b, a))
    check = """select l.enabled from apps_registry_domainlink l join apps_registry_domain d1 on l.n1_id = d1.id
                 join apps_registry_domain d2 on l.n2_id = d2.id
                where (d1.name = %s and d2.name = %s) or (d1.name = %s and d2.name = %s)"""
    for n in ring.domains():
        if ring.running(n):
            assert _eventually(lambda n=n: ring.query(n, check, (a, b, b, a)) == [(enabled,)], 30), \
                f"domain-0{n} did not pull the link {a} - {b} enabled={enabled}"
    time.sleep(1.5)  # every process's graph cache (1 s) has read it


def test_a_message_to_a_user_two_domains_away_arrives_on_a_shortest_path_and_the_sender_gets_its_confirmation(ring):
    with ring.client(1, "ANZ-1") as alice, ring.client(3, "ANZ-3000001") as carol:
        alice.message("ANZ-3000001", "over two hops", reference="r-two-hops")
        assert _messages_from(carol, "ANZ-1", 1) == ["over two hops"]
        confirmation = alice.recv_type("MESSAGE_CONFIRMATION", timeout=30)
        assert confirmation["data"]["reference"] == "r-two-hops"
    # Two shortest paths of two hops; ties go by name: through domain-02, not domain-04.
    assert _copy_path(ring, 2, "over two hops") == "domain-01"
    assert _copy_path(ring, 3, "over two hops") == "domain-01,domain-02"
    assert _copy_path(ring, 4, "over two hops") is None
    # The sender's domain shows where it went and that it was delivered there.
    assert _eventually(lambda: ring.query(1, "select state, forward_to from messaging_delivery d join messaging_message m"
                                             " on d.message_id = m.id where m.content = %s", ("over two hops",))
                       == [("delivered", "domain-02")])


def test_a_users_mailbox_is_copied_live_to_its_standby_domain_with_each_state_change(ring):
    # make network's ring: domain-03's users stand by on domain-04 (the triggers, the beat, the
    # forwarding worker and every connection's switchboard.domain, in real processes).
    started = time.monotonic()
    with ring.client(1, "ANZ-1") as alice, ring.client(3, "ANZ-3000002") as carol:
        for i in range(3):
            alice.message("ANZ-3000002", f"copied live {i}")
        assert _messages_from(carol, "ANZ-1", 3) == [f"copied live {i}" for i in range(3)]
    home_sql = ("select d.seq, m.content, d.state from messaging_delivery d join messaging_message m"
                " on m.id = d.message_id where d.recipient = 'ANZ-3000002' order by d.seq")
    assert _eventually(lambda: [state for *_, state in ring.query(3, home_sql)] == ["delivered"] * 3, 15)
    home = ring.query(3, home_sql)
    copied = "select seq, content, state from messaging_standbycopy where recipient = 'ANZ-3000002' order by seq"
    assert _eventually(lambda: ring.query(4, copied) == home, 15), ring.query(4, copied)
    print(f"copied with its state in {time.monotonic() - started:.1f} s")
    # Only the user's standby holds a copy (domain-02 stands by for domain-01's users, not for 03's).
    assert ring.query(2, "select count(*) from messaging_standbycopy where recipient = 'ANZ-3000002'") == [(0,)]
    assert _eventually(lambda: ring.query(3, "select count(*) from messaging_standbyfeed") == [(0,)], 15)


def test_a_fast_message_reaches_a_user_connected_two_domains_away_and_is_stored_nowhere(ring):
    with ring.client(1, "ANZ-1") as alice, ring.client(3, "ANZ-3000001") as carol:
        alice.message("ANZ-3000001", "fast over two hops", feature="FAST")
        frame = carol.recv_until(lambda f: f["type"] == "MESSAGE" and f["data"].get("from") == "ANZ-1", timeout=30)
        assert frame["data"]["content"] == "fast over two hops"
    for n in ring.domains():
        assert ring.query(n, "select count(*) from messaging_message where content = 'fast over two hops'") == [(0,)]


def test_with_the_link_01_02_disabled_a_message_to_domain_02_goes_round_through_04_and_03(ring):
    _set_link(ring, "domain-01", "domain-02", enabled=False)
    try:
        with ring.client(1, "ANZ-2") as alice, ring.client(2, "ANZ-1000002") as bob:
            alice.message("ANZ-1000002", "the long way round", reference="r-round")
            assert _messages_from(bob, "ANZ-2", 1) == ["the long way round"]
            assert alice.recv_type("MESSAGE_CONFIRMATION", timeout=30)["data"]["reference"] == "r-round"
        assert _copy_path(ring, 4, "the long way round") == "domain-01"
        assert _copy_path(ring, 3, "the long way round") == "domain-01,domain-04"
        assert _copy_path(ring, 2, "the long way round") == "domain-01,domain-04,domain-03"
    finally:
        _set_link(ring, "domain-01", "domain-02", enabled=True)


def _set_urls(ring, name: str, urls: list[str]) -> None:
    """Set a domain's URLs on the meta domain (domain-01) and wait until every running domain has them."""
    ring.query(1, "update apps_registry_domain set urls = %s where name = %s", (Jsonb(urls), name))
    for n in ring.domains():
        if ring.running(n):
            assert _eventually(lambda n=n: ring.query(n, "select urls from apps_registry_domain where name = %s",
                                                      (name,)) == [(urls,)], 30), f"domain-0{n} did not pull {urls}"
    time.sleep(1.5)  # every process's cached view of the domains has read it


def _link_down_at(ring, n: int, peer: str) -> bool:
    """Domain n has seen its link to `peer` fail for longer than LINK_DOWN_AFTER_SECONDS (3 s here)."""
    return ring.query(n, "select count(*) from messaging_linkhealth where peer = %s and not up"
                         " and down_since < now() - interval '4 seconds'", (peer,)) == [(1,)]


def test_with_the_link_02_03_failing_messages_from_01_to_03_go_round_through_04_in_order(ring):
    original = ring.query(1, "select urls from apps_registry_domain where name = 'domain-03'")[0][0]
    with LinkFault(upstream_port=ring.plan(3).port) as fault:
        _set_urls(ring, "domain-03", [fault.url, *original])  # domain-03's calls go through the fault
        try:
            fault.drop_from("domain-02")  # 02 -> 03 fails; 01 -> 02 and 04 -> 03 work
            assert _eventually(lambda: _link_down_at(ring, 2, "domain-03"), 30)
            assert not _link_down_at(ring, 1, "domain-02")  # domain-01 does not see the fault itself
            contents = [f"around the broken link {i}" for i in range(5)]
            with ring.client(1, "ANZ-8") as alice, ring.client(3, "ANZ-3000008") as carol:
                for i, content in enumerate(contents):
                    alice.message("ANZ-3000008", content, reference=f"r-around-{i}")
                assert _messages_from(carol, "ANZ-8", 5) == contents  # all of them, in order
            assert {_copy_path(ring, 3, c) for c in contents} == {"domain-01,domain-04"}
            assert fault.dropped > 0
            dead = ring.query(1, "select count(*) from messaging_delivery where state = 'dead'"
                                 " and recipient = 'ANZ-3000008'")
            assert dead == [(0,)]
        finally:
            fault.heal()
            _set_urls(ring, "domain-03", original)


def test_the_master_on_domain_01_is_told_who_connects_and_leaves_on_domain_03_and_lists_them_when_it_connects(ring):
    with ring.client(1, "ANZ-123223") as master:  # ANZ's master user, homed on domain-01
        snapshot = master.recv_type("ONLINE_USERS", timeout=10)
        assert "ANZ-3000021" not in snapshot["data"]["users"]
        with ring.client(3, "ANZ-3000021"):
            arrived = master.recv_until(lambda f: f["type"] == "USER_CONNECTED"
                                        and f["data"]["userId"] == "ANZ-3000021", timeout=20)
            assert arrived["data"] == {"userId": "ANZ-3000021"}
            with ring.client(1, "ANZ-123223") as second:  # a master connecting now lists them
                assert "ANZ-3000021" in second.recv_type("ONLINE_USERS", timeout=10)["data"]["users"]
        master.recv_until(lambda f: f["type"] == "USER_DISCONNECTED" and f["data"]["userId"] == "ANZ-3000021",
                          timeout=20)


BACKLOG, BIG = 60, 60 * 1024  # the outage: 60 messages of 60 KiB (3.6 MB) for a stopped domain


def _big(i: int) -> str:
    head = f"while away {i} "
    return head + "x" * (BIG - len(head))


def test_a_backlog_of_large_messages_for_a_stopped_domain_waits_and_arrives_whole_in_order_when_it_returns(ring):
    ring.stop_domain(2)
    try:
        with ring.client(1, "ANZ-3") as alice:
            for i in range(BACKLOG):
                alice.message("ANZ-1000003", _big(i), clientMessageId=f"away-{i}")
            # Stored and waiting on the sender's side, none lost.
            assert _eventually(lambda: ring.query(
                1, "select count(*) from messaging_delivery where recipient = 'ANZ-1000003'"
                   " and state in ('pending', 'sent', 'retrying', 'forwarding', 'forwarded')") == [(BACKLOG,)], 30)
            time.sleep(5)  # longer than LINK_DOWN_AFTER_SECONDS: the ring routes around, domain-03 waits too
    finally:
        ring.start_domain(2)
    with ring.client(2, "ANZ-1000003") as bob:
        wanted = [_big(i) for i in range(BACKLOG)]
        deadline = time.monotonic() + 90
        frames: list[dict] = []
        while len(frames) < BACKLOG and time.monotonic() < deadline:
            batch, _left = bob.fetch(10)  # 600 KB a reply: within a client's 1 MiB frame
            frames += batch + [f for f in bob.recv_all(quiet=1) if f["type"] == "MESSAGE"]
        time.sleep(2)
        frames += [f for f in bob.recv_all(quiet=1) if f["type"] == "MESSAGE"]
        # Fetched and pushed frames may cross on the wire; the mailbox order is each message's seq.
        got = [f["data"]["content"] for f in sorted(frames, key=lambda f: f["data"]["seq"])]
        assert [c[:20] for c in got] == [c[:20] for c in wanted] and got == wanted  # all, whole, once, in order
    assert ring.query(2, "select count(*) from messaging_delivery where recipient = 'ANZ-1000003'") == [(BACKLOG,)]
    assert ring.query(1, "select count(*) from messaging_delivery where recipient = 'ANZ-1000003'"
                         " and state = 'dead'") == [(0,)]
    _links_up_everywhere(ring)


def _anz_attempts_everywhere(ring, attempts: int) -> None:
    """ANZ's maximum delivery attempts set on the meta (domain-01), and pulled by every domain."""
    ring.query(1, "update apps_registry_clientapp set max_delivery_attempts = %s where app_name = 'ANZ'", (attempts,))
    statement = "select max_delivery_attempts from apps_registry_clientapp where app_name = 'ANZ'"
    assert _eventually(lambda: all(ring.query(n, statement) == [(attempts,)] for n in (1, 2, 3, 4)), 30)


def test_a_message_that_died_at_its_home_domain_re_queued_at_the_origin_is_tried_there_again_and_arrives(ring):
    far, content = "ANZ-3000011", "a second chance"
    (usual,), = ring.query(1, "select max_delivery_attempts from apps_registry_clientapp where app_name = 'ANZ'")
    _anz_attempts_everywhere(ring, 2)
    try:
        with ring.client(3, far, acks=True) as careless, ring.client(1, "ANZ-11") as alice:
            alice.message(far, content)
            assert _messages_from(careless, "ANZ-11", 1) == [content]  # pushed, never acknowledged
            # Not acknowledged within DELIVERY_ACK_TIMEOUT, twice: dead at domain-03, and its receipt
            # makes the origin's record dead too (the operator looks at the origin).
            dead = _eventually(lambda: ring.query(
                1, "select d.id, d.last_error from messaging_delivery d join messaging_message m on m.id = d.message_id"
                   " where m.content = %s and d.state = 'dead'", (content,)), 60)
            assert dead and "domain-03" in dead[0][1], dead
    finally:
        _anz_attempts_everywhere(ring, usual)
    answer = httpx.post(f"{ring.http_url(1)}/api/v1/dead-letters/requeue", json={"ids": [dead[0][0]]},
                        headers={"Authorization": f"Bearer {ring.api_key(1)}"}, timeout=10)
    assert answer.json() == {"requeued": 1}, answer.text
    # Sent on from the origin with `revive`: the copy that died at domain-03 is back in the mailbox,
    # with fresh attempts, waiting for its recipient.
    at_home = "select d.state, d.attempts from messaging_delivery d join messaging_message m on m.id = d.message_id" \
              " where m.content = %s"
    assert _eventually(lambda: ring.query(3, at_home, (content,)) == [("pending", 0)], 30), [
        ring.query(n, "select d.state, d.attempts, d.forward_to, d.last_error, m.forward_path from messaging_delivery d"
                      " join messaging_message m on m.id = d.message_id where m.content = %s", (content,))
        for n in (1, 2, 3, 4)]
    with ring.client(3, far) as back:
        frames = back.fetch(10)[0] + back.recv_all(quiet=2)
        assert [f["data"]["content"] for f in frames if f["type"] == "MESSAGE"] == [content]  # once
    assert _eventually(lambda: ring.query(
        1, "select d.state from messaging_delivery d join messaging_message m on m.id = d.message_id"
           " where m.content = %s", (content,)) == [("delivered",)], 30)
    assert ring.query(3, "select count(*) from messaging_delivery d join messaging_message m on m.id = d.message_id"
                         " where m.content = %s", (content,)) == [(1,)]


def test_a_subscribe_sent_to_a_domain_that_is_not_the_users_home_is_refused_naming_the_home(ring):
    key_01, key_03 = ring.api_key(1), ring.api_key(3)
    path = "/api/v1/channels/news.ring/subscribers/ANZ-3000031"
    wrong = httpx.put(f"{ring.http_url(1)}{path}", headers={"Authorization": f"Bearer {key_01}"}, timeout=10)
    assert wrong.status_code == 421, wrong.text
    assert wrong.json()["error"] == "homed_elsewhere" and wrong.json()["domain"] == "domain-03"
    right = httpx.put(f"{ring.http_url(3)}{path}", headers={"Authorization": f"Bearer {key_03}"}, timeout=10)
    assert right.status_code in (200, 201), right.text
    assert ring.query(3, "select count(*) from messaging_subscription where subscriber = 'ANZ-3000031'") == [(1,)]
    assert ring.query(1, "select count(*) from messaging_subscription where subscriber = 'ANZ-3000031'") == [(0,)]


def test_rest_presence_at_domain_01_answers_for_a_user_connected_at_domain_03(ring):
    key = ring.api_key(1)

    def online() -> bool | None:
        answer = httpx.get(f"{ring.http_url(1)}/api/v1/users/ANZ-3000032/presence",
                           headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
        assert answer["domain"] == "domain-03"
        return answer["online"]

    with ring.client(3, "ANZ-3000032"):
        assert _eventually(lambda: online() is True, 20)
    assert _eventually(lambda: online() is False, 20)


def test_a_request_of_a_user_homed_at_domain_03_is_told_by_domain_03_answered_there_and_its_outcome_reaches_the_user(
        ring):
    """The endpoint is made on the meta domain (01); every domain mirrors it with the same webhook
    secret. A user of 03 asks: 03 calls the app's server, naming itself and where to answer; the
    answer made there (its REST API) reaches the user as RESOLVE; the same answer at 01, which never
    heard of the request, is told so."""
    with WebhookReceiver(status=202) as server:
        ring.manage(1, "shell", "-c", "from apps_registry.models import ClientApp, RequestEndpoint; "
                    "RequestEndpoint.objects.create(app=ClientApp.objects.get(app_name='ANZ'), name='ring.quote', "
                    f"webhook_url='{server.url}')")
        try:
            [(secret,)] = ring.query(1, "SELECT webhook_secret FROM apps_registry_requestendpoint "
                                        "WHERE name = 'ring.quote'")
            mirrored = "SELECT webhook_secret FROM apps_registry_requestendpoint WHERE name = 'ring.quote'"
            assert _eventually(lambda: ring.query(3, mirrored) == [(secret,)], 30), "domain-03 never mirrored it"
            with ring.client(3, "ANZ-3000041") as carol:
                assert _eventually(lambda: _requested(carol, server), 20), "domain-03 took no request"
                [call] = server.calls
                data = call.json["data"]
                assert call.event == "request.received" and call.signed_with(secret)
                assert (data["domain"], data["from"], data["endpoint"]) == ("domain-03", "ANZ-3000041", "ring.quote")
                assert data["answerUrl"] == f"{ring.http_url(3)}/api/v1/requests/{data['requestId']}"
                elsewhere = httpx.post(f"{ring.http_url(1)}/api/v1/requests/{data['requestId']}/resolve",
                                       json={"content": "from 01"}, timeout=10,
                                       headers={"Authorization": f"Bearer {ring.api_key(1)}"})
                assert elsewhere.status_code == 404
                answered = httpx.post(f"{data['answerUrl']}/resolve", json={"content": "42 EUR"}, timeout=10,
                                      headers={"Authorization": f"Bearer {ring.api_key(3)}"})
                assert answered.status_code == 200, answered.text
                outcome = carol.recv_type("RESOLVE", timeout=20)["data"]
                assert (outcome["requestId"], outcome["clientMessageId"], outcome["content"]) == (
                    data["requestId"], "quote-1", "42 EUR")
        finally:
            ring.manage(1, "shell", "-c", "from apps_registry.models import RequestEndpoint; "
                        "RequestEndpoint.objects.filter(name='ring.quote').delete()")


def _requested(client: WsClient, server: WebhookReceiver) -> bool:
    """Send the request once the user's domain knows the endpoint (until then: unknown_endpoint)."""
    client.send("REQUEST", {"endpoint": "ring.quote", "content": "a quote, please", "clientMessageId": "quote-1"})
    answer = client.recv_until(lambda f: f["type"] in ("REQUEST_ACCEPTED", "INVALID_MESSAGE"))
    if answer["type"] == "INVALID_MESSAGE":
        assert answer["data"].get("code") == "unknown_endpoint", answer
        return False
    return _eventually(lambda: len(server.calls) == 1, 20)


def test_a_link_secret_rotated_under_load_fails_no_call_and_loses_nothing(ring):
    started = ring.query(1, "select now()")[0][0]
    contents = [f"through the rotation {i}" for i in range(40)]
    with ring.client(1, "ANZ-41") as alice, ring.client(2, "ANZ-1000041") as bob:
        for i, content in enumerate(contents):
            alice.message("ANZ-1000041", content)
            if i == 10:  # the operator rotates the 01 - 02 secret on the meta domain, as its admin would
                ring.manage(1, "shell", "-c", ROTATE)
            time.sleep(0.2)  # 8 s in all: every domain pulls the new secret (every 2 s) meanwhile
        # All of them, once, in the sender's order in bob's mailbox (seq). Live frames are pushed by
        # routing tasks that run in parallel and may cross on the wire (docs/protocol.md).
        got = _frames_from(bob, "ANZ-41", len(contents))
        assert [f["data"]["content"] for f in sorted(got, key=lambda f: f["data"]["seq"])] == contents
    for n in ring.domains():
        failed = ring.query(n, "select peer, last_error from messaging_linkhealth where last_failure_at > %s",
                            (started,))
        assert failed == [], f"domain-0{n}: {failed}"
    secrets_now = {ring.query(n, LINK_SECRET, ("domain-01", "domain-02"))[0][0] for n in ring.domains()}
    assert len(secrets_now) == 1  # every domain has the new one


ROTATE = """
from apps_registry.models import DomainLink, new_link_secret
link = DomainLink.objects.get(n1__name="domain-01", n2__name="domain-02")
link.shared_secret = new_link_secret()
link.save()
"""
LINK_SECRET = """select l.shared_secret from apps_registry_domainlink l join apps_registry_domain a on l.n1_id = a.id
                 join apps_registry_domain b on l.n2_id = b.id where a.name = %s and b.name = %s"""


def _receipts_out(ring) -> dict[tuple[int, str], int]:
    """What each running domain has sent on each link so far (its link health's forwarded_out)."""
    return {(n, peer): out for n in ring.domains() if ring.running(n)
            for peer, out in ring.query(n, "select peer, forwarded_out from messaging_linkhealth")}


def test_with_the_origin_stopped_its_receipts_wait_and_the_links_between_the_others_stay_still(ring):
    with ring.client(3, "ANZ-3000001") as carol:
        for i in range(5):
            carol.message("ANZ-5", f"before the outage {i}")
    assert _eventually(lambda: ring.query(1, "select count(*) from messaging_delivery where recipient = 'ANZ-5'"
                                              " and state = 'pending'") == [(5,)], 30)
    ring.stop_domain(3)
    try:
        time.sleep(4)  # past LINK_DOWN_AFTER_SECONDS (3): domain-02 and domain-04 see domain-03 down
        with ring.client(1, "ANZ-5") as alice:
            fetched, _left = alice.fetch(10)
            assert [f["data"]["content"] for f in fetched] == [f"before the outage {i}" for i in range(5)]
        waiting = "select count(*) from messaging_receiptforward"
        assert _eventually(lambda: sum(ring.query(n, waiting)[0][0] for n in (1, 2, 4)) == 5
                           and ring.query(1, waiting) == [(0,)], 20)  # left domain-01, waiting further on
        before = _receipts_out(ring)
        time.sleep(5)  # nothing is sent meanwhile: nothing may move
        assert _receipts_out(ring) == before
        assert sum(ring.query(n, waiting)[0][0] for n in (1, 2, 4)) == 5
    finally:
        ring.start_domain(3)
    delivered = "select count(*) from messaging_delivery where recipient = 'ANZ-5' and state = 'delivered'"
    assert _eventually(lambda: ring.query(3, delivered) == [(5,)], 60)  # the receipts arrive at the origin


def test_a_channel_publish_on_domain_01_reaches_subscribers_on_all_four_domains_and_a_resume_gets_exactly_what_it_missed(ring):
    users = {1: "ANZ-11", 2: "ANZ-1000011", 3: "ANZ-3000011", 4: "ANZ-6000011"}
    readers = {n: ring.client(n, user) for n, user in users.items()}
    try:
        for reader in readers.values():
            reader.send("SUBSCRIBE", {"channel": "news.ring"})
            reader.recv_type("SUBSCRIBED")
        for i in range(3):
            ring.publish(1, "news.ring", f"bulletin {i}")
        for n, reader in readers.items():
            frames = reader.collect_frames(lambda fs: sum(f["type"] == "CHANNEL_MESSAGE" for f in fs) >= 3, 30)
            assert [f["data"]["content"] for f in frames if f["type"] == "CHANNEL_MESSAGE"] == \
                   [f"bulletin {i}" for i in range(3)], f"domain-0{n}"
        last_seen = [f for f in readers[3].frames if f["type"] == "CHANNEL_MESSAGE"][-1]["data"]["offset"]
        readers.pop(3).close()
        for i in range(3, 5):
            ring.publish(1, "news.ring", f"bulletin {i}")
        assert _eventually(lambda: ring.query(3, "select count(*) from messaging_channelmessage where content like 'bulletin %%'")
                           == [(5,)])
        with ring.client(3, users[3]) as back:
            back.send("SUBSCRIBE", {"channel": "news.ring", "since": last_seen})
            frames = back.collect_frames(lambda fs: sum(f["type"] == "CHANNEL_MESSAGE" for f in fs) >= 2, 30)
            frames += back.recv_all(quiet=1)
            assert [f["data"]["content"] for f in frames if f["type"] == "CHANNEL_MESSAGE"] == ["bulletin 3", "bulletin 4"]
    finally:
        for reader in readers.values():
            reader.close()
    for n in ring.domains():  # stored once on every domain, however many ways the flood came
        assert ring.query(n, "select count(*) from messaging_channelmessage where content like 'bulletin %%'") == [(5,)]


def test_a_user_who_reaches_the_wrong_domain_is_redirected_and_ends_up_at_home(ring):
    wrong = WsClient(ring.ws_url(1))
    reply = wrong.auth("ANZ-3000021")
    assert reply["data"]["isAuthenticated"] is False
    assert reply["data"]["redirect"] == ring.ws_url(3)
    wrong.close()
    home = WsClient(reply["data"]["redirect"])
    assert home.auth("ANZ-3000021")["data"]["isAuthenticated"] is True
    home.close()


def _link_secret(ring, a: str, b: str) -> str:
    return ring.query(1, """select l.shared_secret from apps_registry_domainlink l
                              join apps_registry_domain d1 on l.n1_id = d1.id join apps_registry_domain d2 on l.n2_id = d2.id
                             where (d1.name = %s and d2.name = %s) or (d1.name = %s and d2.name = %s)""", (a, b, b, a))[0][0]


def _forward_body(origin_id: int, path: list[str]) -> bytes:
    message = {"app": "ANZ", "kind": "direct", "sender": "ANZ-41", "content": f"crafted {origin_id}", "reference": "",
               "confirmation_requested": False, "client_message_id": None, "origin_domain": path[0],
               "origin_message_id": origin_id, "path": path, "confirms": "", "recipients": ["ANZ-1000041"]}
    return json.dumps({"messages": [message], "receipts": []}).encode()


def test_forged_replayed_and_over_hop_forwarding_calls_are_refused(ring):
    secret = _link_secret(ring, "domain-01", "domain-02")
    url = ring.http_url(2) + FORWARD_PATH

    def call(body: bytes, headers: dict) -> httpx.Response:
        return httpx.post(url, content=body, headers={**headers, "Content-Type": "application/json"}, timeout=10)

    body = _forward_body(900001, ["domain-01"])
    forged = signed_headers(secret="not-the-link-secret", sender="domain-01", method="POST", path=FORWARD_PATH, body=body)
    assert call(body, forged).status_code == 403
    stale = signed_headers(secret=secret, sender="domain-01", method="POST", path=FORWARD_PATH, body=body,
                           timestamp=int(time.time()) - 3600)
    assert call(body, stale).status_code == 403
    not_linked = signed_headers(secret=secret, sender="domain-03", method="POST", path=FORWARD_PATH, body=body)
    assert call(body, not_linked).status_code == 403  # 02-03 exists but with another secret
    genuine = signed_headers(secret=secret, sender="domain-01", method="POST", path=FORWARD_PATH, body=body)
    first = call(body, genuine)
    assert first.status_code == 200, first.text
    replayed = call(body, genuine)
    assert replayed.status_code == 409
    # Stored once: the genuine call only.
    assert ring.query(2, "select count(*) from messaging_message where content = 'crafted 900001'") == [(1,)]

    eleven = ["domain-01", *[f"domain-0{1 + i % 4}" for i in range(1, 10)], "domain-01"]
    over = _forward_body(900002, eleven)
    answer = call(over, signed_headers(secret=secret, sender="domain-01", method="POST", path=FORWARD_PATH, body=over))
    # Refused alone, by its index (a call's other messages would be stored), and not stored.
    assert answer.status_code == 200 and answer.json()["stored"] == 0
    assert [(r["index"], "hop limit" in r["reason"]) for r in answer.json()["refused"]] == [(0, True)]
    assert ring.query(2, "select count(*) from messaging_message where content = 'crafted 900002'") == [(0,)]


# --- standby domains: a home's users survive its loss (issue 27) ----------------------------------
# The ring's RING_ENV leaves takeovers off for the tests above (FAILOVER_SECONDS 300: a domain they
# stop waits for itself). Here domain-04, where domain-03's users stand by, takes them over after
# 6 s of silence (a witness, domain-01, agreeing).
FAST_FAILOVER = {"FAILOVER_SECONDS": "6", "TAKEOVER_WATCH_SECONDS": "1"}
HOLDER_SQL = """select h.name from apps_registry_takeover t join apps_registry_domain d on d.id = t.home_id
                  join apps_registry_domain h on h.id = t.holder_id where d.name = 'domain-03' and t.held"""


@pytest.fixture(scope="module")
def failover_ring(ring):
    ring.stop_domain(4)
    ring.start_domain(4, env=FAST_FAILOVER)
    _links_up_everywhere(ring)
    return ring


def _held_by(ring, n: int) -> str | None:
    """Who serves domain-03's users, as domain n knows it (None: domain-03 itself)."""
    rows = ring.query(n, HOLDER_SQL)
    return rows[0][0] if rows else None


def _fetched(client: WsClient) -> list[dict]:
    """Everything a fresh ACK-mode connection is given: the push after login, then a fetch."""
    frames = client.recv_all(quiet=1.5)
    frames += client.fetch(100)[0]
    once = {f["data"]["id"]: f for f in frames if f["type"] == "MESSAGE"}  # a push and a fetch may both bring one
    return list(once.values())


def _contents(frames: list[dict], sender: str) -> list[str]:
    return [f["data"]["content"] for f in frames if f["data"].get("from") == sender]


def _takeover_and_hand_back(ring, *, crash: bool, carol: str, tag: str) -> None:
    alice, bob = "ANZ-31", "ANZ-1000031"
    with ring.client(1, alice) as a, ring.client(3, carol, acks=True) as c:
        for i in range(3):
            a.message(carol, f"{tag} before {i}")
        pushed = _frames_from(c, alice, 3)
        c.send("ACK", {"ids": [pushed[0]["data"]["id"]]})  # the first read and acknowledged, two not
        c.recv_all(quiet=1)
    with ring.client(1, alice) as a:
        a.message(carol, f"{tag} unread")  # stored while carol is away
    copied = ("select count(*) from messaging_standbycopy where recipient = %s and"
              " state = any(%s)")
    assert _eventually(lambda: ring.query(4, copied, (carol, ["delivered"])) == [(1,)]
                       and ring.query(4, copied, (carol, ["pending", "sent", "retrying"])) == [(3,)], 15)
    lost_at = time.monotonic()
    (ring.kill_domain if crash else ring.stop_domain)(3)
    try:
        assert _eventually(lambda: _held_by(ring, 4) == "domain-04", 40), "domain-04 did not take over"
        assert _eventually(lambda: _held_by(ring, 1) == "domain-04" and _held_by(ring, 2) == "domain-04", 15)
        time.sleep(5.5)  # every process's app snapshot (SNAPSHOT_TTL 5 s) names domain-04 for carol
        # Redirected from domain-01 to domain-04, not to the lost domain-03.
        wrong = WsClient(ring.ws_url(1))
        reply = wrong.auth(carol)
        wrong.close()
        assert reply["data"]["redirect"] == ring.ws_url(4), reply
        with ring.client(4, carol, acks=True) as c, ring.client(1, alice) as a, ring.client(2, bob) as b:
            print(f"{carol} logged in at domain-04 {time.monotonic() - lost_at:.1f} s after domain-03 was lost")
            kept = _fetched(c)
            assert _contents(kept, alice) == [f"{tag} before 1", f"{tag} before 2", f"{tag} unread"]
            a.message(carol, f"{tag} during from 01", reference=f"{tag}-r1")
            b.message(carol, f"{tag} during from 02", reference=f"{tag}-r2")
            got = c.collect_frames(lambda frames: {f["data"].get("from") for f in frames
                                                   if f["type"] == "MESSAGE"} >= {alice, bob}, 30)
            live = [f for f in got if f["type"] == "MESSAGE"]
            assert sorted(_contents(live, alice) + _contents(live, bob)) == [f"{tag} during from 01",
                                                                            f"{tag} during from 02"]
            c.send("ACK", {"ids": [f["data"]["id"] for f in kept + live]})  # everything read at domain-04
            for sender_client, ref in ((a, f"{tag}-r1"), (b, f"{tag}-r2")):
                confirmation = sender_client.recv_until(lambda f, ref=ref: f["type"] == "MESSAGE_CONFIRMATION"
                                                        and f["data"].get("reference") == ref, 30)
                assert confirmation["data"]["reference"] == ref
            c.recv_all(quiet=1)
            assert _eventually(lambda: ring.query(4, "select count(*) from messaging_delivery where recipient = %s"
                                                     " and state <> 'delivered'", (carol,)) == [(0,)], 15)
    finally:
        ring.start_domain(3)
    # Home again: domain-04 hands carol back once domain-03 has every change; she is sent home.
    assert _eventually(lambda: _held_by(ring, 4) is None and _held_by(ring, 3) is None, 60), "not handed back"
    time.sleep(5.5)
    with ring.client(3, carol, acks=True) as c:
        again = _fetched(c)
        assert again == [], [f["data"]["content"] for f in again]  # nothing acknowledged at 04 comes again
    mailbox = ring.query(3, "select m.sender, m.content, d.state from messaging_delivery d join messaging_message m"
                            " on m.id = d.message_id where d.recipient = %s order by d.seq", (carol,))
    assert [(s, c) for s, c, _ in mailbox if s == alice] == [(alice, f"{tag} {w}") for w in (
        "before 0", "before 1", "before 2", "unread", "during from 01")]
    assert [c for s, c, _ in mailbox if s == bob] == [f"{tag} during from 02"]
    assert {state for *_, state in mailbox} == {"delivered"}
    _links_up_everywhere(ring)


def test_a_stopped_domains_users_are_served_by_its_standby_and_moved_home_when_it_returns(failover_ring):
    _takeover_and_hand_back(failover_ring, crash=False, carol="ANZ-3000031", tag="stopped")


def test_a_killed_domains_users_are_served_by_its_standby_and_moved_home_when_it_returns(failover_ring):
    _takeover_and_hand_back(failover_ring, crash=True, carol="ANZ-3000032", tag="killed")


def test_with_only_the_link_03_04_broken_domain_04_does_not_take_domain_03s_users(failover_ring):
    ring = failover_ring
    urls = {n: ring.query(1, "select urls from apps_registry_domain where name = %s", (f"domain-0{n}",))[0][0]
            for n in (3, 4)}
    with LinkFault(upstream_port=ring.plan(3).port) as to_03, LinkFault(upstream_port=ring.plan(4).port) as to_04:
        _set_urls(ring, "domain-03", [to_03.url, *urls[3]])
        _set_urls(ring, "domain-04", [to_04.url, *urls[4]])
        try:
            to_03.drop_from("domain-04")
            to_04.drop_from("domain-03")
            assert _eventually(lambda: _link_down_at(ring, 4, "domain-03") and _link_down_at(ring, 3, "domain-04"), 30)
            time.sleep(12)  # twice the failover threshold
            assert [_held_by(ring, n) for n in (1, 2, 3, 4)] == [None] * 4
            with ring.client(3, "ANZ-3000033"):
                pass  # still served at home
        finally:
            to_03.heal()
            to_04.heal()
            _set_urls(ring, "domain-03", urls[3])
            _set_urls(ring, "domain-04", urls[4])
    _links_up_everywhere(ring)


SPLIT_03 = """
UPDATE apps_registry_userdistribution SET range_to = 3999999
 WHERE app_id = (SELECT id FROM apps_registry_clientapp WHERE app_name = 'ANZ')
   AND domain_id = (SELECT id FROM apps_registry_domain WHERE name = 'domain-03');
INSERT INTO apps_registry_userdistribution (app_id, domain_id, range_from, range_to, standby_id)
SELECT a.id, h.id, r.low, r.high, s.id FROM apps_registry_clientapp a, apps_registry_domain h,
       (VALUES (4000000, 4999999, 'domain-02'), (5000000, 5999999, NULL)) AS r(low, high, standby)
       LEFT JOIN apps_registry_domain s ON s.name = r.standby
 WHERE a.app_name = 'ANZ' AND h.name = 'domain-03'
"""
UNSPLIT_03 = """
DELETE FROM apps_registry_userdistribution WHERE range_from IN (4000000, 5000000)
   AND app_id = (SELECT id FROM apps_registry_clientapp WHERE app_name = 'ANZ')
   AND domain_id = (SELECT id FROM apps_registry_domain WHERE name = 'domain-03');
UPDATE apps_registry_userdistribution SET range_to = 5999999
 WHERE app_id = (SELECT id FROM apps_registry_clientapp WHERE app_name = 'ANZ')
   AND domain_id = (SELECT id FROM apps_registry_domain WHERE name = 'domain-03')
"""
RANGES_03 = """SELECT ud.range_from, s.name FROM apps_registry_userdistribution ud
                 JOIN apps_registry_domain h ON h.id = ud.domain_id LEFT JOIN apps_registry_domain s ON s.id = ud.standby_id
                 JOIN apps_registry_clientapp a ON a.id = ud.app_id
                WHERE h.name = 'domain-03' AND a.app_name = 'ANZ' ORDER BY ud.range_from"""
HOLDERS_SQL = """select h.name from apps_registry_takeover t join apps_registry_domain d on d.id = t.home_id
                   join apps_registry_domain h on h.id = t.holder_id where d.name = 'domain-03' and t.held
                  order by h.name"""


def _configured_everywhere(ring, sql: str, ranges: list[tuple]) -> None:
    """`sql` run on the meta (domain-01), pulled by the others; every process's snapshot has it."""
    for statement in filter(str.strip, sql.split(";")):
        ring.query(1, statement)
    assert _eventually(lambda: all(ring.query(n, RANGES_03) == ranges for n in ring.domains()), 30), \
        [ring.query(n, RANGES_03) for n in ring.domains()]
    time.sleep(5.5)  # every process's app snapshot (SNAPSHOT_TTL 5 s)


def _redirect_of(ring, n: int, user: str) -> str | None:
    """Where domain n sends `user`'s login (None: admitted there, or refused with no redirect)."""
    client = WsClient(ring.ws_url(n))
    reply = client.auth(user)
    client.close()
    return None if reply["data"].get("isAuthenticated") else reply["data"].get("redirect")


def test_a_home_split_three_ways_is_taken_over_range_by_range_by_each_ranges_own_standby(failover_ring):
    """domain-03's users in three ranges: standby domain-04 (carol), standby domain-02 (erin), none
    (frank). With domain-03 stopped, domain-04 serves carol and domain-02 erin, both at once, each
    with her mailbox; frank waits for his home. (A takeover used to move every range to whichever
    standby took over first, admitting erin and frank there with empty mailboxes.)"""
    ring = failover_ring
    alice, carol, erin, frank = "ANZ-51", "ANZ-3000051", "ANZ-4000051", "ANZ-5000051"
    ring.stop_domain(2)
    ring.start_domain(2, env=FAST_FAILOVER)
    _links_up_everywhere(ring)
    _configured_everywhere(ring, SPLIT_03, [(3000000, "domain-04"), (4000000, "domain-02"), (5000000, None)])
    try:
        with ring.client(1, alice) as a:
            for user in (carol, erin, frank):
                a.message(user, f"split before, for {user}")
        copied = "select count(*) from messaging_standbycopy where recipient = %s"
        assert _eventually(lambda: ring.query(4, copied, (carol,)) == [(1,)] and ring.query(2, copied, (erin,)) == [(1,)]
                           and ring.query(4, copied, (erin,)) == ring.query(2, copied, (carol,)) == [(0,)], 15)
        ring.stop_domain(3)
        try:
            assert _eventually(lambda: [ring.query(n, HOLDERS_SQL) for n in (1, 2, 4)]
                               == [[("domain-02",), ("domain-04",)]] * 3, 60), \
                [ring.query(n, HOLDERS_SQL) for n in (1, 2, 4)]
            time.sleep(5.5)  # every process's app snapshot names each range's holder
            assert _redirect_of(ring, 1, carol) == ring.ws_url(4)
            assert _redirect_of(ring, 1, erin) == ring.ws_url(2)
            assert _redirect_of(ring, 4, erin) == ring.ws_url(2)  # not admitted by carol's holder
            assert _redirect_of(ring, 2, carol) == ring.ws_url(4)
            for n in (1, 2, 4):
                assert _redirect_of(ring, n, frank) == ring.ws_url(3)  # no standby: he waits for his home
            with ring.client(4, carol, acks=True) as c:
                assert _contents(_fetched(c), alice) == [f"split before, for {carol}"]
            with ring.client(2, erin, acks=True) as e:
                assert _contents(_fetched(e), alice) == [f"split before, for {erin}"]
        finally:
            ring.start_domain(3)
        assert _eventually(lambda: all(ring.query(n, HOLDERS_SQL) == [] for n in ring.domains()), 60), \
            "not handed back"
        time.sleep(5.5)
        with ring.client(3, frank, acks=True) as f:
            assert _contents(_fetched(f), alice) == [f"split before, for {frank}"]
    finally:
        _configured_everywhere(ring, UNSPLIT_03, [(3000000, "domain-04")])
        _links_up_everywhere(ring)


# --- one id per message (issue 46, item 1) -------------------------------------------------------
# make network gives domain-0N number N: its messages' ids are drawn from block N and kept wherever
# a copy of them is stored (docs/architecture.md, "One id per message").


def _sent(client: WsClient, to: str, content: str) -> str:
    """Send as an ACK-mode client and return the id its MESSAGE_ACCEPTED names."""
    client.message(to, content, reference=content)
    accepted = client.recv_until(lambda f: f["type"] == "MESSAGE_ACCEPTED" and f.get("reference") == content, 30)
    return accepted["data"]["id"]


def _ids(frames: list[dict]) -> dict[str, str]:
    return {f["data"]["content"]: f["data"]["id"] for f in frames if f["type"] == "MESSAGE"}


def test_a_message_has_one_id_at_home_at_the_standby_that_holds_its_user_and_at_home_again(failover_ring):
    ring = failover_ring
    alice, erin, dave = "ANZ-33", "ANZ-3000034", "ANZ-6000033"  # homed at domain-01, -03 and -04
    carol = "ANZ-3000033"  # homed at domain-03, standing by at domain-04
    sent: dict[str, str] = {}
    with ring.client(1, alice, acks=True) as a, ring.client(3, carol, acks=True) as c:
        sent["ids live"] = _sent(a, carol, "ids live")
        # The ordinary federated path: the id alice was given is the one carol is shown at domain-03.
        assert _ids(_frames_from(c, alice, 1)) == {"ids live": sent["ids live"]}
        c.send("ACK", {"ids": [sent["ids live"]]})
        c.recv_all(quiet=1)
    with ring.client(1, alice, acks=True) as a, ring.client(3, erin, acks=True) as e:
        sent["ids before from 01"] = _sent(a, carol, "ids before from 01")  # stored while carol is away
        sent["ids before from 03"] = _sent(e, carol, "ids before from 03")  # stored first at her home
    copied = "select count(*) from messaging_standbycopy where recipient = %s and state <> 'delivered'"
    assert _eventually(lambda: ring.query(4, copied, (carol,)) == [(2,)], 15)
    ring.stop_domain(3)
    try:
        assert _eventually(lambda: _held_by(ring, 4) == "domain-04", 40), "domain-04 did not take over"
        assert _eventually(lambda: _held_by(ring, 1) == "domain-04", 15)
        time.sleep(5.5)  # every process's app snapshot (SNAPSHOT_TTL 5 s) names domain-04 for carol
        with ring.client(4, carol, acks=True) as c:
            # What was stored at home before the loss has the same ids at the holder.
            assert _ids(_fetched(c)) == {k: sent[k] for k in ("ids before from 01", "ids before from 03")}
            with ring.client(1, alice, acks=True) as a, ring.client(4, dave, acks=True) as d:
                sent["ids during from 01"] = _sent(a, carol, "ids during from 01")
                sent["ids during from 04"] = _sent(d, carol, "ids during from 04")  # stored first at the holder
            got = c.collect_frames(lambda frames: {f["data"].get("from") for f in frames
                                                   if f["type"] == "MESSAGE"} >= {alice, dave}, 30)
            # Shown at the holder with the ids their senders were given; none acknowledged here.
            assert _ids(got) == {k: sent[k] for k in ("ids during from 01", "ids during from 04")}
    finally:
        ring.start_domain(3)
    assert _eventually(lambda: _held_by(ring, 4) is None and _held_by(ring, 3) is None, 60), "not handed back"
    time.sleep(5.5)
    with ring.client(3, carol, acks=True) as c:
        # Home again: every message she has not acknowledged comes with the one id it had everywhere.
        assert _ids(_fetched(c)) == {k: v for k, v in sent.items() if k != "ids live"}
    # Every domain that holds one of them (on the way, at home, at the holder) holds it by that id.
    held = "select content, id::text from messaging_message where content like %s"
    assert dict(ring.query(3, held, ("ids %",))) == sent
    for n in (1, 2, 4):
        assert dict(ring.query(n, held, ("ids %",))).items() <= sent.items()
    _links_up_everywhere(ring)


def _mailbox_contents(ring, n: int, user: str) -> list[str]:
    return [c for (c,) in ring.query(n, "select m.content from messaging_delivery d join messaging_message m"
                                        " on m.id = d.message_id where d.recipient = %s and d.forward_to = ''"
                                        " order by d.seq", (user,))]


def test_a_message_the_holder_held_for_one_only_the_lost_home_had_reaches_the_user_at_home_with_the_hand_back(
        failover_ring):
    ring = failover_ring
    alice, carol = "ANZ-35", "ANZ-3000035"  # homed at domain-01 and domain-03 (standing by at domain-04)
    with ring.client(1, alice) as a:
        a.message(carol, "order 1")
    copied = "select count(*) from messaging_standbycopy where recipient = %s"
    assert _eventually(lambda: ring.query(4, copied, (carol,)) == [(1,)], 15)
    urls = ring.query(1, "select urls from apps_registry_domain where name = %s", ("domain-04",))[0][0]
    with LinkFault(upstream_port=ring.plan(4).port) as to_04:
        _set_urls(ring, "domain-04", [to_04.url, *urls])
        try:
            to_04.drop_from("domain-03")  # domain-03's copies stop reaching its standby
            assert _eventually(lambda: _link_down_at(ring, 3, "domain-04"), 30)
            with ring.client(1, alice) as a:
                a.message(carol, "order 2")  # stored at home, never copied: only domain-03 has it
            assert _eventually(lambda: _mailbox_contents(ring, 3, carol) == ["order 1", "order 2"], 15)
            time.sleep(2)
            assert ring.query(4, copied, (carol,)) == [(1,)]  # (the copy still lacks it)
            ring.kill_domain(3)
            assert _eventually(lambda: _held_by(ring, 4) == "domain-04", 40), "domain-04 did not take over"
            assert _eventually(lambda: _held_by(ring, 1) == "domain-04", 15)
            time.sleep(5.5)  # every process's app snapshot names domain-04 for carol
            with ring.client(1, alice) as a:
                a.message(carol, "order 3")
            # At the holder it waits for "order 2", which only the lost home has (its origin's order).
            held = "select count(*) from messaging_heldinorder where recipient = %s"
            assert _eventually(lambda: ring.query(4, held, (carol,)) == [(1,)], 30), (
                _mailbox_contents(ring, 4, carol), ring.query(4, "select content, state, origin_seq from"
                                                              " messaging_standbycopy where recipient = %s", (carol,)))
        finally:
            to_04.heal()
            _set_urls(ring, "domain-04", urls)
            ring.start_domain(3)
    assert _eventually(lambda: _held_by(ring, 4) is None and _held_by(ring, 3) is None, 60), "not handed back"
    # Home with the hand-back, after "order 2": not NETWORK_ORDER_WAIT_SECONDS (60 s) later, from the
    # holder, after what alice sends next.
    assert _eventually(lambda: _mailbox_contents(ring, 3, carol) == ["order 1", "order 2", "order 3"], 20), \
        _mailbox_contents(ring, 3, carol)
    assert ring.query(4, held, (carol,)) == [(0,)]
    time.sleep(5.5)
    with ring.client(1, alice) as a:
        a.message(carol, "order 4")
    assert _eventually(lambda: _mailbox_contents(ring, 3, carol)[-1:] == ["order 4"], 15)
    with ring.client(3, carol, acks=True) as c:
        assert [f["data"]["content"] for f in _fetched(c)] == [f"order {i}" for i in (1, 2, 3, 4)]
    _links_up_everywhere(ring)


def _admitted(ring, n: int, user: str) -> bool:
    try:
        ring.client(n, user).close()
        return True
    except (RingRefused, OSError):
        return False


RETURNING_SQL = """select t.returning_since is not null from apps_registry_takeover t
                     join apps_registry_domain d on d.id = t.home_id join apps_registry_domain h on h.id = t.holder_id
                    where d.name = 'domain-03' and h.name = 'domain-04' and t.held"""


def _holder_lost_and_home_back(ring, carol: str, *, while_returning: bool) -> None:
    """domain-03 killed and taken over by domain-04 (alice's "during" stored there, not yet home);
    then domain-04 killed as it begins to hand carol back (`while_returning`), or before domain-03
    is back. domain-03 takes carol back without it; domain-04, back, finishes its hand-back."""
    alice = "ANZ-36"
    with ring.client(1, alice) as a:
        a.message(carol, "before")
    copied = "select count(*) from messaging_standbycopy where recipient = %s"
    assert _eventually(lambda: ring.query(4, copied, (carol,)) == [(1,)], 15)
    ring.kill_domain(3)
    try:
        assert _eventually(lambda: _held_by(ring, 4) == "domain-04", 40), "domain-04 did not take over"
        assert _eventually(lambda: _held_by(ring, 1) == "domain-04", 15)
        time.sleep(5.5)  # every process's app snapshot names domain-04 for carol
        with ring.client(1, alice) as a:
            a.message(carol, "during")  # stored at the holder
        assert _eventually(lambda: _mailbox_contents(ring, 4, carol) == ["before", "during"], 15)
        if not while_returning:
            ring.kill_domain(4)
    finally:
        # (with FAST_FAILOVER it takes its users back after FAILOVER_SECONDS, or half that while
        # they are being handed back). On a thread: the hand-back may begin before domain-03 says
        # it is ready.
        starting = threading.Thread(target=ring.start_domain, args=(3,), kwargs={"env": FAST_FAILOVER})
        starting.start()
    if while_returning:  # domain-04 hears domain-03 again and begins to hand carol back: killed just then
        assert _eventually(lambda: ring.query(4, RETURNING_SQL) == [(True,)], 60, every=0.05), "no hand-back begun"
        ring.kill_domain(4)
    starting.join()
    back = time.monotonic()
    try:
        # Before, carol was refused everywhere until domain-04 came back and finished.
        assert _eventually(lambda: _admitted(ring, 3, carol), 40), "domain-03 did not take carol back"
        print(f"{carol} admitted at home {time.monotonic() - back:.1f} s after domain-03 was ready")
        assert _eventually(lambda: _held_by(ring, 1) is None and _held_by(ring, 2) is None, 15)
        time.sleep(5.5)  # domain-01's app snapshots name carol's home again
        with ring.client(1, alice) as a:
            a.message(carol, "after")
        with ring.client(3, carol, acks=True) as c:
            read = _fetched(c)
            c.send("ACK", {"ids": [f["data"]["id"] for f in read]})  # what she has at home, read there
            c.recv_all(quiet=1)
    finally:
        ring.start_domain(4, env=FAST_FAILOVER)
    # Back, domain-04 finishes its hand-back (its own record, a later epoch): what it had not sent
    # home yet comes now; nothing is there twice, nothing read at home comes again.
    assert _eventually(lambda: _held_by(ring, 4) is None, 60), "domain-04 never finished its hand-back"
    assert _eventually(lambda: _mailbox_contents(ring, 3, carol) == ["before", "during", "after"], 30), \
        _mailbox_contents(ring, 3, carol)
    time.sleep(5.5)
    with ring.client(3, carol, acks=True) as c:
        again = [f["data"]["content"] for f in _fetched(c)]
    assert sorted(again) == sorted({"before", "during", "after"} - set(_contents(read, alice))), again
    # (domain-03 takes its users back after 150 s again, as the ring's other tests expect)
    ring.stop_domain(3)
    ring.start_domain(3, env={"FAILOVER_SECONDS": RING_ENV["FAILOVER_SECONDS"], "TAKEOVER_WATCH_SECONDS": "2"})
    _links_up_everywhere(ring)


def test_a_home_whose_holder_is_killed_while_handing_its_users_back_takes_them_back_without_it(failover_ring):
    _holder_lost_and_home_back(failover_ring, "ANZ-3000036", while_returning=True)


def test_a_home_back_while_its_holder_is_lost_takes_its_users_back_after_the_failover_threshold(failover_ring):
    _holder_lost_and_home_back(failover_ring, "ANZ-3000037", while_returning=False)


def test_what_a_user_sends_from_home_after_its_hand_back_goes_in_after_what_it_sent_from_the_holder(failover_ring):
    """One sender, two origins (issue 46, item 2): carol, taken over by domain-04, sends bob three
    messages from there; they wait at domain-01, whose calls to bob's home (and back to domain-04)
    fail. Back home after the hand-back, she sends three more, which go straight to domain-02. They
    say they come after domain-04's third (its count, sent home with the hand-back), so bob's home
    holds them until the first three arrive: bob gets all six in the order carol sent them.
    (Before, the last three went in first: each origin was ordered on its own.)"""
    ring = failover_ring
    carol, bob = "ANZ-3000051", "ANZ-1000051"
    assert _eventually(lambda: all(_held_by(ring, n) is None for n in ring.domains()), 90), "domain-03 still held"
    _links_up_everywhere(ring)
    urls = {name: ring.query(1, "select urls from apps_registry_domain where name = %s", (name,))[0][0]
            for name in ("domain-02", "domain-04")}
    held = "select count(*) from messaging_heldinorder where recipient = %s"
    with LinkFault(upstream_port=ring.plan(2).port) as to_02, LinkFault(upstream_port=ring.plan(4).port) as to_04:
        _set_urls(ring, "domain-02", [to_02.url, *urls["domain-02"]])  # calls to domain-02 and -04 go
        _set_urls(ring, "domain-04", [to_04.url, *urls["domain-04"]])  # through the faults
        try:
            ring.kill_domain(3)
            assert _eventually(lambda: _held_by(ring, 4) == "domain-04", 40), "domain-04 did not take over"
            time.sleep(5.5)  # every process's app snapshot names domain-04 for carol
            with ring.client(4, carol) as c:
                # domain-01 takes them, and can neither pass them on nor hand them back
                to_02.drop_from("domain-01")
                to_04.drop_from("domain-01")
                for i in (1, 2, 3):
                    c.message(bob, f"from the holder {i}")
            waiting = "select count(*) from messaging_delivery where recipient = %s and state = 'forwarding'"
            assert _eventually(lambda: ring.query(1, waiting, (bob,)) == [(3,)], 20), _whereabouts(ring, "from the holder 1")
            ring.start_domain(3)
            assert _eventually(lambda: _held_by(ring, 4) is None and _held_by(ring, 3) is None, 60), "not handed back"
            follows = ("select origin_domain, seq from messaging_orderafter where recipient = %s"
                       " and senders_home = 'domain-03'")
            assert ring.query(3, follows, (bob,)) == [("domain-04", 3)]  # domain-04's count, with its hand-back
            time.sleep(5.5)  # every process's app snapshot names domain-03 for carol again
            with ring.client(3, carol) as c:
                for i in (1, 2, 3):
                    c.message(bob, f"from home {i}")
            assert _eventually(lambda: ring.query(2, held, (bob,)) == [(3,)], 20), _whereabouts(ring, "from home 1")
            assert _mailbox_contents(ring, 2, bob) == []
        finally:
            to_02.heal()
            to_04.heal()
            if not ring.running(3):
                ring.start_domain(3)
            for name, original in urls.items():
                _set_urls(ring, name, original)
    wanted = [f"from the holder {i}" for i in (1, 2, 3)] + [f"from home {i}" for i in (1, 2, 3)]
    assert _eventually(lambda: _mailbox_contents(ring, 2, bob) == wanted, 60), _mailbox_contents(ring, 2, bob)
    assert ring.query(2, held, (bob,)) == [(0,)]
    _links_up_everywhere(ring)


def test_with_domain_01_and_03_lost_together_domain_04_serves_its_users_and_takes_over_domain_03s(failover_ring):
    """Two domains lost that are not neighbours: domain-04 has lost both its neighbours. It still
    hears domain-02 over their liveness-only link (the ring's diagonal), so it is not cut off from the
    network: it keeps admitting its own users, and takes domain-03's over with domain-02 as witness.
    (Before those links it fenced its users and found no witness until one of the pair returned.)"""
    ring = failover_ring
    dave, carol = "ANZ-6000041", "ANZ-3000041"
    # (a test before may have left domain-03's users held by domain-04 as domain-03 restarted: handed back first)
    assert _eventually(lambda: all(_held_by(ring, n) is None for n in ring.domains()), 90), "domain-03 still held"
    _links_up_everywhere(ring)
    ring.kill_domain(1)
    ring.kill_domain(3)
    lost_at = time.monotonic()
    try:
        assert _eventually(lambda: _held_by(ring, 4) == "domain-04", 40), "domain-04 did not take over"
        print(f"domain-04 took domain-03's users over {time.monotonic() - lost_at:.1f} s after the pair was lost")
        time.sleep(5.5)  # past domain-04's fence window (6 s) since the loss; its snapshots name it carol's home
        assert _admitted(ring, 4, dave), "domain-04 fenced its own users"
        assert _admitted(ring, 4, carol), "domain-03's user is not admitted at its holder"
        # No message took the liveness link: domain-04's message to domain-02 waits for a link that carries it.
        with ring.client(4, dave) as d:
            d.message("ANZ-1000041", "waits for a way")
        assert _eventually(lambda: ring.query(4, "select forward_to from messaging_delivery where recipient = %s"
                                                 " and state = 'forwarding'", ("ANZ-1000041",))
                           in ([("domain-01",)], [("domain-03",)]), 10)
    finally:
        starting = [threading.Thread(target=ring.start_domain, args=(n,)) for n in (1, 3)]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
    assert _eventually(lambda: _held_by(ring, 4) is None and _held_by(ring, 3) is None, 60), "not handed back"
    # (once the links are up: the message may wait out the backoff its link earned while the pair was away)
    assert _eventually(lambda: _mailbox_contents(ring, 2, "ANZ-1000041")[-1:] == ["waits for a way"], 120), \
        _whereabouts(ring, "waits for a way")
    _links_up_everywhere(ring)


def _whereabouts(ring, content: str) -> str:
    """Where a message is on every domain: its deliveries' states and next hops, whether it is held
    for order, and each domain's links (what a failed wait shows, in full)."""
    out: dict[str, object] = {}
    for n in ring.domains():
        out[f"domain-0{n}"] = {
            "deliveries": ring.query(n, "select d.state, d.forward_to, d.attempts, d.next_attempt_at - now(), d.last_error"
                                        " from messaging_delivery d join messaging_message m on m.id = d.message_id"
                                        " where m.content = %s", (content,)),
            "message": ring.query(n, "select origin_domain, origin_message_id, order_after, created_at"
                                     " from messaging_message where content = %s", (content,)),
            "follows": ring.query(n, "select * from messaging_orderafter"),
            "marks": ring.query(n, "select m.recipient, m.origin_domain, m.last_seq, m.held, m.after_origin, m.after_seq"
                                   " from messaging_ordermark m join messaging_message x on x.content = %s"
                                   " join messaging_delivery d on d.message_id = x.id and d.recipient = m.recipient",
                                (content,)),
            "held for order": ring.query(n, "select h.origin_domain, h.origin_seq, now() - h.held_at"
                                            " from messaging_heldinorder h join messaging_message m on m.id = h.message_id"
                                            " where m.content = %s", (content,)),
            "links": ring.query(n, "select peer, up, failures, retry_at - now(), left(last_error, 80) from messaging_linkhealth"),
        }
    return json.dumps(out, default=str, indent=1)
