"""Socket.IO clients at /socket.io/ (docs/protocol.md, "Socket.IO"): Engine.IO 4 sessions on both
transports (engine), a Socket.IO 5 connection above each that is the /ws consumer with its frames
translated (consumer), and the translation itself (mapping)."""
