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
from foundation.handoff import Route, routing_enqueue
from messaging.core.accept import SendRefused, content_require
from messaging.requests.models import Outcome
from messaging.requests.services import (
    Answer,
    RequestClosed,
    RequestUnknown,
    request_endpoint_failed,
    requests_answer,
)

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
    """messaging.webhooks.delivery.AnswerReader for request.received. `route`: where the outcomes'
    deliveries go once committed (a web node gives its routing batcher)."""

    def __init__(self, route: Route = routing_enqueue) -> None:
        self.route = route

    @property
    def answer_bytes(self) -> int:
        return settings.REQUEST_WEBHOOK_ANSWER_MAX_BYTES

    def answered_many(self, answers: list[tuple[dict, bytes, bool]]) -> None:
        """Answers of many calls (a web node's batch), taken per app in one requests_answer each."""
        per_app: dict[str, list[Answer]] = {}
        for payload, body, complete in answers:
            data = payload.get("data") or {}
            if not complete:
                log.warning("the answer to request %s is over REQUEST_WEBHOOK_ANSWER_MAX_BYTES: not taken",
                            data.get("requestId"))
                continue
            found = answer_of(body)
            app = app_snapshot_by_app_id(str(payload.get("app", ""))) if found else None
            if found is None or app is None:
                continue
            outcome, content = found
            if not isinstance(content, str):
                content = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
            try:
                per_app.setdefault(app.app_id, []).append(
                    Answer(int(data["requestId"]), outcome, content_require(app, content)))
            except (SendRefused, KeyError, ValueError) as exc:
                log.warning("the webhook's answer to request %s not taken: %s", data.get("requestId"), exc)
        for app_id, taken in per_app.items():
            results = requests_answer(app=app_snapshot_by_app_id(app_id), answers=taken, via="webhook",
                                      route=self.route)
            for answer, result in zip(taken, results, strict=True):
                if isinstance(result, (RequestClosed, RequestUnknown)):
                    log.warning("the webhook's answer to request %s not taken: %r", answer.request_id, result)

    def dead(self, *, payload: dict, error: str) -> None:
        request_id = (payload.get("data") or {}).get("requestId")
        if request_id is not None:
            request_endpoint_failed(request_id=int(request_id), error=error)


READERS = {"request.received": RequestAnswerReader()}


def readers_routed_by(route: Route) -> dict[str, RequestAnswerReader]:
    """The readers, with the outcomes routed by `route` (a web node's inline calls)."""
    return {"request.received": RequestAnswerReader(route)}
