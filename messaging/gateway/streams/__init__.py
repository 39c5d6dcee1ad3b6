"""Push-compatible channel streams (docs/protocol.md, "Channel streams", the push seed): `GET /sse/messages`
(Server-Sent Events) and `WS /ws/messages`. `POST /messages` lives with the REST API."""
