"""What a request endpoint's webhook answer means (request.received; messaging.webhooks.delivery
calls it in the transaction that records the call):

- a 2xx answer whose body is `{"resolve": content}` or `{"reject": content}` answers the request
  there and then (content a string; any other JSON value is kept as its JSON text); any other 2xx
  answer (`202`, or `200` without either) means the server answers later;
- a call that is dead-lettered rejects the request with `reason: "endpoint_failed"`.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings

from apps_registry.selectors import app_snapshot_by_app_id
from messaging.core.accept import SendRefused, content_require
from messaging.requests.models import Outcome
from messaging.requests.services import RequestClosed, RequestUnknown, request_answer, request_endpoint_failed

log = logging.getLogger(__name__)


def answer_of(body: bytes) -> tuple[str, object] | None:
    """(outcome, content) of a webhook's answer body, or None: the server answers later."""
    try:
        answer = json.loads(body) if body.strip() else None
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    given = [outcome for outcome in (Outcome.RESOLVE.value, Outcome.REJECT.value) if outcome in answer]
    return (given[0], answer[given[0]]) if len(given) == 1 else None


class RequestAnswerReader:
    """messaging.webhooks.delivery.AnswerReader for request.received."""

    @property
    def answer_bytes(self) -> int:
        return settings.REQUEST_WEBHOOK_ANSWER_MAX_BYTES

    def answered(self, *, payload: dict, body: bytes, complete: bool) -> None:
        data = payload.get("data") or {}
        if not complete:
            log.warning("the answer to request %s is over REQUEST_WEBHOOK_ANSWER_MAX_BYTES: not taken",
                        data.get("requestId"))
            return
        found = answer_of(body)
        if found is None:
            return
        outcome, content = found
        app = app_snapshot_by_app_id(str(payload.get("app", "")))
        if app is None:
            return
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
        try:
            content = content_require(app, content)
            request_answer(app=app, request_id=int(data["requestId"]), outcome=outcome, content=content,
                           via="webhook")
        except (SendRefused, RequestClosed, RequestUnknown, KeyError, ValueError) as exc:
            log.warning("the webhook's answer to request %s not taken: %s", data.get("requestId"), exc)

    def dead(self, *, payload: dict, error: str) -> None:
        request_id = (payload.get("data") or {}).get("requestId")
        if request_id is not None:
            request_endpoint_failed(request_id=int(request_id), error=error)


READERS = {"request.received": RequestAnswerReader()}
