"""Where a delivery is, in words, for the admin and the REST API (read only)."""

from __future__ import annotations

from messaging.core.next_hop import destination
from messaging.models import Delivery, DeliveryState


def delivery_where(delivery: Delivery) -> str:
    """"" for a delivery that never left this domain; otherwise its way so far: "waiting on the link
    to domain-02 (2 failed attempts)", "forwarded to domain-02, not yet delivered in domain-03",
    "forwarded to domain-02, delivered in domain-03", "forwarded to domain-02; dead at domain-03: ..."."""
    peer = delivery.forward_to
    if not peer:
        return ""
    home = destination(delivery.recipient) or "its home domain"
    state = delivery.state
    if state == DeliveryState.FORWARDING:
        tries = f" ({delivery.attempts} failed attempt{'s' if delivery.attempts != 1 else ''})" if delivery.attempts else ""
        return f"waiting on the link to {peer}{tries}"
    if state == DeliveryState.FORWARDED:
        return f"forwarded to {peer}, not yet delivered in {home}"
    if state == DeliveryState.DELIVERED:
        return f"forwarded to {peer}, delivered in {home}"
    if state == DeliveryState.DEAD:
        return f"forwarded to {peer}; {delivery.last_error}" if delivery.last_error else f"forwarded to {peer}; dead"
    return f"forwarded to {peer}; {state}"
