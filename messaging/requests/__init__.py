"""Requests (docs/protocol.md, "Requests"): a client asks a named endpoint of its app's server, the
server answers on any node whenever it likes, and the outcome is stored in the requester's mailbox
like a RELIABLE message, so it finds the client wherever it reconnects. The other direction too:
the server asks a client, and learns its answer by webhook."""
