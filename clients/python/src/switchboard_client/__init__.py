"""Python clients of Switchboard: `SwitchboardClient` for the server REST API (sends, subscriptions,
presence, dead letters: from your server, with an API key) and `Realtime` for the WebSocket protocol
(a user's connection: send, receive each message once, ACK mode, reconnects). Nothing of the server
(no Django) is imported."""

from __future__ import annotations

from .realtime import Accepted, Closed, Confirmation, Message, Realtime, RealtimeError, Sent, reconnect_delay
from .rest import ApiError, SwitchboardClient

__all__ = ["Accepted", "ApiError", "Closed", "Confirmation", "Message", "Realtime", "RealtimeError", "Sent",
           "SwitchboardClient", "reconnect_delay"]
__version__ = "0.1.0"
