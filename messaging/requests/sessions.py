"""A client's resumable session (docs/protocol.md, "Sessions"): the server issues its id at login
(AUTH_CLIENT_REPLY's `sessionId`), the client presents it again when it reconnects, on any node of
any domain, and the outcomes of the requests it made are pushed to that session only.

An id is `s<random>.<signature>`: the signature (HMAC-SHA256 under SECRET_KEY, over the app, the user
and the random part) binds it to one user of one app, so a node checks a presented id without asking
anyone, a client cannot make one up, and one of another user or app is refused (`wrong_user`). Only
ended sessions are recorded (ClosedSession): CLOSE_SESSION, or not seen for SESSION_TIMEOUT_SECONDS.
Ending one discards the outcomes that waited for it (their deliveries expire, counted) and the
outcomes of its requests answered later are not stored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from messaging.models import UNDELIVERED_STATES, DeliveryState, states_sql
from messaging.requests import metrics
from messaging.requests.models import ClosedSession, RequestState

SESSION_ID_MAX = 40
DISCARDED_ERROR = "discarded: its session ended"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _signature(app_id: str, user_id: str, nonce: str) -> str:
    mac = hmac.new(settings.SECRET_KEY.encode(), f"session:{app_id}:{user_id}:{nonce}".encode(), hashlib.sha256)
    return _b64(mac.digest()[:12])


def client_session_new(*, app_id: str, user_id: str) -> str:
    """A new session id for this user of the app (`app_id`: the app's public appId)."""
    nonce = "s" + _b64(secrets.token_bytes(12))
    return f"{nonce}.{_signature(app_id, user_id, nonce)}"


def client_session_belongs(session: str, *, app_id: str, user_id: str) -> bool:
    """Whether `session` is an id this platform issued to this user of the app."""
    if not isinstance(session, str) or len(session) > SESSION_ID_MAX or session.count(".") != 1:
        return False
    nonce, signature = session.split(".")
    return hmac.compare_digest(signature.encode(), _signature(app_id, user_id, nonce).encode())


def client_session_ended(session: str) -> bool:
    return ClosedSession.objects.filter(session=session).exists()


_DISCARD_SQL = f"""
    UPDATE messaging_delivery d SET state = {states_sql(DeliveryState.EXPIRED)}, expired_at = now(),
           next_attempt_at = NULL, claim = NULL, last_error = %(error)s
      FROM messaging_request r
     WHERE r.session = %(session)s AND r.app_id = %(app)s AND r.message_id IS NOT NULL
       AND d.message_id = r.message_id AND d.recipient = r.user_id AND d.state IN {states_sql(UNDELIVERED_STATES)}
"""


def client_session_end(*, app_pk: int, user_id: str, session: str, reason: str) -> int:
    """End a session (once): the outcomes that wait for it are discarded; returns how many."""
    with transaction.atomic():
        ended, created = ClosedSession.objects.get_or_create(
            session=session, defaults={"app_id": app_pk, "user_id": user_id, "reason": reason,
                                       "closed_at": timezone.now()})
        if not created:
            return 0
        with connection.cursor() as cur:
            cur.execute(_DISCARD_SQL, {"error": DISCARDED_ERROR, "session": session, "app": app_pk})
            discarded = cur.rowcount
        ended.discarded = discarded
        ended.save(update_fields=["discarded"])
    metrics.SESSION_OUTCOMES_DISCARDED.inc(discarded)
    return discarded


_IDLE_SQL = f"""
    WITH candidates AS (
        SELECT r.session, r.app_id, r.user_id, max(r.created_at) AS last_request
          FROM messaging_request r
          LEFT JOIN messaging_delivery d ON d.message_id = r.message_id AND d.recipient = r.user_id
         WHERE r.session <> ''
           AND (r.state = '{RequestState.WAITING.value}' OR d.state IN {states_sql(UNDELIVERED_STATES)})
           AND NOT EXISTS (SELECT 1 FROM messaging_closedsession c WHERE c.session = r.session)
         GROUP BY r.session, r.app_id, r.user_id
    )
    SELECT c.session, c.app_id, c.user_id FROM candidates c
     WHERE c.last_request < now() - make_interval(secs => %(idle)s)
       AND NOT EXISTS (SELECT 1 FROM presence_session s WHERE s.client_session = c.session
                        AND (s.disconnected_at IS NULL OR s.disconnected_at > now() - make_interval(secs => %(idle)s)))
     LIMIT %(limit)s
"""


def client_sessions_time_out(*, limit: int = 1000) -> int:
    """Beat: sessions with outcomes (or requests) still waiting that nobody has used for
    SESSION_TIMEOUT_SECONDS (no connection of theirs open or closed since, no request made since)
    end as `timeout`. Returns how many ended."""
    with connection.cursor() as cur:
        cur.execute(_IDLE_SQL, {"idle": settings.SESSION_TIMEOUT_SECONDS, "limit": limit})
        idle = cur.fetchall()
    for session, app_pk, user_id in idle:
        client_session_end(app_pk=app_pk, user_id=user_id, session=session, reason="timeout")
    return len(idle)
