"""Push-compatible channel streams (PROTOCOL.md section 2, the push seed): `GET /sse/messages`
(Server-Sent Events) and `WS /ws/messages`. `POST /messages` lives with the REST API."""
