"""Requests between clients and their app's server (messaging.requests), a table of the messaging
app (registered through messaging.models).

Guarantees:
- (app, user, clientMessageId) is unique for a client's requests: the same request sent again is
  stored once, and its server is told once (request_once_per_client_id).
- A request is answered once: every move out of `waiting` is one conditional statement
  (`... WHERE state = 'waiting'`), so of two answers (or an answer and the timeout) exactly one wins;
  the outcome message is stored in the same transaction as the move.
- Nothing is answered after its deadline: an answer's statement requires `deadline > now()`, and
  the sweep times out only what is past it.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps_registry.models import ClientApp


class RequestDirection(models.TextChoices):
    TO_SERVER = "to_server"  # a client's REQUEST to an endpoint of its app's server
    TO_CLIENT = "to_client"  # the app's server asking a client (SERVER_REQUEST)


class RequestState(models.TextChoices):
    WAITING = "waiting"
    RESOLVED = "resolved"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"  # no answer within its timeout: REJECT, reason "timeout"
    FAILED = "failed"  # its call to the server was dead-lettered: REJECT, reason "endpoint_failed"


class Outcome(models.TextChoices):
    RESOLVE = "resolve"
    REJECT = "reject"


# A REJECT's reason, where the platform (not the server) rejected.
REASON_TIMEOUT = "timeout"
REASON_ENDPOINT_FAILED = "endpoint_failed"
CLOSED_STATES = (RequestState.RESOLVED, RequestState.REJECTED, RequestState.TIMED_OUT, RequestState.FAILED)


class Request(models.Model):
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    direction = models.CharField(max_length=16, choices=RequestDirection.choices, default=RequestDirection.TO_SERVER)
    # The client: the requester (to_server) or the user asked (to_client).
    user_id = models.CharField(max_length=96)
    endpoint = models.CharField(max_length=100, blank=True, default="")  # to_server
    content = models.TextField()
    # NULL, not "": the unique constraint must not treat "no id" as one shared id.
    client_message_id = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    correlation = models.CharField(max_length=256, blank=True, default="")  # to_client: the server's own
    state = models.CharField(max_length=16, choices=RequestState.choices, default=RequestState.WAITING)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True, default="")
    outcome_content = models.TextField(blank=True, default="")
    reason = models.CharField(max_length=32, blank=True, default="")  # a REJECT the platform gave
    answered_via = models.CharField(max_length=16, blank=True, default="")  # api, stream, webhook, client
    # to_server: the stored RESOLVE/REJECT; to_client: the stored SERVER_REQUEST.
    message_id = models.BigIntegerField(null=True, blank=True)
    domain = models.CharField(max_length=64)  # where it was made: answers come here
    # The requester's resumable session (to_server): its outcome is pushed to that session only.
    session = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField()
    deadline = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["app", "user_id", "client_message_id"],
                                    condition=Q(client_message_id__isnull=False), name="request_once_per_client_id"),
        ]
        indexes = [
            # The timeout sweep: waiting requests past their deadline (partial: closed ones never weigh on it).
            models.Index(fields=["deadline"], name="request_waiting_deadline",
                         condition=Q(state=RequestState.WAITING.value)),
            # A user's requests in flight to one endpoint (the per-user cap).
            models.Index(fields=["app", "user_id", "endpoint"], name="request_waiting_per_user",
                         condition=Q(state=RequestState.WAITING.value)),
            # The console's list, newest first, and retention's purge of the oldest.
            models.Index(fields=["-created_at"], name="request_recent"),
        ]

    def __str__(self) -> str:
        return f"request #{self.pk} {self.endpoint or 'to ' + self.user_id} [{self.state}]"


class ClosedSession(models.Model):
    """A client's resumable session that ended (CLOSE_SESSION, or not seen for SESSION_TIMEOUT_SECONDS):
    outcomes that waited for it were discarded, and later ones are not stored. A session id is
    server-issued and signed (messaging.requests.sessions), so only ended ones need a row; kept
    REQUEST_RETENTION_DAYS."""

    session = models.CharField(max_length=40, primary_key=True)
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    user_id = models.CharField(max_length=96)
    reason = models.CharField(max_length=16)  # closed (by the client) or timeout
    discarded = models.PositiveIntegerField(default=0)  # outcomes that waited for it
    closed_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["closed_at"], name="closed_session_age")]  # retention's purge

    def __str__(self) -> str:
        return f"session {self.session} of {self.user_id} ({self.reason})"
