"""The Pusher Channels protocol (version 7) door: pusher-js, Laravel Echo and the Pusher server
libraries against Switchboard's channels (docs/protocol.md, "Pusher protocol")."""
