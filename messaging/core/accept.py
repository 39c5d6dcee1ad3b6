"""Where a message is accepted: the one check of what a sender may send, whoever sends it (a client
on /ws, an app's server through the REST API or `manage.py send`).

Rules:
- every user named (recipient or sender) is `<appName>-<digits>` of the sending app, covered by one
  of its user distributions;
- a send names at least one recipient and at most the app's `max_group_recipients` (a recipient
  named twice counts, and gets the message, once);
- content is text without NUL or lone surrogates, at most the app's `max_content_bytes` in UTF-8.

A refusal is a `SendRefused`: `code` is stable (the REST API's error code, messaging.api.errors),
`detail` is for people (the REST API's words), and `problem` names the rule that refused, from
which the /ws protocol words its INVALID_MESSAGE reason the way its clients know it
(messaging.gateway.connection.handlers). An app's server is never told whether another app has a user of
that name: every refused name there is "not a user of app X".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps_registry.selectors import AppSnapshot, user_id_parse
from messaging.core.protocol import unsafe_string

USER_ID_MAX = 96


class SendRefused(Exception):
    """A send (or a name in a request) the rules above refuse."""

    def __init__(self, code: str, detail: str, *, problem: str = "", subject: Any = None, **extra: Any):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.problem = problem or code  # which rule: not_text, not_user_id, other_app, not_distributed, ...
        self.subject = subject  # what was refused (a user id, as given)
        self.extra = extra


def user_require(app: AppSnapshot, user_id: object, *, role: str = "user") -> str:
    """`user_id` if it is a user of `app` that a distribution covers; else SendRefused('unknown_user')."""
    problem = ""
    if not isinstance(user_id, str) or not user_id:
        problem = "not_text"
    else:
        parsed = user_id_parse(user_id) if len(user_id) <= USER_ID_MAX else None
        if parsed is None:
            problem = "not_user_id"
        elif parsed.app_name != app.app_name:
            problem = "other_app"
        elif app.home_domain(parsed.number) is None:
            problem = "not_distributed"
    if not problem:
        return user_id
    shown = user_id[:USER_ID_MAX] if isinstance(user_id, str) else repr(user_id)[:USER_ID_MAX]
    raise SendRefused("unknown_user", f"{role} '{shown}' is not a user of app {app.app_name}", problem=problem,
                      subject=user_id)


def recipients_require(app: AppSnapshot, recipients: Sequence[object]) -> list[str]:
    """The distinct recipients of a send, in the order first named, each a user of `app`."""
    if not recipients:
        raise SendRefused("invalid_request", "name at least one recipient", problem="no_recipients")
    for to in recipients:
        if not isinstance(to, str):  # refused before anything is hashed or counted
            user_require(app, to, role="recipient")
    unique = list(dict.fromkeys(recipients))
    if len(unique) > app.max_group_recipients:
        raise SendRefused("too_many_recipients", f"at most {app.max_group_recipients} recipients per message",
                          limit=app.max_group_recipients)
    return [user_require(app, to, role="recipient") for to in unique]


def content_require(app: AppSnapshot, content: object) -> str:
    """`content` if the app takes it: text, no NUL or lone surrogate, within max_content_bytes."""
    if not isinstance(content, str):
        raise SendRefused("invalid_content", "content must be a string", problem="content_not_text")
    problem = unsafe_string(content)
    if problem:
        raise SendRefused("invalid_content", problem, problem="content_unsafe")
    if len(content) > app.max_content_bytes or len(content.encode()) > app.max_content_bytes:
        raise SendRefused("content_too_large", f"content exceeds {app.max_content_bytes} bytes",
                          limit=app.max_content_bytes)
    return content
