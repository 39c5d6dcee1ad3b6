"""Webhook endpoints of an app (create, delete; listing is in selectors), and recording events for
them.

Recording is one statement per batch of events: it joins the events with the app's enabled
endpoints that want them (the database decides who gets what, whatever a process's cache
believes), writes one WebhookDelivery per event and endpoint with its complete body, and, once
committed, hands them over (foundation.handoff.webhook_calls_hand_over: one task for the whole batch,
whose worker gives each call a Celery task of its own) under a claim with a lease
(messaging.webhooks.delivery): a task lost with its worker is made up for by the sweep when the
lease runs out.

Recording joins the caller's transaction. A web node records user.connected and user.disconnected
in the transaction that opens or closes the session (messaging.gateway.connection.admission), so a batch of
logins costs one statement and one hand-off, and an event commits with its session or not at all.
Events that happen in a process that crashes before recording them (a channel's first reader, a
stale entry the heartbeat drops) are not announced. Once recorded, a call is made until it is
delivered or dead.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import connection, transaction
from django.utils import timezone

from foundation.asyncdb import run_db
from foundation.handoff import webhook_calls_hand_over
from foundation.outbound import claim_token
from foundation.outgoing import address_refusal, allowed_networks
from messaging.webhooks import metrics
from messaging.webhooks.delivery import Claimed, webhook_lease_seconds
from messaging.webhooks.inline import InlineCall
from messaging.webhooks.models import (
    PUSHER_EVENT_PREFIX,
    WEBHOOK_ALL_EVENTS,
    WEBHOOK_NAMEABLE_EVENTS,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    WebhookState,
    webhook_states_sql,
)
from messaging.webhooks.selectors import webhook_events_forget, webhook_events_wanted, webhook_events_wanted_cached

log = logging.getLogger(__name__)
URL_MAX = 500


@dataclass(frozen=True)
class WebhookNotice:
    """Something that happened to one app, for its endpoints that want `event`."""

    app_id: int
    event: str
    data: dict[str, Any]


# --- endpoints -----------------------------------------------------------------------------------


def webhook_url_validate(url: str) -> None:
    """https:// (or http:// where WEBHOOKS_ALLOW_HTTP is on), an absolute URL, at most 500 characters,
    not an address outside the public internet and OUTGOING_ALLOWED_NETWORKS."""
    schemes = ["https", "http"] if settings.WEBHOOKS_ALLOW_HTTP else ["https"]
    if not isinstance(url, str) or len(url) > URL_MAX:
        raise ValidationError({"url": f"A URL of at most {URL_MAX} characters."})
    if url.lower().startswith("http://") and not settings.WEBHOOKS_ALLOW_HTTP:
        raise ValidationError({"url": "Webhook endpoints must use https:// (plain http:// is off on this platform)."})
    try:
        URLValidator(schemes=schemes)(url)
    except ValidationError:
        raise ValidationError({"url": f"Not a valid {' or '.join(s + '://' for s in schemes)} URL."}) from None
    _address_check(url)


def _address_check(url: str) -> None:
    """An address literal the platform would refuse to call is refused at once; a host name is
    resolved and checked at every call (foundation.outgoing), where its answer may differ."""
    host = (urlsplit(url).hostname or "").strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return
    reason = address_refusal(host, allowed_networks())
    if reason:
        raise ValidationError({"url": f"Not called: {reason}."})


def webhook_events_clean(events: Sequence[str] | None) -> list[str]:
    """The events an endpoint wants: known names, no repeats; none given (or "*") means all."""
    if events is None:
        return [WEBHOOK_ALL_EVENTS]
    if isinstance(events, str) or not all(isinstance(e, str) for e in events):
        raise ValidationError({"events": "A list of event names."})
    unknown = sorted(set(events) - {*WEBHOOK_NAMEABLE_EVENTS, WEBHOOK_ALL_EVENTS})
    if unknown:
        raise ValidationError({"events": f"Unknown event(s) {', '.join(unknown)}; known: "
                                         f"{', '.join(WEBHOOK_NAMEABLE_EVENTS)} (or {WEBHOOK_ALL_EVENTS})."})
    if not events or WEBHOOK_ALL_EVENTS in events:  # ("*" is every Switchboard event; Pusher's are named)
        return [WEBHOOK_ALL_EVENTS, *(e for e in dict.fromkeys(events) if e.startswith(PUSHER_EVENT_PREFIX))]
    return list(dict.fromkeys(events))


def webhook_endpoint_create(*, app_id: int, url: str, events: Sequence[str] | None = None, description: str = "",
                            enabled: bool = True) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint of the app; returns it and its signing secret (show the secret once:
    nothing shows it again). Raises ValidationError naming the bad field."""
    webhook_url_validate(url)
    endpoint = WebhookEndpoint.objects.create(app_id=app_id, url=url, events=webhook_events_clean(events),
                                              description=(description or "")[:200], enabled=enabled)
    transaction.on_commit(lambda: webhook_events_forget(app_id))
    return endpoint, endpoint.secret


def webhook_endpoint_delete(*, app_id: int, endpoint_id: int) -> bool:
    """Remove one of the app's endpoints with its delivery records; False if the app has no such
    endpoint (another app's endpoint is never touched)."""
    deleted, _ = WebhookEndpoint.objects.filter(app_id=app_id, pk=endpoint_id).delete()
    transaction.on_commit(lambda: webhook_events_forget(app_id))
    return bool(deleted)


# --- recording -----------------------------------------------------------------------------------

# A call's body (docs/webhooks.md, "The call"): the delivery's own id, the event, the app's appId, when
# it was recorded and the event's data; `event` is the SQL that names the event.
def _envelope(event: str) -> str:
    return (f"jsonb_build_object('id', id::text, 'event', {event}, 'app', app_key, "
            f"'created', floor(extract(epoch FROM now()))::bigint, 'data', data)")


_RECORD_SQL = f"""
    WITH notice AS (
        SELECT * FROM unnest(%(apps)s::bigint[], %(events)s::text[], %(data)s::jsonb[]) AS t(app_id, event, data)
    ), fresh AS MATERIALIZED (
        SELECT gen_random_uuid() AS id, e.id AS endpoint_id, n.event, n.data, a.app_id AS app_key
          FROM notice n
          JOIN messaging_webhookendpoint e
            ON e.app_id = n.app_id AND e.enabled
               AND (('{WEBHOOK_ALL_EVENTS}' = ANY(e.events) AND n.event NOT LIKE '{PUSHER_EVENT_PREFIX}%%')
                    OR n.event = ANY(e.events))
          JOIN apps_registry_clientapp a ON a.id = n.app_id
           FOR KEY SHARE OF e
    )
    INSERT INTO messaging_webhookdelivery (id, endpoint_id, event, payload, state, attempts, next_attempt_at, claim,
                                           last_status, last_error, created_at)
    SELECT id, endpoint_id, event, {_envelope("event")},
           {webhook_states_sql(WebhookState.PENDING)}, 0, now() + make_interval(secs => %(lease)s), %(claim)s,
           NULL, '', now()
      FROM fresh
    RETURNING id, event
"""


def webhooks_record(*, notices: Sequence[WebhookNotice]) -> int:
    """Record the notices for every enabled endpoint of their apps that wants them, in one
    statement, in the caller's transaction if there is one; they are handed over together once
    committed. Returns how many deliveries were recorded. Notices of apps without endpoints for them
    cost no query (selectors' cache).

    The endpoints are locked FOR KEY SHARE as they are read (the lock the deliveries' foreign key
    takes at commit anyway, taken first): an endpoint an operator is deleting is waited for and then
    left out, where its deliveries would have failed the caller's whole transaction at commit (the
    key is checked then), a web node's batch of sessions with it."""
    wanted = [n for n in notices if n.event in webhook_events_wanted(n.app_id)]
    if not wanted:
        return 0
    claim = claim_token()
    with connection.cursor() as cur:
        cur.execute(_RECORD_SQL, {
            "apps": [n.app_id for n in wanted], "events": [n.event for n in wanted],
            "data": [json.dumps(n.data, ensure_ascii=False) for n in wanted],
            "lease": webhook_lease_seconds(), "claim": claim,
        })
        rows = cur.fetchall()
    for event, count in Counter(event for _, event in rows).items():
        metrics.WEBHOOKS.labels(event, "recorded").inc(count)
    ids = [row[0] for row in rows]
    if ids:
        transaction.on_commit(lambda: webhook_calls_hand_over(ids, claim))
    return len(ids)


@dataclass(frozen=True)
class EndpointCall:
    """A call to one request endpoint's webhook (request.received: messaging.requests)."""

    request_endpoint_id: int
    data: dict[str, Any]


_RECORD_CALLS_SQL = f"""
    WITH call AS (
        SELECT * FROM unnest(%(endpoints)s::bigint[], %(data)s::jsonb[]) AS t(request_endpoint_id, data)
    ), fresh AS MATERIALIZED (
        SELECT gen_random_uuid() AS id, r.id AS request_endpoint_id, c.data, a.app_id AS app_key, r.app_id,
               r.webhook_url, r.webhook_secret
          FROM call c
          JOIN apps_registry_requestendpoint r ON r.id = c.request_endpoint_id AND r.webhook_url <> ''
          JOIN apps_registry_clientapp a ON a.id = r.app_id
           FOR KEY SHARE OF r
    ), recorded AS (
        INSERT INTO messaging_webhookdelivery (id, request_endpoint_id, event, payload, state, attempts,
                                               next_attempt_at, claim, last_status, last_error, created_at)
        SELECT id, request_endpoint_id, %(event)s, {_envelope("%(event)s::text")},
               {webhook_states_sql(WebhookState.PENDING)}, 0, now() + make_interval(secs => %(lease)s), %(claim)s,
               NULL, '', now()
          FROM fresh
        RETURNING id, payload
    )
    SELECT recorded.id, recorded.payload, fresh.app_id, fresh.webhook_url, fresh.webhook_secret
      FROM recorded JOIN fresh USING (id)
"""


def webhook_endpoint_calls_record(*, calls: Sequence[EndpointCall], inline: bool = False) -> list[InlineCall]:
    """Record request.received calls to request endpoints' webhooks, in the caller's transaction, in
    the usual envelope, then sent, retried and dead-lettered like every webhook call: handed over
    once committed, or (`inline`) returned for the caller to make the first attempt itself once
    committed (messaging.webhooks.inline). (Locked FOR KEY SHARE as webhooks_record's endpoints are.)"""
    if not calls:
        return []
    claim = claim_token()
    event = WebhookEvent.REQUEST_RECEIVED.value
    with connection.cursor() as cur:
        cur.execute(_RECORD_CALLS_SQL, {
            "endpoints": [c.request_endpoint_id for c in calls],
            "data": [json.dumps(c.data, ensure_ascii=False) for c in calls],
            "event": event, "lease": webhook_lease_seconds(), "claim": claim,
        })
        rows = cur.fetchall()
    metrics.WEBHOOKS.labels(event, "recorded").inc(len(rows))
    if rows and not inline:
        ids = [row[0] for row in rows]
        transaction.on_commit(lambda: webhook_calls_hand_over(ids, claim))
        return []
    return [InlineCall(delivery_id=str(delivery_id), claim=claim,
                       call=Claimed(app_id=app_id, url=url, secret=secret, event=event,
                                    payload=payload if isinstance(payload, dict) else json.loads(payload), attempts=0))
            for delivery_id, payload, app_id, url, secret in rows]


async def webhooks_record_async(*, notices: Sequence[WebhookNotice]) -> int:
    """From an event loop: nothing at all (not even a thread hop) when the cache knows that no
    endpoint wants these notices; otherwise recorded on the database pool."""
    if not any(webhook_notice_maybe_wanted(n) for n in notices):
        return 0
    return await run_db(webhooks_record, notices=notices)


def webhook_notice_maybe_wanted(notice: WebhookNotice) -> bool:
    """Whether an endpoint may want the notice, from the cache alone (no I/O, safe on an event loop):
    False only when the cache knows that none of the app's endpoints wants it."""
    known = webhook_events_wanted_cached(notice.app_id)
    return known is None or notice.event in known


def webhook_test_send(*, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """A `webhook.test` call to this one endpoint (whatever its events, even while disabled): the
    console's "send a test event"."""
    now = timezone.now()
    delivery_id = uuid.uuid4()
    claim = claim_token()
    payload = {"id": str(delivery_id), "event": WebhookEvent.TEST.value, "app": endpoint.app.app_id,
               "created": int(now.timestamp()),
               "data": {"endpoint": endpoint.pk, "detail": "a test event sent from the Switchboard console"}}
    delivery = WebhookDelivery.objects.create(
        id=delivery_id, endpoint=endpoint, event=WebhookEvent.TEST, payload=payload, claim=claim,
        next_attempt_at=now + timedelta(seconds=webhook_lease_seconds()), created_at=now)
    metrics.WEBHOOKS.labels(WebhookEvent.TEST.value, "recorded").inc()
    transaction.on_commit(lambda: webhook_calls_hand_over([delivery_id], claim))
    return delivery


def webhook_deliveries_requeue(*, delivery_ids: Sequence[uuid.UUID | str], app_id: int | None = None) -> int:
    """Dead webhook deliveries get a fresh set of attempts and are sent again (`app_id` confines
    the action to one app's rows, for an API caller)."""
    claim = claim_token()
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery w
               SET state = {webhook_states_sql(WebhookState.PENDING)}, attempts = 0, dead_at = NULL, claim = %s,
                   next_attempt_at = now() + make_interval(secs => %s), last_error = 're-queued by an operator'
              FROM messaging_webhookendpoint e
             WHERE w.id = ANY(%s::uuid[]) AND w.state = {webhook_states_sql(WebhookState.DEAD)}
               AND e.id = w.endpoint_id AND (%s::bigint IS NULL OR e.app_id = %s)
            RETURNING w.id
            """,
            [claim, webhook_lease_seconds(), [str(i) for i in delivery_ids], app_id, app_id],
        )
        ids = [row[0] for row in cur.fetchall()]
    if ids:
        transaction.on_commit(lambda: webhook_calls_hand_over(ids, claim))
    return len(ids)
