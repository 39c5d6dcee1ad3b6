"""Cursor pagination: `{"results": [...], "next": url | null, "previous": url | null}`; follow
`next` until it is null. Cursors are opaque and stable while rows come and go (no skipped or
repeated rows, unlike page numbers); `limit` picks the page size (1 to 1000, default 100)."""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from messaging.api.errors import ApiError

PAGE_SIZE = 100
PAGE_SIZE_MAX = 1000


class ApiCursorPagination(CursorPagination):
    page_size = PAGE_SIZE
    max_page_size = PAGE_SIZE_MAX
    page_size_query_param = "limit"
    cursor_query_description = "The `next` or `previous` cursor of an earlier page."

    def __init__(self, ordering: str | tuple[str, ...], extra: dict[str, Any] | None = None):
        self.ordering = ordering
        self.extra = extra or {}

    def get_page_size(self, request: Request) -> int:
        return query_int(request, "limit", PAGE_SIZE, 1, PAGE_SIZE_MAX)  # out of range: 400, not silently clamped

    def get_paginated_response(self, data: list) -> Response:
        return Response({**self.extra, "results": data, "next": self.get_next_link(),
                         "previous": self.get_previous_link()})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        return {"type": "object", "required": ["results", "next", "previous"], "properties": {
            "results": schema,
            "next": {"type": "string", "format": "uri", "nullable": True},
            "previous": {"type": "string", "format": "uri", "nullable": True},
        }}


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]; anything else is a 400."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ApiError(400, "invalid_request", f"'{name}' must be an integer from {low} to {high}")
    return int(raw)
