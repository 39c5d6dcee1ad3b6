"""The foundation every app builds on, and which imports no app (docs/architecture.md, "Layers").

- `transport/`: Redis clients, frame encoding and close codes, and the one door to the sockets;
- `db`: the per-message statements' prepared cursor;
- `names`: name rules settings, checks and the registry share;
- `metrics`, `http_metrics`: the process's Prometheus registry and the HTTP latency middleware;
- `logs`: the logging filter that keeps a repeating failure readable;
- `patches/`: every patch of a third party's internals, one module per library, each refusing to
  start on versions it was not tested with (`patches.daphne`: what daphne needs to be a safe
  WebSocket server);
- `daphne_adapter`: what daphne's patched server offers the application (how much of a socket's
  output has left the node, its frame limit);
- `admin_readonly`: the console's read-only mixin.
"""
