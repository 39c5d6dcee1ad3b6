"""Autobahn's debug log lines, built only when debug logging is on.

Autobahn builds the arguments of its debug lines eagerly, at every call, whether or not anything
logs at debug level: per WebSocket connection it pretty-prints its whole option table (`pformat`)
and colours a dozen names with click (`hltype`, `hlval`). Measured on a web node taking back 1,000
clients in a reconnect storm, that was about an eighth of the node's CPU (issue 17). txaio formats a
log line only when the line is emitted, so wrapping those arguments in objects that do the work in
`__str__` (`Deferred`) gives the same text when debug logging is on, and nothing to do when it is off.

Swapped into autobahn by foundation.patches.daphne, on the autobahn version it was tested with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Deferred:
    """`fn(*args, **kwargs)`, computed when (and each time) the object is formatted."""

    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __str__(self) -> str:
        return str(self.fn(*self.args, **self.kwargs))

    def __repr__(self) -> str:  # "{x!r}" in a log format
        return str(self)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def deferring(fn: Callable[..., Any]) -> Callable[..., Deferred]:
    def defer(*args: Any, **kwargs: Any) -> Deferred:
        return Deferred(fn, args, kwargs)

    defer.__wrapped__ = fn  # type: ignore[attr-defined]
    return defer
