"""/metrics of a web node: what it counted (messaging.core.metrics, messaging.webhooks.metrics, and
every figure registered in foundation.metrics.REGISTRY) and the cluster-wide figures read at scrape
time: the dead-letter count from Postgres through its partial index, the messages held in order,
each link's state, the standby copy's lag, takeovers, the webhook backlog and the queue intake.

Outside DEBUG the endpoint answers only a scraper that shows METRICS_TOKEN (as a Bearer token) or
comes from METRICS_ALLOWED_IPS; anyone else gets 403 (the figures describe who is online).
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from apps_registry.models import Takeover
from foundation.metrics import REGISTRY
from messaging.federation.selectors import LinkState, link_states
from messaging.federation.standby.copy import copy_lag
from messaging.intake.stream.metrics import QUEUE_STATS
from messaging.models import DeliveryState, states_sql
from messaging.requests.metrics import REQUESTS_COLLECTOR
from messaging.webhooks.selectors import webhook_backlog

DEAD_LETTERS = Gauge("switchboard_dead_letters", "Deliveries in the dead-letter queue (cluster-wide)",
                     registry=REGISTRY)


HELD_IN_ORDER = Gauge("switchboard_network_held_in_order",
                      "Messages stored here that wait for an earlier one from their origin domain", registry=REGISTRY)
HELD_OLDEST = Gauge("switchboard_network_held_in_order_oldest_seconds",
                    "How long the oldest message held in order has waited (0: none)", registry=REGISTRY)
STANDBY_LAG = Gauge("switchboard_standby_copy_lag_seconds",
                    "How long the oldest change not yet copied to a standby domain has waited (0: none)",
                    ["standby"], registry=REGISTRY)
STANDBY_WAITING = Gauge("switchboard_standby_copy_waiting",
                        "Changes of this domain's users' mailboxes not yet copied to their standby domain",
                        ["standby"], registry=REGISTRY)
_STANDBYS_SEEN: set[str] = set()
TAKEOVER_HELD = Gauge("switchboard_takeover_held",
                      "1 while `holder` serves the users of domain `home` it stands by for (a takeover), else 0",
                      ["home", "holder"], registry=REGISTRY)
TAKEOVER_TAKEN = Gauge("switchboard_takeover_last_taken_timestamp_seconds",
                       "When `holder` last took over `home`'s users it stands by for (unix time)", ["home", "holder"],
                       registry=REGISTRY)
TAKEOVER_RETURNED = Gauge("switchboard_takeover_last_returned_timestamp_seconds",
                          "When `holder` last handed `home`'s users back (unix time; 0: held now)",
                          ["home", "holder"], registry=REGISTRY)
WEBHOOK_BACKLOG = Gauge("switchboard_webhook_deliveries",
                        "Webhook deliveries not delivered (pending, retrying) or dead, cluster-wide", ["state"],
                        registry=REGISTRY)


class _LinkCollector:
    """Each link's state and what was forwarded over it, as this domain sees it. Read from LinkHealth
    at scrape time (metrics_view): the counts are kept by the workers that send and the web nodes
    that receive, in the table, so any web node of the domain reports the same figures."""

    def __init__(self) -> None:
        self.states: list[LinkState] = []

    def _families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (GaugeMetricFamily("switchboard_link_up", "1 while the link to a neighbouring domain is enabled and "
                                  "answers, 0 while it is down, disabled or not called yet", labels=["peer"]),
                CounterMetricFamily("switchboard_link_forwarded", "Items forwarded over the link to a neighbouring "
                                    "domain, by direction (out, in)", labels=["peer", "direction"]))

    def describe(self):
        return list(self._families())

    def collect(self):
        up, forwarded = self._families()
        for state in self.states:
            up.add_metric([state.peer], 1.0 if state.up else 0.0)
            health = state.health
            forwarded.add_metric([state.peer, "out"], health.forwarded_out if health else 0)
            forwarded.add_metric([state.peer, "in"], health.forwarded_in if health else 0)
        yield up
        yield forwarded


LINKS = _LinkCollector()
REGISTRY.register(LINKS)
REGISTRY.register(REQUESTS_COLLECTOR)  # requests waiting, their outcomes and latency, read from Postgres
REGISTRY.register(QUEUE_STATS)  # the queue intake's counts and gates, read from Redis at scrape time


def _scraper_allowed(request: HttpRequest) -> bool:
    if settings.DEBUG:
        return True
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    # Compared as bytes: compare_digest refuses (raises on) a str that is not ASCII, and a header is
    # whatever the client sent.
    if token and header.startswith("Bearer ") and hmac.compare_digest(
            header[7:].strip().encode(errors="surrogatepass"), token.encode(errors="surrogatepass")):
        return True
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(net, strict=False) for net in settings.METRICS_ALLOWED_IPS)


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _scraper_allowed(request):
        return JsonResponse({"error": "forbidden", "detail": "metrics need METRICS_TOKEN or an allowed address"},
                            status=403)
    with connection.cursor() as cur:
        # served by the partial index delivery_dead_letters
        cur.execute(f"SELECT count(*) FROM messaging_delivery WHERE state = {states_sql(DeliveryState.DEAD)}")
        DEAD_LETTERS.set(cur.fetchone()[0])
        cur.execute("SELECT count(*), coalesce(extract(epoch FROM now() - min(held_at)), 0) FROM messaging_heldinorder")
        held, oldest = cur.fetchone()
        HELD_IN_ORDER.set(held)
        HELD_OLDEST.set(float(oldest))
    for state, count in webhook_backlog().items():
        WEBHOOK_BACKLOG.labels(state).set(count)
    LINKS.states = link_states()
    REQUESTS_COLLECTOR.refresh()
    lag = copy_lag()
    _STANDBYS_SEEN.update(lag)
    for standby in sorted(_STANDBYS_SEEN):  # one caught up reads 0, not its last lag
        waiting, seconds = lag.get(standby, (0, 0.0))
        STANDBY_LAG.labels(standby).set(seconds)
        STANDBY_WAITING.labels(standby).set(waiting)
    for home, holder, held, taken, returned in Takeover.objects.values_list(
            "home__name", "holder__name", "held", "taken_at", "returned_at"):
        TAKEOVER_HELD.labels(home, holder).set(1 if held else 0)
        TAKEOVER_TAKEN.labels(home, holder).set(taken.timestamp())
        TAKEOVER_RETURNED.labels(home, holder).set(returned.timestamp() if returned and not held else 0)
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
