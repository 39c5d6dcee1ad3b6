"""One /ws connection's life: authenticate -> presence -> session row, and every way out of it.

`admit` runs AUTH_CLIENT's steps in order, and gives back whatever it took when a later step
refuses: a draining node (foundation.draining, 1012), the app's auth mode (messaging.gateway.authentication), the node's own list of connections, the
cluster's presence (which refuses a user's connection beyond the app's limit, or a node declared
dead), the session row. `end` runs once on every way out (a clean close, a crash in a handler, a
cancellation) and settles, in order: the node's list, the user's delivery budget, the channels read,
what the connection held but its client never got (back to the mailbox), presence (and the master's
USER_DISCONNECTED where it was the user's last connection), the session row.

A login can be cancelled half-way: its client leaves while the login waits (a slow auth URL, a
busy database), and daphne cancels a consumer that outlives its client by its application close
timeout. Once the node's list has the connection, `admit`'s steps (presence, the session row) run as
a task of their own that a cancellation of its caller does not stop (each step is under way in a
batcher, which carries it out whether or not anyone waits for it); `end` waits for that task and
gives back whatever it took, as for any connection. So a client that leaves during its login is
never left online, and never keeps a connection slot.

The presence entry and the session row go through the node's batchers (messaging.gateway.connection.admission:
one Redis pipeline, one transaction per batch of connections), each step still waited for, so the
order and the give-backs above hold exactly as they would one connection at a time. The session's
id is made here, so its row is written in the same batch as its neighbours' without a round trip
for the id. Where presence says the connection is the user's first (or last) in the cluster, the
app's user.connected (user.disconnected) webhook event goes with the session row, committed in its
transaction; the master user is told by the caller (admitted) or here (end), as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from django.utils import timezone

from apps_registry.selectors import AppSnapshot, app_snapshot
from foundation.asyncdb import run_db
from foundation.draining import DRAINING_REASON, draining
from foundation.transport.frames import CLOSE_POLICY, CLOSE_RESTART, CLOSE_TRY_AGAIN
from messaging.channels.cursor import ChannelCursor
from messaging.core.presence_notices import master_announce, user_presence_notice_wanted
from messaging.gateway.authentication import client_authenticate
from messaging.gateway.connection.admission import SessionEnd, SessionOpen
from messaging.gateway.connection.ledger import DeliveryLedger, Settled
from messaging.gateway.limits import ConnectionLimits, TokenBucket
from messaging.gateway.runtime import LocalConnection, NodeRuntime, runtime
from presence import cache
from presence.services import SessionClosing, SessionOpening

log = logging.getLogger(__name__)
APP_REFRESH_SECONDS = 5.0


@dataclass(frozen=True)
class Refusal:
    reason: str
    code: int  # the close code
    redirect: str | None = None  # AUTH_CLIENT_REPLY's `redirect`: the user's home domain's WebSocket URL


class ConnectionLife:
    def __init__(self, *, channel_name: str, close: Callable[[int, str], Awaitable[None]]) -> None:
        self.channel_name = channel_name
        self.close = close
        self.node: NodeRuntime = runtime()
        self.app: AppSnapshot | None = None
        self.user_id: str | None = None
        self.authenticated = False  # from AUTH_CLIENT admitted on: app and user_id are set
        self.acks = False
        self.session_id: uuid.UUID | None = None  # this connection's presence row
        self.client_session = ""  # the client's resumable session (sessionId), once admitted
        self.limits = ConnectionLimits.preauth()
        self.user_bucket: TokenBucket | None = None
        self.close_note = ""  # why it ended, for the session row
        self._app_loaded_at = 0.0
        self._registering: asyncio.Task | None = None  # admit's steps from the node's list on

    async def admit(self, *, app_id: str, user_id: str, token: str, acks: bool, origin: str | None,
                    remote_addr: str, user_agent: str, client_session: str = "") -> Refusal | bool:
        """AUTH_CLIENT: True when this is the user's first connection in the cluster, False when it
        has others; a Refusal (nothing kept) otherwise."""
        if draining():  # a socket opened before the node stopped listening: no new session here
            return Refusal(DRAINING_REASON, CLOSE_RESTART)
        outcome = await client_authenticate(app_id=app_id, user_id=user_id, token=token, origin=origin)
        if not outcome.ok:
            return Refusal(outcome.reason, CLOSE_TRY_AGAIN if outcome.retry else CLOSE_POLICY, outcome.redirect)
        node, app = self.node, outcome.app
        await node.ensure_started()
        # Shielded: a cancellation here (the client left) lets the steps finish; `end` gives them back.
        self._registering = asyncio.ensure_future(self._register(
            app=app, user_id=user_id, acks=acks, remote_addr=remote_addr, user_agent=user_agent,
            client_session=client_session))
        return await asyncio.shield(self._registering)

    async def _register(self, *, app: AppSnapshot, user_id: str, acks: bool, remote_addr: str,
                        user_agent: str, client_session: str) -> Refusal | bool:
        """admit's steps that take something (`end` gives it back): the node's list, presence, the
        session row; each refusal gives back what the steps before it took."""
        node = self.node
        node.connection_add(self.channel_name, LocalConnection(user_id=user_id, app_id=app.pk, acks=acks,
                                                               close=self.close, session=client_session))
        entry = cache.ConnectionEntry(user_id=user_id, channel_name=self.channel_name, node_id=node.node_id,
                                      acks=acks, limit=app.max_connections_per_user, session=client_session)
        try:
            first = await node.presence_adds.submit(entry)
        except cache.TooManyConnections as exc:
            node.connection_remove(self.channel_name)
            return Refusal(f"too many connections for this user (limit {exc.limit})", CLOSE_POLICY)
        except cache.NodeDeclaredDead:
            node.connection_remove(self.channel_name)
            return Refusal("this node is restarting; reconnect", CLOSE_RESTART)
        except Exception:
            node.connection_remove(self.channel_name)
            log.exception("registering %s in presence failed", user_id)
            return Refusal("service unavailable; reconnect later", CLOSE_TRY_AGAIN)
        session_id = uuid.uuid4()
        try:
            await node.sessions_opened.submit(SessionOpen(SessionOpening(
                connection_id=session_id, app_id=app.pk, user_id=user_id, node_id=node.node_id,
                channel_name=self.channel_name, acks=acks, remote_addr=remote_addr, user_agent=user_agent,
                connected_at=timezone.now(), client_session=client_session),
                notice=user_presence_notice_wanted(app_id=app.pk, user_id=user_id, connected=True) if first else None))
        except Exception:
            log.exception("opening the session row of %s failed", user_id)
            node.connection_remove(self.channel_name)
            await node.presence_removes.submit(entry)
            return Refusal("service unavailable; reconnect later", CLOSE_TRY_AGAIN)
        self.session_id = session_id
        self.client_session = client_session
        self.app, self.user_id, self.acks, self._app_loaded_at = app, user_id, acks, time.monotonic()
        self.authenticated = True
        self.limits = ConnectionLimits.for_app(app.rate_limit_per_second, app.rate_limit_burst)
        self.user_bucket = node.work_limits.attach((app.pk, user_id), app.deliveries_per_second, app.deliveries_burst)
        return first

    async def current_app(self) -> AppSnapshot:
        """The app, re-read every APP_REFRESH_SECONDS: an operator's change reaches open connections."""
        if time.monotonic() - self._app_loaded_at > APP_REFRESH_SECONDS:
            fresh = await run_db(app_snapshot, self.app.app_name)
            if fresh is not None:
                self.app = fresh
            self._app_loaded_at = time.monotonic()
        return self.app

    async def end(self, *, ledger: DeliveryLedger | None, channels: ChannelCursor | None,
                  position: int | None) -> None:
        """The connection is gone (`position`: the bytes its socket had flushed). Called once (the
        consumer's end, messaging.gateway.connection.inbox)."""
        registering = self._registering
        if registering is not None and not registering.done():
            # The client left during its login: the login's steps finish, then are given back below.
            await asyncio.wait({registering})
            self.close_note = self.close_note or "client left during login"
            if not registering.cancelled() and registering.exception() is not None:
                log.error("the login of a client that left failed", exc_info=registering.exception())
        if not self.authenticated:
            return
        node = self.node
        node.connection_remove(self.channel_name)
        node.work_limits.detach((self.app.pk, self.user_id))
        if channels is not None:
            await channels.leave_all()
        if ledger is not None:
            self.settle(ledger.close(position))
        notice = None
        try:
            last = await node.presence_removes.submit(cache.ConnectionEntry(
                user_id=self.user_id, channel_name=self.channel_name, node_id=node.node_id))
            if last:
                notice = user_presence_notice_wanted(app_id=self.app.pk, user_id=self.user_id, connected=False)
                await master_announce(app=self.app, user_id=self.user_id, connected=False,
                                      lookup=node.master_lookups.submit)
        except Exception:
            # Redis is away: this node's heartbeat removes the stale entry (and announces) later.
            log.exception("presence update on disconnect of %s failed", self.user_id)
        if self.session_id is not None:
            try:
                await node.sessions_closed.submit(SessionEnd(SessionClosing(
                    connection_id=self.session_id, close_reason=self.close_note or "connection failed"),
                    notice=notice))
            except Exception:
                log.exception("closing session row of %s failed", self.user_id)

    def settle(self, settled: Settled) -> None:
        """Hand what the ledger settled to the node's batchers."""
        if settled.delivered:
            self.node.delivered.add(settled.delivered)
        if settled.released:
            self.node.released.add(settled.released)
