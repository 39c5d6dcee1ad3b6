"""Channel publishes flooded to every domain: what a domain does with the publishes a neighbour sends.

A publish is stored on the domain where it is made and queued, in the same transaction, to each
neighbour over an enabled link (messaging.channels.services.channel_publish). Each link's sender
(messaging.federation.senders.flood_sender) passes the queue on in order. A domain that receives a publish
stores it in its own history under its own next offset (once: channel_publish_forwarded_once on
(channel, origin domain, origin offset)), fans it out to the readers connected to it, and, if it
was new here, queues it on to every neighbour except the one it came from and the domains it has
already passed through. A publish therefore reaches every domain the network connects, by every
path, and is stored once per domain; the first copy to arrive wins and later ones are duplicates.

Offsets are each domain's own: a reader resumes (`since`) from the history of the domain it reads
on, which holds every publish of the channel, local or flooded, in the order it arrived there.
Publishes of one origin keep their order everywhere (each link sends in queue order, one call at a
time, and a domain queues on what it stored in the order it stored it).

The call (`POST /internal/v1/publishes`, signed, messaging.federation.wire.transport):

    {"publishes": [{"app": "ANZ", "channel": "news", "content": "...", "publisher": "ANZ-1",
                    "origin_domain": "domain-01", "origin_offset": 42,
                    "path": ["domain-01", "domain-02"]}, ...]}

`path` is the domains the publish passed through, origin first, ending with the caller. The answer
is `{"stored": n, "duplicates": m, "refused": [{"index": i, "reason": "..."}]}`: a publish this
domain cannot take (its app unknown here, a channel or content the app refuses) is refused alone
and the rest stored; a malformed call (400) or one over the hop limit or with a path that does not
hold (422) is refused whole, before anything is stored.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps_registry.models import DOMAIN_NAME_RE
from apps_registry.selectors import app_snapshot
from foundation import handoff
from messaging.channels.access import channel_name_require
from messaging.channels.services import channel_fanout, channel_publish_forwarded, channels_lock
from messaging.core.accept import SendRefused, content_require
from messaging.core.next_hop import neighbours
from messaging.federation.links import link_received
from messaging.federation.wire.transport import PeerRefused

log = logging.getLogger(__name__)

MAX_PUBLISHES_PER_CALL = 1000
PUBLISH_FIELDS = {"app": str, "channel": str, "content": str, "publisher": str, "origin_domain": str,
                  "origin_offset": int, "path": list}
_domain_name = re.compile(DOMAIN_NAME_RE)


@dataclass(frozen=True)
class FloodedPublish:
    app: str
    channel: str
    content: str
    publisher: str
    origin_domain: str
    origin_offset: int
    path: tuple[str, ...]


def path_text(path: tuple[str, ...] | list[str]) -> str:
    return ",".join(path)


def path_parse(text: str) -> tuple[str, ...]:
    return tuple(p for p in text.split(",") if p)


def flood_onward(path: tuple[str, ...]) -> list[str]:
    """The neighbours a publish that came by `path` (ending with the neighbour that sent it) goes on
    to from here: all but the domains it passed through, and none once the next hop would be over
    FORWARD_HOP_LIMIT (a call with that many domains after the origin is refused)."""
    if len(path) + 1 > settings.FORWARD_HOP_LIMIT:
        return []
    return [n for n in neighbours() if n not in path]


def _bad(status: int, reason: str) -> PeerRefused:
    return PeerRefused(status, reason)


def _parse(index: int, item: object, *, sender: str) -> FloodedPublish:
    where = f"publishes[{index}]"
    if not isinstance(item, dict):
        raise _bad(400, f"{where} must be an object")
    missing = sorted(set(PUBLISH_FIELDS) - set(item))
    if missing:
        raise _bad(400, f"{where} lacks {', '.join(missing)}")
    unexpected = sorted(set(item) - set(PUBLISH_FIELDS))
    if unexpected:
        raise _bad(400, f"{where} has unexpected field(s) {', '.join(unexpected)}")
    for name, kind in PUBLISH_FIELDS.items():
        value = item[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _bad(400, f"{where}.{name} must be {'an integer' if kind is int else 'a ' + kind.__name__}")
    if not 1 <= len(item["app"]) <= 64 or not item["channel"] or len(item["publisher"]) > 128:
        raise _bad(400, f"{where}: app, channel or publisher out of bounds")
    if item["origin_offset"] < 1:
        raise _bad(400, f"{where}.origin_offset must be at least 1")
    path = item["path"]
    if not path or not all(isinstance(d, str) and _domain_name.match(d) for d in path):
        raise _bad(400, f"{where}.path must be a non-empty list of domain names")
    if len(path) > settings.FORWARD_HOP_LIMIT:
        raise _bad(422, f"{where} is over the hop limit ({len(path)} hops, at most {settings.FORWARD_HOP_LIMIT})")
    if path[0] != item["origin_domain"]:
        raise _bad(422, f"{where}.path must start with its origin domain {item['origin_domain']}")
    if path[-1] != sender:
        raise _bad(422, f"{where}.path must end with the calling domain {sender}")
    if len(set(path)) != len(path):
        raise _bad(422, f"{where}.path passes through a domain twice")
    if settings.DOMAIN_NAME in path:
        raise _bad(422, f"{where}.path already passes through {settings.DOMAIN_NAME}")
    return FloodedPublish(app=item["app"], channel=item["channel"], content=item["content"],
                          publisher=item["publisher"], origin_domain=item["origin_domain"],
                          origin_offset=item["origin_offset"], path=tuple(path))


def publishes_parse(*, sender: str, payload: dict) -> list[FloodedPublish]:
    """The publishes of a call, all of them well formed (PeerRefused otherwise: nothing is stored)."""
    if set(payload) != {"publishes"}:
        raise _bad(400, "the body must be {\"publishes\": [...]}")
    items = payload["publishes"]
    if not isinstance(items, list) or not items:
        raise _bad(400, "publishes must be a non-empty list")
    if len(items) > MAX_PUBLISHES_PER_CALL:
        raise _bad(422, f"at most {MAX_PUBLISHES_PER_CALL} publishes per call")
    return [_parse(i, item, sender=sender) for i, item in enumerate(items)]


@dataclass(frozen=True)
class _Stored:
    app_id: int
    channel: str
    offset: int
    content: str


def _fanout(stored: list[_Stored]) -> None:
    for s in stored:
        try:
            channel_fanout(app_id=s.app_id, channel=s.channel, offset=s.offset, content=s.content)
        except Exception:
            # Stored, not pushed (Redis away): readers repair from the history.
            log.warning("fan-out of flooded %s@%d failed; readers repair from the history", s.channel, s.offset,
                        exc_info=True)


def publishes_accept(*, sender: str, payload: dict) -> dict:
    """Store the publishes `sender` flooded here (in payload order, one transaction), queue the new
    ones on, fan them out here once committed."""
    publishes = publishes_parse(sender=sender, payload=payload)
    refused: list[dict] = []
    accepted: list[tuple[int, FloodedPublish]] = []
    for index, p in enumerate(publishes):
        app = app_snapshot(p.app)
        try:
            if app is None:
                raise SendRefused("unknown_app", f"no app named {p.app} in {settings.DOMAIN_NAME}")
            channel_name_require(app, p.channel)
            content_require(app, p.content)
        except SendRefused as refusal:
            refused.append({"index": index, "reason": f"{refusal.code}: {refusal.detail}"[:300]})
            continue
        accepted.append((app.pk, p))
    stored: list[_Stored] = []
    woken: set[str] = set()
    duplicates = 0
    with transaction.atomic():
        # Every channel of the call locked up front in one order: two neighbours' calls that name
        # the same channels in different orders wait for each other instead of deadlocking.
        channels_lock(keys=[(app_id, p.channel) for app_id, p in accepted])
        for app_id, p in accepted:
            onward = flood_onward(p.path)
            offset = channel_publish_forwarded(
                app_id=app_id, channel=p.channel, content=p.content, publisher=p.publisher,
                origin_domain=p.origin_domain, origin_offset=p.origin_offset,
                path=path_text((*p.path, settings.DOMAIN_NAME)), forward_to=onward)
            if offset is None:
                duplicates += 1
                continue
            stored.append(_Stored(app_id, p.channel, offset, p.content))
            woken.update(onward)
        transaction.on_commit(lambda: _fanout(stored))
        if woken:
            transaction.on_commit(lambda: handoff.flood_links_enqueue(sorted(woken)))
    link_received(peer=sender, count=len(stored) + duplicates)
    return {"stored": len(stored), "duplicates": duplicates, "refused": refused}
