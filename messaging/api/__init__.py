"""The server REST API (/api/v1/ and the push seed's POST /messages). messaging.api.client is the
Python client of it and imports nothing of Django."""
