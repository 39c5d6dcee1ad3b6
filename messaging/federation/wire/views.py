"""The internal endpoints neighbours call (signed, messaging.federation.wire.transport). Thin: check the
call, hand the payload to one service, answer JSON. Refusals are 4xx with `{"error": reason}`; a
failure here is a JSON 500 too, never an HTML page (the calling domain logs and shows the reason)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from messaging.federation import flood
from messaging.federation import inbound as intake
from messaging.federation.standby import copy as standby
from messaging.federation.takeover import liveness
from messaging.federation.wire.transport import PeerRefused, peer_request_check

log = logging.getLogger(__name__)


def _checked(request, service):
    try:
        sender, payload = peer_request_check(request)
    except PeerRefused as refused:
        return JsonResponse({"error": refused.reason}, status=refused.status)
    try:
        answer = service(sender=sender, payload=payload)
    except PeerRefused as refused:
        return JsonResponse({"error": refused.reason}, status=refused.status)
    except Exception as exc:  # noqa: BLE001  (answered as JSON; the traceback goes to the log)
        log.exception("internal call from %s failed", sender)
        return JsonResponse({"error": f"{settings.DOMAIN_NAME} failed to take the call: {type(exc).__name__}"},
                            status=500)
    return JsonResponse(answer)


@csrf_exempt
@require_POST
def forward(request):
    """Deliveries, confirmations and receipts from a neighbour: stored before the answer."""
    return _checked(request, intake.forward_accept)


@csrf_exempt
@require_POST
def publishes(request):
    """Channel publishes from a neighbour (the flood): stored and fanned out here, passed on."""
    return _checked(request, flood.publishes_accept)


@csrf_exempt
@require_POST
def standby_copies(request):
    """The live copy of the mailboxes of a neighbour's users who stand by here: written before the answer."""
    return _checked(request, standby.copies_accept)


@csrf_exempt
@require_POST
def witness(request):
    """A standby asks how long this domain has heard nothing of a home it would take over."""
    return _checked(request, liveness.witness_answer)


@csrf_exempt
@require_POST
def ping(request):
    """A neighbour's link probe: the answer proves the link works both ways."""
    return _checked(request, lambda *, sender, payload: {"domain": settings.DOMAIN_NAME})
