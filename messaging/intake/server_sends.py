"""Sends an app's server makes (the REST API and `manage.py send` call these; neither talks to the
other): to one user, to many users, or to a channel, checked by the same rules as what a client
sends on /ws (messaging.core.accept); the sender defaults to the app's master user.

A RELIABLE send is stored (message, mailbox sequences, deliveries) in one statement and routed
once committed; FAST is pushed now and never stored; a channel publish is appended to the
channel's history (next gap-free offset) and fanned out once committed. Callers may wrap a send in
their own transaction (the idempotency key's claim does): nothing leaves the process before it
commits, except a FAST push, which is never stored anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from apps_registry.selectors import AppSnapshot
from messaging.channels import registry
from messaging.channels.access import channel_name_require
from messaging.channels.services import Published, channel_fanout, channel_publish
from messaging.core.accept import SendRefused, content_require, recipients_require, user_require
from messaging.core.delivery.fast import message_fast_send
from messaging.core.protocol import FEATURE_FAST, FEATURE_RELIABLE, REFERENCE_MAX, unsafe_string
from messaging.core.store import OutgoingMessage, messages_store
from messaging.models import MessageKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSendResult:
    feature: str
    sender: str
    recipients: tuple[str, ...]
    message_id: int | None  # RELIABLE only: FAST messages are never stored
    connections: int | None  # FAST only: live connections that took it


@dataclass(frozen=True)
class CheckedSend:
    """A server send the rules took: what to store (RELIABLE) or push (FAST)."""

    feature: str
    message: OutgoingMessage


def server_message_check(*, app: AppSnapshot, recipients: Sequence[str], content: str, group: bool,
                         feature: str = FEATURE_RELIABLE, sender: str | None = None, reference: str = "",
                         confirmation: bool = False) -> CheckedSend:
    """The rules of a send to one user (`group` False: a MESSAGE, which may ask for a
    MESSAGE_CONFIRMATION to the sender when it has a reference) or to several (a GROUP_MESSAGE,
    never confirmed): SendRefused, or what to send."""
    if feature not in (FEATURE_RELIABLE, FEATURE_FAST):
        raise SendRefused("invalid_request", "feature must be RELIABLE or FAST")
    if not group and len(set(recipients)) > 1:
        raise SendRefused("invalid_request", "a message to one user names exactly one recipient")
    unique = recipients_require(app, recipients)
    sender = user_require(app, sender or app.master_user_id, role="sender")
    content = content_require(app, content)
    if not isinstance(reference, str) or len(reference) > REFERENCE_MAX or unsafe_string(reference):
        raise SendRefused("invalid_request", f"reference must be text of at most {REFERENCE_MAX} characters")
    return CheckedSend(feature, OutgoingMessage(
        app_id=app.pk, sender=sender, recipients=tuple(unique), content=content,
        kind=MessageKind.GROUP if group else MessageKind.DIRECT, reference=reference,
        confirmation_requested=not group and bool(reference) and confirmation))


def server_fast_push(app: AppSnapshot, message: OutgoingMessage) -> int:
    """A checked FAST send pushed to the recipients' live connections: how many took it."""
    return message_fast_send(app=app, sender=message.sender, recipients=list(message.recipients),
                             content=message.content, reference=message.reference)


def server_message_send(*, app: AppSnapshot, recipients: Sequence[str], content: str, group: bool,
                        feature: str = FEATURE_RELIABLE, sender: str | None = None, reference: str = "",
                        confirmation: bool = False) -> ServerSendResult:
    """Send to one user or to several (server_message_check's rules): stored, or pushed (FAST)."""
    checked = server_message_check(app=app, recipients=recipients, content=content, group=group, feature=feature,
                                   sender=sender, reference=reference, confirmation=confirmation)
    message = checked.message
    if checked.feature == FEATURE_FAST:
        return ServerSendResult(FEATURE_FAST, message.sender, message.recipients, None, server_fast_push(app, message))
    result = messages_store(messages=[message])[0]
    return ServerSendResult(checked.feature, message.sender, message.recipients, result.message_id, None)


def _fanout_after_commit(app_id: int, channel: str, offset: int, content: str) -> None:
    try:
        channel_fanout(app_id=app_id, channel=channel, offset=offset, content=content)
    except Exception:
        # Stored, not pushed (Redis away): readers repair from the history at their next publish
        # or reconnect.
        log.warning("fan-out of %s@%d failed; readers repair from the history", channel, offset, exc_info=True)


def server_channel_publish(*, app: AppSnapshot, channel: str, content: str, publisher: str = "") -> Published:
    """Publish on a channel of `app`: its next offset in the history, then (once committed, so a
    caller's enclosing transaction is respected) the fan-out to every reader in the cluster.

    The answer's `subscribers` is the cluster's live readers of the channel as the publish is
    stored: the readers the fan-out goes to (a reader joining in between gets it too).
    """
    channel = channel_name_require(app, channel)
    content = content_require(app, content)
    with transaction.atomic():
        # The channel row stays locked until commit, so offsets follow commit order; a fan-out
        # that overtakes an earlier one is put back in order by its readers (from the history).
        offset = channel_publish(app_id=app.pk, channel=channel, content=content, publisher=publisher)
        try:
            subscribers = registry.readers_count(app.pk, channel)
        except Exception:
            log.warning("reading the readers of %s failed", channel, exc_info=True)
            subscribers = 0
        transaction.on_commit(lambda: _fanout_after_commit(app.pk, channel, offset, content))
    return Published(channel=channel, offset=offset, subscribers=subscribers)
