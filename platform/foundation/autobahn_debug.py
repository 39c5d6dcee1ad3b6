"""Autobahn's debug log lines, built only when debug logging is on.

Autobahn builds the arguments of its debug lines eagerly, at every call, whether or not anything
logs at debug level: per WebSocket connection it pretty-prints its whole option table (`pformat`)
and colours a dozen names with click (`hltype`, `hlval`). Measured on a web node taking back 1,000
clients in a reconnect storm, that was about an eighth of the node's CPU (issue 17). txaio formats a
log line only when the line is emitted, so wrapping those arguments in objects that do the work in
`__str__` (`Deferred`) gives the same text when debug logging is on, and nothing to do when it is off.

Installed by foundation.daphne_adapter.install(), on the autobahn version it pins.
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


def install() -> None:
    """Swap the formatting helpers autobahn's WebSocket modules call for deferring ones (once)."""
    # Here, not at the top: autobahn's Twisted module is imported only where daphne is patched.
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol  # likewise

    for module in (protocol, twisted_websocket):
        for name in ("pformat", "hltype", "hlval"):
            fn = getattr(module, name, None)
            if fn is not None and not hasattr(fn, "__wrapped__"):
                setattr(module, name, deferring(fn))
    # The one use that is not a log argument: Timings.__str__ returns pformat's text.
    protocol.Timings.__str__ = lambda self: str(protocol.pformat(self._timings))
