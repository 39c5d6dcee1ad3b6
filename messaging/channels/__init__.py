"""Channels and topology: durable subscriptions, channel history with gap-free offsets, and the
node-local hub that fans a publish out to every subscribed connection (see hub.py)."""
