"""Transport helpers every layer may use: Redis clients, frame encoding and close codes, and the
one door to the sockets (foundation.transport.sockets).

They sit below apps_registry, presence and messaging on purpose (docs/architecture.md,
"Layers"): presence announces USER_CONNECTED through the same door messaging pushes messages through,
without importing messaging.
"""
