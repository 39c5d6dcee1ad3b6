"""Past what its database can take, a web node says so instead of queueing without limit.

While Postgres stalls, the node's intake (INTAKE_MAX_PENDING sends waiting for a commit) fills up;
every RELIABLE send beyond it gets INVALID_MESSAGE "server busy" with a retry hint and is not stored.
The node stays responsive all the while: health checks answer, new clients authenticate and FAST
messages flow. Once Postgres catches up, every send that was not refused is stored and delivered.
"""

from __future__ import annotations

import time
import urllib.request

import psycopg
import pytest

from tests.processes import database_url_for_tests
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system

SENDERS = 30
PENDING = 10


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status


ANSWERS = {"INVALID_MESSAGE", "MESSAGE_ACCEPTED"}


def test_a_node_whose_database_stalls_refuses_sends_clearly_stays_responsive_and_delivers_all_it_accepted(processes):
    web = processes.web("web", INTAKE_MAX_PENDING=str(PENDING))
    processes.worker("worker")
    senders = [WsClient(web.ws_url) for _ in range(SENDERS)]
    try:
        with WsClient(web.ws_url) as recipient:
            recipient.auth("ANZ-91000")
            for i, sender in enumerate(senders):
                sender.auth(f"ANZ-{91001 + i}", acks=True)

            # The stall: a transaction holds the mailboxes, so every store waits for it.
            blocker = psycopg.connect(database_url_for_tests())
            try:
                blocker.execute("LOCK TABLE messaging_mailbox IN EXCLUSIVE MODE")
                senders[0].message("ANZ-91000", "m-0", clientMessageId="cm-0")
                time.sleep(0.5)  # its commit has begun, and waits
                for i, sender in enumerate(senders[1:], start=1):
                    sender.message("ANZ-91000", f"m-{i}", clientMessageId=f"cm-{i}")
                time.sleep(0.5)
                answers = {i: [f for f in sender.recv_all(quiet=0.2) if f["type"] in ANSWERS]
                           for i, sender in enumerate(senders)}
                refused = {i: frames[0] for i, frames in answers.items() if frames}
                assert len(refused) == SENDERS - 1 - PENDING, answers
                for frame in refused.values():
                    assert frame["type"] == "INVALID_MESSAGE"  # nothing was committed, so nothing accepted
                    assert frame["data"]["reason"].startswith("server busy")
                    assert frame["data"]["retryAfterMs"] > 0

                # Still responsive: health, a new client's authentication, FAST messages.
                assert _status(f"{web.url}/healthz") == 200
                with WsClient(web.ws_url) as fast_a, WsClient(web.ws_url) as fast_b:
                    assert fast_b.auth("ANZ-91900")["data"]["isAuthenticated"] is True
                    assert fast_a.auth("ANZ-91901")["data"]["isAuthenticated"] is True
                    fast_a.message("ANZ-91900", "quick", feature="FAST")
                    assert fast_b.recv_type("MESSAGE", timeout=5)["data"]["content"] == "quick"
            finally:
                blocker.rollback()  # Postgres catches up
                blocker.close()

            accepted = [i for i in range(SENDERS) if i not in refused]
            assert len(accepted) == PENDING + 1
            for i in accepted:
                frame = senders[i].recv_until(lambda f: f["type"] in ANSWERS, timeout=20)
                assert frame["type"] == "MESSAGE_ACCEPTED" and frame["data"]["clientMessageId"] == f"cm-{i}"
            delivered = recipient.collect_messages(want=len(accepted), timeout=20)
            assert sorted(delivered.values()) == sorted(f"m-{i}" for i in accepted)
            late = [f for f in recipient.recv_all(quiet=1) if f["type"] == "MESSAGE"]
            assert late == [], "a refused send was stored after all"
    finally:
        for sender in senders:
            sender.close()
    wait_for(lambda: _status(f"{web.url}/readyz") == 200)

