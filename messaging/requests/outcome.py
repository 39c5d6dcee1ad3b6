"""A request's outcome as a stored message to its requester (kind resolve or reject: the frames
RESOLVE and REJECT, messaging.core.protocol.delivery_frame), and where a server answers a request."""

from __future__ import annotations

from django.conf import settings

from apps_registry.models import Domain
from apps_registry.selectors import domain_call_url
from messaging.core.protocol import request_meta
from messaging.core.store import OutgoingMessage
from messaging.models import MessageKind

_answer_base: dict[str, str] = {}


def outcome_message(*, app_id: int, master_user_id: str, request_id: int, user_id: str,
                    client_message_id: str | None, outcome: str, content: str, reason: str = "",
                    session: str = "") -> OutgoingMessage:
    """The outcome, from the app's master user (the server speaks as it) to the requester (pushed to
    its `session` only, where it has one)."""
    return OutgoingMessage(
        app_id=app_id, sender=master_user_id, recipients=(user_id,), content=content,
        kind=MessageKind.RESOLVE if outcome == "resolve" else MessageKind.REJECT,
        reference=request_meta(request_id=request_id, client_message_id=client_message_id, reason=reason,
                               session=session))


def request_answer_url(request_id: int) -> str:
    """Where the server answers this request (`/resolve` or `/reject` appended): this domain's
    REQUESTS_ANSWER_BASE_URL, else its own URL in the registry (Domain.urls), else a path only."""
    base = settings.REQUESTS_ANSWER_BASE_URL or _answer_base.get(settings.DOMAIN_NAME)
    if base is None:
        urls = Domain.objects.filter(name=settings.DOMAIN_NAME).values_list("urls", flat=True).first()
        base = _answer_base.setdefault(settings.DOMAIN_NAME, domain_call_url(urls) or "")
    return f"{base.rstrip('/')}/api/v1/requests/{request_id}"
