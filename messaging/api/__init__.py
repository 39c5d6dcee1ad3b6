"""The server REST API (/api/v1/ and the push seed's POST /messages). Its Python client is the package
switchboard_client (clients/python), which imports nothing of the server."""
