"""The foundation every app builds on, and which imports no app (docs/architecture.md, "Layers").

- `transport/`: Redis clients, frame encoding and close codes, and the one door to the sockets;
- `db`: the per-message statements' prepared cursor;
- `names`: name rules settings, checks and the registry share;
- `metrics`, `http_metrics`: the process's Prometheus registry and the HTTP latency middleware;
- `logs`: the logging filter that keeps a repeating failure readable;
- `daphne_adapter`: what daphne needs to be a safe WebSocket server (checked against the versions
  it was written for at start-up);
- `admin_readonly`: the console's read-only mixin.
"""
