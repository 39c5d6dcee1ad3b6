"""Python clients of Switchboard: `SwitchboardClient` for the server REST API (sends, subscriptions,
presence, dead letters: from your server, with an API key) and `Realtime` for the WebSocket protocol
(a user's connection: send, receive each message once, ACK mode, reconnects, requests to the app's server,
answers to its requests, resumable sessions). Nothing of the server
(no Django) is imported."""

from __future__ import annotations

from .realtime import (
                       Accepted,
                       Closed,
                       Confirmation,
                       Message,
                       Outcome,
                       Realtime,
                       RealtimeError,
                       RequestRejected,
                       Sent,
                       ServerRequest,
                       reconnect_delay,
)
from .rest import ApiError, SwitchboardClient

__all__ = ["Accepted", "ApiError", "Closed", "Confirmation", "Message", "Outcome", "Realtime", "RealtimeError",
           "RequestRejected", "Sent", "ServerRequest", "SwitchboardClient", "reconnect_delay"]
__version__ = "0.1.0"
