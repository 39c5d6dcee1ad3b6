"""URL routes that bypass Django's request handling: WebSockets, and long-lived HTTP streams."""

from __future__ import annotations

from django.urls import path, re_path

from messaging.gateway.consumers import ClientConsumer
from messaging.gateway.pusher.consumer import PusherConsumer
from messaging.gateway.socketio.consumer import SocketIOConsumer
from messaging.gateway.socketio.endpoint import EngineIO
from messaging.gateway.streams.sse import SseStream
from messaging.gateway.streams.ws import PushStreamConsumer

# Socket.IO (Engine.IO's polling and WebSocket transports): one application for both protocols.
socketio_application = EngineIO(SocketIOConsumer.as_asgi())

websocket_urlpatterns = [
    re_path(r"^socket\.io/?$", socketio_application),
    re_path(r"^ws/messages/?$", PushStreamConsumer.as_asgi()),
    # Pusher Channels clients (pusher-js, Laravel Echo): docs/protocol.md, "Pusher protocol".
    re_path(r"^app/(?P<key>[^/]{1,64})/?$", PusherConsumer.as_asgi()),
    re_path(r"^ws/?$", ClientConsumer.as_asgi()),
    # A domain's bare URL (the linker seed lists them without a path: ws://host:8002): the same endpoint.
    re_path(r"^$", ClientConsumer.as_asgi()),
]

stream_urlpatterns = [
    re_path(r"^socket\.io/?$", socketio_application),
    path("sse/messages", SseStream()),
]
