"""Who may read a channel: the one rule for /ws SUBSCRIBE and both channel streams (SSE, and the
push-compatible stream socket), and the check of a channel name a server sends to.

A reader may read a channel of its app when:
1. the app's server subscribed its user to it (a durable subscription; /ws connections only), or
2. the channel matches one of the app's public patterns (`news.*`), or
3. the reader shows a grant naming it (messaging.channels.names), good for this user (a grant with
   a `sub` is good for that user only).

Who may publish without a key (the push seed's bare `POST /messages`, served for an app with push
open mode): anyone, on a channel of that app anyone may read (rule 2), other than a user's own
channel (`@<userId>`: what is published there is the server's word about that user).

An app's "client subscriptions" switch is not part of this rule: it decides whether a /ws client
may SUBSCRIBE by itself at all (docs/protocol.md, "Channels"). The rule above decides what any
reader may read, on every transport.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps_registry.selectors import AppSnapshot
from messaging.channels.names import (
    GrantError,
    channel_grant_claims,
    channel_granted,
    channel_is_public,
    channel_name_valid,
    channel_of_app,
    channel_user,
)
from messaging.core.accept import SendRefused

CHANNEL_NAME_RULE = ("a channel name is 1 to 128 of A-Z a-z 0-9 _ . - @ "
                     "(a Pusher channel's, pusher.<name>, up to 407)")


def channel_name_require(app: AppSnapshot, name: object) -> str:
    """`name` if it names a channel of `app`: a malformed name is 'invalid_channel', another app's
    user channel (`@BNZ-1` for ANZ) 'unknown_channel'."""
    if not channel_name_valid(name):
        raise SendRefused("invalid_channel", CHANNEL_NAME_RULE)
    if not channel_of_app(app, name):
        raise SendRefused("unknown_channel", f"'{name}' is not a channel of app {app.app_name}")
    return name


class ChannelRefused(Exception):
    """A read the rule refuses; `problem`: not_public, bad_grant or not_granted."""

    def __init__(self, problem: str, detail: str):
        super().__init__(detail)
        self.problem = problem
        self.detail = detail


@dataclass
class Grant:
    """A grant a reader shows: verified once, and only when a read needs it (a public channel
    needs none, so a stale token does not stand in its way)."""

    app: AppSnapshot
    token: str
    _claims: dict | None = field(default=None, repr=False)

    def claims(self) -> dict:
        """The verified claims; GrantError says why not."""
        if self._claims is None:
            self._claims = channel_grant_claims(self.app, self.token)
        return self._claims


def channel_read_check(app: AppSnapshot, name: str, *, user_id: str | None, grant: Grant | None,
                       durable: bool = False) -> None:
    """Nothing when the reader may read channel `name` of `app` (a name already checked with
    `channel_name_require`); ChannelRefused says why not."""
    if durable or channel_is_public(app, name):
        return
    if grant is None:
        raise ChannelRefused("not_public", f"channel '{name}' is not public: a token granting it is needed")
    try:
        claims = grant.claims()
    except GrantError as exc:
        raise ChannelRefused("bad_grant", str(exc)) from None
    if not channel_granted(claims, name, user_id):
        raise ChannelRefused("not_granted", f"the token does not grant channel '{name}'")


def channel_open_publish_check(app: AppSnapshot, name: str) -> None:
    """Nothing when a publisher without a key may publish on channel `name` of `app` (a name
    already checked with `channel_name_require`); ChannelRefused says why not."""
    if channel_user(name) is not None:
        raise ChannelRefused("user_channel", f"channel '{name}' is a user's own: publish on it with an API key")
    if not channel_is_public(app, name):
        raise ChannelRefused("not_public", f"channel '{name}' is not public: publish on it with an API key")
