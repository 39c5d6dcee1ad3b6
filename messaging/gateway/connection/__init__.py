"""One client WebSocket connection (/ws), in parts (docs/architecture.md, "The /ws connection"):

- messaging.gateway.consumers.ClientConsumer: the consumer; it dispatches client frames to their handlers
  and channel-layer events to the ledger and the socket, and does nothing else;
- `handlers`: what each client frame does;
- `life`: authenticate -> presence -> session row, and every way out of it (cleanup);
- `ledger`: what the connection wrote, holds in flight, has not flushed and had acknowledged, and so
  which deliveries count as delivered and which go back to the mailbox (plain synchronous code);
- `inbox`: the consumer base that reads channels (a third source of events besides the client and
  the channel layer).
"""
