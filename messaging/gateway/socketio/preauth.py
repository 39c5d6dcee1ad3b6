"""The node's Engine.IO sessions whose client has not logged in yet, capped per client address and
per node (SOCKETIO_PREAUTH_SESSIONS_PER_ADDRESS, SOCKETIO_PREAUTH_SESSIONS_PER_NODE): the excess is
refused with the protocol's error (messaging.gateway.socketio.endpoint)."""

from __future__ import annotations

import collections

from django.conf import settings


class Preauth:
    """The node's sessions whose client has not logged in yet, counted per client address."""

    by_address: collections.Counter[str] = collections.Counter()
    total = 0

    @classmethod
    def refusal(cls, address: str) -> str | None:
        """Why one more session from `address` is refused, or None."""
        if cls.total >= settings.SOCKETIO_PREAUTH_SESSIONS_PER_NODE:
            return "too many sessions waiting for their login on this node"
        if cls.by_address[address] >= settings.SOCKETIO_PREAUTH_SESSIONS_PER_ADDRESS:
            return "too many sessions waiting for their login from this address"
        return None

    @classmethod
    def add(cls, address: str) -> None:
        cls.by_address[address] += 1
        cls.total += 1

    @classmethod
    def remove(cls, address: str) -> None:
        left = cls.by_address[address] - 1
        if left > 0:
            cls.by_address[address] = left
        else:
            del cls.by_address[address]
        cls.total -= 1


def client_address(scope: dict) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
