"""Presence across the network: each domain tells its neighbours who of its apps' users is online,
and passes on what it heard of the others (presence.remote keeps it), so the app's master user,
wherever it connects, is told about its users on every domain.

`presence_gossip` (every PRESENCE_GOSSIP_SECONDS, messaging.federation.control_loop) sends each
neighbour, over every enabled link (a liveness-only one too), one call with, per app that has a master user, this domain's online users (numbered with its clock,
so newer replaces older however it travelled) and every other domain's list it holds, except the
neighbour's own. `presence_accept` (the forward endpoint's `presence` items) takes the newer lists,
and tells the app's master connections here who arrived and who left (USER_CONNECTED /
USER_DISCONNECTED, checked against the list when they are written, as local notices are).

Best effort, like FAST: a call that fails is not retried (the next round says it all again). A
notice from another domain reaches the master within about PRESENCE_GOSSIP_SECONDS per hop; a
domain that goes silent has its users reported gone after PRESENCE_REMOTE_TTL_SECONDS (by the
master connection's re-check, presence.master_view).
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

from apps_registry.models import ClientApp
from foundation.logs import loggable
from messaging.federation.takeover.liveness import domain_serves
from messaging.federation.takeover.records import network_gossip
from messaging.federation.wire.transport import (
    FORWARD_PATH,
    PeerError,
    liveness_peers,
    peer_call_prepare,
    peer_calls_send,
)
from presence import remote
from presence.online import app_online_users_sync
from presence.services import master_notify_many_sync

log = logging.getLogger(__name__)

MAX_USERS = 100_000  # per list in one call


def presence_gossip() -> dict[str, str]:
    """One round: every neighbour told what this domain knows (and, with it, the network's clocks and
    takeovers: messaging.federation.takeover.take). Returns {peer: "ok" or the error}."""
    here = settings.DOMAIN_NAME
    peers = liveness_peers()  # (over liveness-only links too: the gossip is the network's liveness)
    if not peers:
        return {}
    apps = sorted(ClientApp.objects.exclude(master_user_id="").values_list("app_name", flat=True))
    lists: list[tuple[str, remote.RemoteList]] = []
    for app_name in apps:
        lists.append((app_name, remote.RemoteList(here, time.time_ns(), app_online_users_sync(app_name)[:MAX_USERS])))
        lists += [(app_name, heard) for heard in remote.remote_lists(app_name)]
    calls, out = [], {}
    network = network_gossip(speaking=domain_serves())
    for peer in peers:
        items = [{"app": app_name, "domain": heard.domain, "version": heard.version, "users": heard.users}
                 for app_name, heard in lists if heard.domain != peer]
        try:
            calls.append(peer_call_prepare(peer=peer, path=FORWARD_PATH, payload={"presence": items,
                                                                                  "network": network}))
        except PeerError as exc:
            out[peer] = exc.reason
    for call, answer in zip(calls, peer_calls_send(calls, timeout=settings.LINK_PROBE_TIMEOUT_SECONDS), strict=True):
        out[call.peer] = answer.reason if isinstance(answer, PeerError) else "ok"
        if isinstance(answer, dict) and answer.get("takeovers_refused"):
            # (messaging.federation.takeover.take.record_refusal: this domain holds records its neighbour will not take)
            log.warning("%s refused takeover records %s told it: %s", call.peer, here,
                        loggable(answer["takeovers_refused"], 1000))
    return out


class PresenceRefused(ValueError):
    pass


def presence_parse(index: int, item) -> dict:
    where = f"presence[{index}]"
    if not isinstance(item, dict) or set(item) != {"app", "domain", "version", "users"}:
        raise PresenceRefused(f"{where} must be an object with app, domain, version and users")
    app, domain, version, users = item["app"], item["domain"], item["version"], item["users"]
    if not all(isinstance(name, str) and 0 < len(name) <= 64 for name in (app, domain)):
        raise PresenceRefused(f"{where}: app and domain must be names")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise PresenceRefused(f"{where}: version must be a whole number")
    if (not isinstance(users, list) or len(users) > MAX_USERS
            or not all(isinstance(u, str) and u and len(u) <= 96 for u in users)):
        raise PresenceRefused(f"{where}: users must be a list of at most {MAX_USERS} user ids")
    return item


def presence_accept(items: list[dict]) -> int:
    """Take the newer lists among `items` (parsed), and tell the apps' master connections here what
    changed. Returns how many lists were newer."""
    here = settings.DOMAIN_NAME
    masters = dict(ClientApp.objects.filter(app_name__in={i["app"] for i in items})
                   .exclude(master_user_id="").values_list("app_name", "master_user_id"))
    taken = 0
    for item in items:
        master = masters.get(item["app"])
        if master is None or item["domain"] == here:
            continue
        applied = remote.remote_apply(app_name=item["app"], domain=item["domain"], version=item["version"],
                                      users=item["users"], ttl=int(settings.PRESENCE_REMOTE_TTL_SECONDS))
        if not applied.applied:
            continue
        taken += 1
        notices = [("USER_DISCONNECTED", u) for u in applied.left] + [("USER_CONNECTED", u) for u in applied.arrived]
        master_notify_many_sync(master_user_id=master, notices=notices, domain=item["domain"])
    return taken
