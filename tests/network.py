"""A network of domains in one test database: the one-database harness (tests/ring.py is the one
with real processes).

Four domains, domain-01 to domain-04, with app ANZ distributed as in the seed's ring: users
0-999999 homed on domain-01, 1000000-2999999 on domain-02, 3000000-5999999 on domain-03, 6000000 and
up on domain-04. Fixture `net` links them in a line, 01 - 02 - 03 (a test adds links with
`net.link`); fixture `net_ring` links the seed's ring, 01-02, 02-03, 03-04 and 01-04.

Each domain has its own copies of the domain's tables (messages, deliveries, mailboxes, channels,
the link queues, link health) in a schema of its own, as it would have its own database; domain-01's
are the public ones. The configuration (apps, domains, links) is shared, as the meta role shares it.
A test plays a domain with `with net.at("domain-02"):` (settings.DOMAIN_NAME and the connection's
search_path), and everything the product does runs through its real doors:

- the hand-off (foundation.handoff) is an inline dispatcher that records which domain handed each
  task over; `net.pump()` runs the tasks, as that domain, through the task functions the workers
  run, until none is left;
- calls to a neighbour (messaging.federation.wire.transport) go over a wire that hands the signed request
  to the neighbour's view in-process (signature, nonce, body checks and all), as that domain; a
  domain in `net.down` refuses the connection;
- work a domain commits is handed over when its `at` block ends (its on-commit callbacks run
  there), so the harness works alike in a test transaction and in a transactional test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from apps_registry.models import ClientApp, Domain, DomainLink
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import distribution_create
from foundation.handoff import WAKE_KEY, Handed, InlineDispatcher, dispatcher_use, task_run
from foundation.locks import one_at_a_time
from foundation.outgoing import Answer, OutgoingError
from foundation.transport.redis_clients import sync_client
from messaging.core.delivery.delivered import deliveries_mark_delivered
from messaging.core.store import OutgoingMessage, messages_store
from messaging.federation import links
from messaging.federation.models import LinkHealth
from messaging.federation.takeover.fence import fence_forget
from messaging.federation.wire.transport import PeerCall, wire_use
from messaging.models import Delivery, Message
from tests.factories import make_app

DOMAINS = ("domain-01", "domain-02", "domain-03", "domain-04")
HOMES = {"domain-01": (0, 999_999), "domain-02": (1_000_000, 2_999_999), "domain-03": (3_000_000, 5_999_999),
         "domain-04": (6_000_000, None)}
LINE = [("domain-01", "domain-02"), ("domain-02", "domain-03")]
RING = [("domain-01", "domain-02"), ("domain-02", "domain-03"), ("domain-03", "domain-04"), ("domain-01", "domain-04")]
# What each domain keeps of its own (its database, in production).
DOMAIN_TABLES = ("messaging_message", "messaging_delivery", "messaging_mailbox", "messaging_linkhealth",
                 "messaging_channel", "messaging_channelmessage", "messaging_channelforward",
                 "messaging_receiptforward", "messaging_subscription", "messaging_ordermark",
                 "messaging_heldinorder", "messaging_standbyfeed", "messaging_standbycopy",
                 "messaging_standbysubscription", "messaging_domainheard", "apps_registry_takeover",
                 "messaging_orderafter")


@dataclass(frozen=True)
class Call:
    """A call one domain made to a neighbour, as the neighbour received it."""

    sender: str
    peer: str
    path: str
    payload: dict


def secret(a: str, b: str) -> str:
    return f"secret-{a}-{b}"


def _schema(domain: str) -> str:
    return domain.replace("-", "_")


def _search_path(domain: str) -> None:
    """Play `domain` on the connection: its tables first, and its name for its triggers (the standby feed)."""
    with connection.cursor() as cur:
        cur.execute("SET search_path TO public" if domain == DOMAINS[0] else f"SET search_path TO {_schema(domain)}, public")
        cur.execute("SELECT set_config('switchboard.domain', %s, false)", [domain])


def _caches_clear() -> None:
    """What a process caches of its own domain (the graph, the app snapshots, which name a range's
    holder while its home is taken over, the fence): one process plays every domain here."""
    links.graph_cache_clear()
    app_snapshots_clear()
    fence_forget()


def _run_on_commit_since(start: int) -> None:
    """Run the on-commit callbacks registered since `start` (what a commit would run now), and
    those they register in turn. In autocommit they ran already and there are none."""
    while len(connection.run_on_commit) > start:
        callbacks = connection.run_on_commit[start:]
        del connection.run_on_commit[start:]
        for _, func, _robust in callbacks:
            func()


class _NetDispatcher(InlineDispatcher):
    def __init__(self, net: Network):
        super().__init__()
        self.net = net

    def context(self) -> str:
        return self.net.here

    def run(self, handed: Handed):
        with self.net.at(handed.context):
            return task_run(handed.task, handed.args)


class OneByOneWire:
    """A test wire's `post_all`: its calls one after the other (HttpWire makes them at once)."""

    def post_all(self, calls: list[PeerCall], *, deadline: float) -> list:
        out = []
        for call in calls:
            try:
                out.append(self.post(call, deadline=deadline))
            except OutgoingError as exc:
                out.append(exc)
        return out


class _NetWire(OneByOneWire):
    """Hands a call to the neighbour's view in-process, as the neighbour."""

    def __init__(self, net: Network):
        self.net = net
        self.client = Client(raise_request_exception=True)

    def post(self, call: PeerCall, *, deadline: float) -> Answer:
        net = self.net
        path = call.url.split("://", 1)[1].split("/", 1)[1]
        path = "/" + path
        net.calls.append(Call(net.here, call.peer, path, json.loads(call.body)))
        if call.peer in net.down or frozenset((net.here, call.peer)) in net.cut:
            raise OutgoingError("cannot connect: [Errno 111] Connection refused")
        headers = {k: v for k, v in call.headers.items() if k.lower() != "content-type"}
        with net.at(call.peer):
            answer = self.client.post(path, data=call.body, content_type="application/json", headers=headers)
        return Answer(answer.status_code, answer.content, complete=True)


@dataclass
class Network:
    app: ClientApp
    links: dict[tuple[str, str], DomainLink]
    down: set[str] = field(default_factory=set)  # domains that refuse connections
    cut: set[frozenset[str]] = field(default_factory=set)  # links whose calls fail both ways (`net.cut_link`)
    calls: list[Call] = field(default_factory=list)
    here: str = DOMAINS[0]
    dispatcher: _NetDispatcher | None = None

    @contextmanager
    def at(self, domain: str):
        """Play `domain`: its settings, its tables; what it commits is handed over when the block ends."""
        previous = self.here
        self.here = domain
        _search_path(domain)
        _caches_clear()
        start = len(connection.run_on_commit)
        try:
            with override_settings(DOMAIN_NAME=domain):
                yield
                _run_on_commit_since(start)
        finally:
            self.here = previous
            _search_path(previous)
            _caches_clear()

    # --- the network's shape ---

    def link(self, a: str, b: str, **fields) -> DomainLink:
        made = DomainLink.objects.create(n1=Domain.objects.get(name=a), n2=Domain.objects.get(name=b),
                                         shared_secret=fields.pop("shared_secret", secret(a, b)), **fields)
        self.links[(a, b)] = made
        links.graph_cache_clear()
        return made

    def link_of(self, a: str, b: str) -> DomainLink:
        return self.links.get((a, b)) or self.links[(b, a)]

    def cut_link(self, a: str, b: str) -> None:
        """Calls between `a` and `b` fail from now on (the others go on), and each end has seen its
        calls fail for longer than LINK_DOWN_AFTER_SECONDS: the link is down at both ends."""
        self.cut.add(frozenset((a, b)))
        for here, peer in ((a, b), (b, a)):
            with self.at(here):
                links.link_failed(peer=peer, error=f"{peer}: connection refused")
                LinkHealth.objects.filter(peer=peer).update(down_since=timezone.now() - timedelta(hours=1))

    def disable(self, a: str, b: str) -> None:
        DomainLink.objects.filter(pk=self.link_of(a, b).pk).update(enabled=False)
        links.graph_cache_clear()

    # --- what users and domains do ---

    def send(self, sender: str, to: list[str] | str, content: str = "hi", *, at: str = DOMAINS[0], **kw) -> int:
        """A message stored at `at` (its sender's home); routed by the next pump. Its id there."""
        recipients = (to,) if isinstance(to, str) else tuple(to)
        with self.at(at):
            result = messages_store(messages=[OutgoingMessage(app_id=self.app.pk, sender=sender, recipients=recipients,
                                                              content=content, **kw)])[0]
        return result.message_id

    def pump(self, rounds: int = 1000, *, only: str | None = None, skip: str | None = None) -> list[Handed]:
        """Run everything the domains handed over (only the tasks named `only`; none named `skip`,
        as if lost), each as the domain that handed it, until nothing is left."""
        _run_on_commit_since(0)
        return self.dispatcher.pump(rounds=rounds, only=(lambda h: (only is None or h.task == only)
                                                          and (skip is None or h.task != skip)))

    def waiting(self, task: str | None = None) -> list[Handed]:
        return self.dispatcher.tasks(task)

    def deliver(self, recipient: str, *, at: str) -> list[int]:
        """The recipient's home domain marks what it has for it delivered (a fetch, an ACK)."""
        with self.at(at):
            ids = list(Delivery.objects.filter(recipient=recipient, state__in=["pending", "sent", "retrying"])
                       .values_list("id", flat=True))
            deliveries_mark_delivered(delivery_ids=ids)
        return ids

    # --- what a domain holds ---

    def copy(self, domain: str, origin_id: int, origin: str = DOMAINS[0]) -> Message:
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


@contextmanager
def held_by_another_worker(lock_key: str) -> Iterator[None]:
    """Another worker's sender at work on a link (holding `lock_key`) for the block."""
    taken, release = threading.Event(), threading.Event()

    def another_worker() -> None:
        with one_at_a_time(lock_key) as held:
            assert held
            taken.set()
            release.wait(10)

    worker = threading.Thread(target=another_worker)
    worker.start()
    try:
        assert taken.wait(10)
        yield
    finally:
        release.set()
        worker.join()


def _redis_left_forget() -> None:
    """What the played domains leave in the test Redis: "a wake-up is on its way" marks
    (foundation.handoff) and the presence lists heard from other domains (presence.remote, alive
    for a gossip TTL: a later test's master would see those users online)."""
    client = sync_client()
    patterns = (WAKE_KEY.format(here="*", task="*", peer="*"), "sb:rp:*", "sb:rpv:*", "sb:rpd:*")
    keys = [key for pattern in patterns for key in client.scan_iter(pattern)]
    if keys:
        client.delete(*keys)


def _network(handoff, edges: list[tuple[str, str]]):
    links.graph_cache_clear()
    _redis_left_forget()
    with connection.cursor() as cur:
        for domain in DOMAINS[1:]:
            cur.execute(f"DROP SCHEMA IF EXISTS {_schema(domain)} CASCADE; CREATE SCHEMA {_schema(domain)}")
            for table in DOMAIN_TABLES:
                cur.execute(f"CREATE TABLE {_schema(domain)}.{table} (LIKE public.{table} INCLUDING ALL)")
            # LIKE copies no trigger: the standby feed's (migration messaging 0021), as in production.
            cur.execute(f"""
                CREATE TRIGGER messaging_delivery_standby_new AFTER INSERT ON {_schema(domain)}.messaging_delivery
                    REFERENCING NEW TABLE AS standby_new FOR EACH STATEMENT
                    EXECUTE FUNCTION public.messaging_standby_feed_new();
                CREATE TRIGGER messaging_delivery_standby_state AFTER UPDATE ON {_schema(domain)}.messaging_delivery
                    REFERENCING OLD TABLE AS standby_old NEW TABLE AS standby_new FOR EACH STATEMENT
                    EXECUTE FUNCTION public.messaging_standby_feed_state();
                CREATE TRIGGER messaging_subscription_standby_new AFTER INSERT ON {_schema(domain)}.messaging_subscription
                    REFERENCING NEW TABLE AS standby_new FOR EACH STATEMENT
                    EXECUTE FUNCTION public.messaging_standby_feed_subscriptions();
                CREATE TRIGGER messaging_subscription_standby_gone AFTER DELETE ON {_schema(domain)}.messaging_subscription
                    REFERENCING OLD TABLE AS standby_old FOR EACH STATEMENT
                    EXECUTE FUNCTION public.messaging_standby_feed_subscriptions();""")
    app_snapshots_clear()
    domains = {name: Domain.objects.create(name=name, urls=[f"http://{name}.test"]) for name in DOMAINS}
    app = make_app(domain=domains[DOMAINS[0]], range_to=HOMES[DOMAINS[0]][1], max_delivery_attempts=3,
                   public_channel_patterns=["news*"])
    for name, (low, high) in HOMES.items():
        if name != DOMAINS[0]:
            distribution_create(app=app, domain=domains[name], range_from=low, range_to=high)
    app_snapshots_clear()
    network = Network(app=app, links={})
    for a, b in edges:
        network.link(a, b)
    network.dispatcher = _NetDispatcher(network)
    previous_dispatcher = dispatcher_use(network.dispatcher)
    previous_wire = wire_use(_NetWire(network))
    try:
        yield network
    finally:
        wire_use(previous_wire)
        dispatcher_use(previous_dispatcher)
        _redis_left_forget()
        app_snapshots_clear()
        links.graph_cache_clear()
        _search_path(DOMAINS[0])
        with connection.cursor() as cur:
            for domain in DOMAINS[1:]:
                cur.execute(f"DROP SCHEMA IF EXISTS {_schema(domain)} CASCADE")


@pytest.fixture
def net(db, handoff):
    """Four domains in a line of links, 01 - 02 - 03, and 04 linked to nothing yet."""
    yield from _network(handoff, LINE)


@pytest.fixture
def net_ring(db, handoff):
    """Four domains linked as the seed's ring: 01-02, 02-03, 03-04, 01-04."""
    yield from _network(handoff, RING)
