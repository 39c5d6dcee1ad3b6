"""Whether this process is draining: a web node told to stop (SIGTERM) that is letting its clients go.

Set once, by the node's drain (foundation.drain_server), and never cleared: the process exits at
the end of it. Read where a draining node must say no:
- /readyz answers 503 `{"status": "draining", "failing": ["draining"]}` (config.health), so a load
  balancer stops sending it new connections;
- a WebSocket opened or authenticated during the drain is closed with 1012 and an SSE stream is
  answered 503 (the client reconnects, to another node): nothing new is admitted on a connection
  the node had already accepted before it stopped listening.

A flag read from the event loop and from Django's request threads (a threading.Event: both see it).
"""

from __future__ import annotations

import threading

from django.conf import settings

_draining = threading.Event()

DRAINING_REASON = "this node is shutting down; reconnect"


def draining() -> bool:
    return _draining.is_set()


def drain_begin() -> bool:
    """Mark the process draining; False when it already was."""
    if _draining.is_set():
        return False
    _draining.set()
    return True


def drain_window() -> float:
    """Seconds over which the node's sockets are closed, each at a random moment (DRAIN_SECONDS)."""
    return max(0.0, float(settings.DRAIN_SECONDS))


def drain_bound() -> float:
    """Seconds after the drain began at which the node stops whatever is left (window + grace)."""
    return drain_window() + max(0.0, float(settings.DRAIN_GRACE_SECONDS))
