"""The ordered event exchange (the MessageBroker seed, issue 19): events from one source per app,
put back in sequence order (a gap holds later events back), a durable follow graph, and the
notifications each connected user is owed, to follower-maze TCP clients and to /ws users.

- `models`: the follow graph and each app's exchange state (applied sequence, gap report).
- `streams`: the Redis stream the REST intake appends to and the engine reads (the one hand-over
  between web nodes and the engine process).
- `ws_bridge`: EVENT frames for the app's users connected over /ws (through the sockets door).
"""
