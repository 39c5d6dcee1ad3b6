"""`manage.py selftest`: an operator's end-to-end check of a live deployment, from outside.

- `provision` is the platform's side (behind the operator API, messaging.api.operator): it makes a
  throwaway app, or throwaway users on a named app, and removes them again;
- `checks` (one function per check), `wire` (the client's sockets and HTTP) and `runner` (order,
  timing, output, cleanup) are the operator's side: they speak to the deployment only over HTTP
  and WebSocket, as a client and an app's server would, never to its database.
"""
