"""A network of domains in one test database: domain-01 - domain-02 - domain-03 (and, for the tests
that need a second path, domain-04 linked to 01 and 03). Each side is played by switching
`settings.DOMAIN_NAME` and the connection's search_path: every domain other than domain-01 has its
own copies of the messaging tables (messages, deliveries, mailboxes, link health) in a schema of its
own, as it would have its own database, while the configuration (apps, domains, links) is shared,
as the meta role shares it. Calls between domains go straight to the receiving side's
`forward_accept` (the payload through JSON, as on the wire), and the work each side hands to Celery
(routing, a link's sender, receipts) is recorded and run by `net.pump()` as that domain.

ANZ users are homed as in the seed's ring: 0-999999 on domain-01, 1000000-2999999 on domain-02,
3000000-5999999 on domain-03, 6000000 and up on domain-04.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from django.db import connection
from django.test import override_settings

from apps_registry.models import DomainLink
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import distribution_create
from messaging import router
from messaging.delivery import dead_letters, delivered
from messaging.delivery.delivered import deliveries_mark_delivered
from messaging.models import Delivery, Message
from messaging.network import intake, links, outbox, queue, receipts
from messaging.network.transport import PeerError, PeerRefused
from messaging.store import OutgoingMessage, messages_store
from tests.factories import make_app, make_domain

DOMAIN_TABLES = ("messaging_message", "messaging_delivery", "messaging_mailbox", "messaging_linkhealth")
HOMES = {"domain-01": (0, 999_999), "domain-02": (1_000_000, 2_999_999), "domain-03": (3_000_000, 5_999_999),
         "domain-04": (6_000_000, None)}


@dataclass
class Net:
    app: object
    routed: list[tuple[str, list[int]]] = field(default_factory=list)
    kicks: list[tuple[str, str]] = field(default_factory=list)
    receipts: list[tuple[str, dict]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)  # domains that refuse connections
    calls: list[tuple[str, str, dict]] = field(default_factory=list)  # (from, to, payload)
    here: str = "domain-01"

    @contextmanager
    def at(self, domain: str):
        previous = self.here
        self.here = domain
        _search_path(domain)
        try:
            with override_settings(DOMAIN_NAME=domain):
                yield
        finally:
            self.here = previous
            _search_path(previous)

    def route(self, ids) -> None:
        self.routed.append((self.here, list(ids)))

    def send(self, sender: str, to: list[str] | str, content: str = "hi", *, at: str = "domain-01", **kw) -> int:
        """A message stored at `at` (its sender's home); routed by the next pump. Its id there."""
        recipients = (to,) if isinstance(to, str) else tuple(to)
        with self.at(at):
            result = messages_store(messages=[OutgoingMessage(app_id=self.app.pk, sender=sender, recipients=recipients,
                                                              content=content, **kw)], route=self.route)[0]
        return result.message_id

    def pump(self, rounds: int = 30) -> None:
        """Run everything the domains handed over, as the domain that handed it, until nothing is left."""
        for _ in range(rounds):
            if self.routed:
                domain, ids = self.routed.pop(0)
                with self.at(domain):
                    router.deliveries_route(ids)
            elif self.kicks:
                domain, peer = self.kicks.pop(0)
                with self.at(domain):
                    outbox.link_forward(peer=peer)
            elif self.receipts:
                domain, work = self.receipts.pop(0)
                with self.at(domain):
                    batch = [*receipts.receipts_of(work.get("delivery_ids", [])), *work.get("receipts", [])]
                    if batch:
                        receipts.receipts_send(receipts=batch)
            else:
                return
        raise AssertionError("the network did not settle")

    def deliver(self, recipient: str, *, at: str) -> list[int]:
        """The recipient's home domain marks what it has for it delivered (a fetch, an ACK)."""
        with self.at(at):
            ids = list(Delivery.objects.filter(recipient=recipient, state__in=["pending", "sent", "retrying"])
                       .values_list("id", flat=True))
            deliveries_mark_delivered(delivery_ids=ids, route=self.route)
        return ids

    def copy(self, domain: str, origin_id: int, origin: str = "domain-01") -> Message:
        """The copy of a message stored in `domain`."""
        with self.at(domain):
            return Message.objects.get(origin_domain=origin, origin_message_id=origin_id)

    def row(self, domain: str, message_id: int, recipient: str) -> Delivery:
        with self.at(domain):
            return Delivery.objects.get(message_id=message_id, recipient=recipient)

    def mailbox(self, domain: str, recipient: str) -> list[int]:
        """The origin ids of what is in a recipient's mailbox in `domain`, in mailbox order."""
        with self.at(domain):
            return list(Delivery.objects.filter(recipient=recipient).order_by("seq")
                        .values_list("message__origin_message_id", flat=True))

    def call(self, *, peer: str, path: str, payload: dict) -> dict:
        sender = self.here
        body = json.loads(json.dumps(payload))
        self.calls.append((sender, peer, body))
        if peer in self.down:
            raise PeerError(f"{peer}: connection refused")
        with self.at(peer):
            try:
                return intake.forward_accept(sender=sender, payload=body)
            except PeerRefused as refused:
                raise PeerError(f"{peer} answered {refused.status}: {refused.reason}", status=refused.status) from None


def _schema(domain: str) -> str:
    return domain.replace("-", "_")


def _search_path(domain: str) -> None:
    with connection.cursor() as cur:
        cur.execute("SET search_path TO public" if domain == "domain-01" else f"SET search_path TO {_schema(domain)}, public")


@pytest.fixture
def net(monkeypatch):
    links._graph_cache = None
    with connection.cursor() as cur:
        for domain in list(HOMES)[1:]:
            cur.execute(f"DROP SCHEMA IF EXISTS {_schema(domain)} CASCADE; CREATE SCHEMA {_schema(domain)}")
            for table in DOMAIN_TABLES:
                cur.execute(f"CREATE TABLE {_schema(domain)}.{table} (LIKE public.{table} INCLUDING ALL)")
    app_snapshots_clear()
    domains = {name: make_domain(name, urls=[f"http://127.0.0.1:1/{name}"]) for name in HOMES}
    app = make_app(domain=domains["domain-01"], range_to=999_999, max_delivery_attempts=3)
    for name, (low, high) in HOMES.items():
        if name != "domain-01":
            distribution_create(app=app, domain=domains[name], range_from=low, range_to=high)
    for a, b in (("domain-01", "domain-02"), ("domain-02", "domain-03")):
        DomainLink.objects.create(n1=domains[a], n2=domains[b])
    app_snapshots_clear()
    network = Net(app=app)
    monkeypatch.setattr(links, "GRAPH_CACHE_SECONDS", -1.0)  # every test changes links
    monkeypatch.setattr(intake, "routing_enqueue", network.route)
    monkeypatch.setattr(queue, "forward_links_kick", lambda peers: network.kicks.extend((network.here, p) for p in peers))
    record = lambda **work: network.receipts.append((network.here, work))  # noqa: E731
    monkeypatch.setattr(delivered, "receipts_enqueue", record)
    monkeypatch.setattr(dead_letters, "receipts_enqueue", record)
    monkeypatch.setattr(receipts, "receipts_enqueue", record)
    monkeypatch.setattr(outbox, "peer_call", network.call)
    monkeypatch.setattr(receipts, "peer_call", network.call)
    yield network
    app_snapshots_clear()
    _search_path("domain-01")
    with connection.cursor() as cur:
        for domain in list(HOMES)[1:]:
            cur.execute(f"DROP SCHEMA IF EXISTS {_schema(domain)} CASCADE")


def link(a: str, b: str, **fields) -> DomainLink:
    return DomainLink.objects.create(n1=make_domain(a), n2=make_domain(b), **fields)


# The seed's whole ring in one set of tables (the flood's and the links' tests): fixture `ring`.
from tests.messaging.network.one_db_ring import ring  # noqa: E402, F401
