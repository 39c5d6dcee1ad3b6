"""Webhooks: an app's server is told, by signed HTTPS calls, what happened to its users, messages
and channels, without keeping a master WebSocket open.

- events (messaging.models.WebhookEvent): user.connected / user.disconnected (a user's first
  connection in the cluster opened / its last one closed), message.dead_lettered (a delivery used
  up its attempts), channel.occupied / channel.vacated (a channel's first reader in the cluster /
  its last one left);
- services.py records them, for the app's endpoints that want them, one row per endpoint and event
  (messaging.models.WebhookDelivery), in one statement per batch, and hands them to Celery;
- delivery.py sends one (signed: signing.py), and retries with backoff until it is delivered or dead;
- selectors.py keeps, per process, which events each app has endpoints for, so an app without
  endpoints costs its hot paths nothing.

The wire format (body, headers, signature, how to verify it) is docs/webhooks.md.
"""
