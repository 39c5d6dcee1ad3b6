"""Reads of the domain network: each link's live state as this domain sees it (the admin, /metrics),
and which recipients have messages waiting on a link here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps_registry.models import DomainLink
from messaging.federation.models import LinkHealth
from messaging.models import Delivery, DeliveryState


class WaitingHere:
    """Whether a recipient has messages waiting on a link here (`forwarding`): asked once per
    recipient (the intake asks only for those whose home it has no way on to now)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, str], bool] = {}

    def waiting(self, app_id: int, recipient: str) -> bool:
        if (app_id, recipient) not in self._known:
            self._known[app_id, recipient] = Delivery.objects.filter(
                app_id=app_id, recipient=recipient, state=DeliveryState.FORWARDING.value).exists()
        return self._known[app_id, recipient]


def configured_links() -> dict[str, bool]:
    """Every neighbour over a configured link (enabled or not) -> whether the link is enabled."""
    here = settings.DOMAIN_NAME
    links = (DomainLink.objects.filter(Q(n1__name=here) | Q(n2__name=here))
             .values_list("n1__name", "n2__name", "enabled"))
    return {(b if a == here else a): enabled for a, b, enabled in links}


@dataclass(frozen=True)
class LinkState:
    peer: str
    enabled: bool | None  # None: no link to this peer is configured (any more)
    health: LinkHealth | None

    @property
    def called(self) -> bool:
        h = self.health
        return h is not None and (h.last_ok_at is not None or h.last_failure_at is not None)

    @property
    def up(self) -> bool:
        """Carrying traffic as far as this domain knows: enabled, and answered when last called."""
        return bool(self.enabled) and self.called and self.health.up

    def text(self, now: datetime | None = None) -> str:
        """'up', 'down since <time> (for N s)' (and whether it still answers pings), 'disabled',
        'not called yet' or 'no link configured'."""
        h = self.health
        if self.enabled is None:
            return "no link configured"
        if not self.enabled:
            return "disabled"
        if not self.called:
            return "not called yet"
        if h.up:
            return "up"
        since = h.down_since or h.last_failure_at
        seconds = int(((now or timezone.now()) - since).total_seconds())
        text = f"down since {since:%Y-%m-%d %H:%M:%S} UTC (for {seconds} s)"
        if seconds > settings.LINK_DOWN_AFTER_SECONDS:
            text += ", routed around"
        if h.last_failure_kind == "call" and h.last_ok_at and h.last_failure_at and h.last_ok_at > h.last_failure_at:
            text += "; answers pings, its calls failed"
        return text


def link_state_text(health: LinkHealth, *, enabled: bool | None) -> str:
    return LinkState(peer=health.peer, enabled=enabled, health=health).text()


def link_states() -> list[LinkState]:
    """Every neighbour over a configured link, and every peer this domain has a health record of."""
    configured = configured_links()
    health = {h.peer: h for h in LinkHealth.objects.all()}
    return [LinkState(peer=peer, enabled=configured.get(peer), health=health.get(peer))
            for peer in sorted(set(configured) | set(health))]
