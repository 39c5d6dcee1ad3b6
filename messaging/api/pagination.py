"""Cursor pagination: `{"results": [...], "next": url | null, "previous": url | null}`; follow
`next` until it is null. Cursors are opaque and stable while rows come and go (no skipped or
repeated rows, unlike page numbers); `limit` picks the page size (1 to 1000, default 100)."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any
from urllib.parse import quote

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from apps_registry.selectors import user_id_parse
from messaging.api.errors import ApiError
from messaging.core.protocol import plain_int

PAGE_SIZE = 100
PAGE_SIZE_MAX = 1000
CURSOR_TEXT = re.compile(r"[A-Za-z0-9+/=]{1,2048}")  # what encode_cursor gives out: base64
CURSOR_POSITION_MAX = 256  # the longest ordering value a cursor carries (a channel name, a user id, a time)


class ApiCursorPagination(CursorPagination):
    page_size = PAGE_SIZE
    max_page_size = PAGE_SIZE_MAX
    page_size_query_param = "limit"
    cursor_query_description = "The `next` or `previous` cursor of an earlier page."

    def __init__(self, ordering: str | tuple[str, ...], extra: dict[str, Any] | None = None):
        self.ordering = ordering
        self.extra = extra or {}

    def paginate_queryset(self, queryset: QuerySet, request: Request, view: Any = None) -> list | None:
        self.model = queryset.model  # decode_cursor checks a cursor's position against the ordering field
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Cursor | None:
        """The page a `cursor` names. A cursor is opaque but comes back from the client: one that
        is not base64 of ASCII, or whose position is no value of the ordering field (a date that is
        no date, a NUL that Postgres cannot take), is a 400 before any query."""
        encoded = request.query_params.get(self.cursor_query_param)
        try:
            if encoded is not None and not CURSOR_TEXT.fullmatch(encoded):
                raise NotFound()  # base64 decoding would skip what is not base64, and take the rest
            cursor = super().decode_cursor(request)
        except NotFound:
            cursor = None
            valid = False
        else:
            valid = cursor is None or cursor.position is None or self._position_valid(cursor.position)
        if not valid:
            raise ApiError(400, "invalid_request", "'cursor' must be a page's `next` or `previous` cursor, unchanged")
        return cursor

    def _position_valid(self, position: str) -> bool:
        if "\x00" in position or len(position) > CURSOR_POSITION_MAX:
            return False
        ordering = self.ordering if isinstance(self.ordering, str) else self.ordering[0]
        try:
            self.model._meta.get_field(ordering.lstrip("-")).to_python(position)
        except ValidationError:
            return False
        return True

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
    number = plain_int(raw, high)
    if number is None or number < low:
        raise ApiError(400, "invalid_request", f"'{name}' must be an integer from {low} to {high}")
    return number


def user_cursor_encode(user_id: str) -> str:
    """A cursor for pages ordered by user id (the Redis index of online users, say): the last user
    id of the page, opaque to clients, URL-quoted."""
    return quote(base64.b64encode(user_id.encode()).decode(), safe="")


def user_cursor_decode(request: Request, app_name: str) -> str | None:
    """The user id a `cursor` from user_cursor_encode names; None without one. Anything else (not
    base64, not a user id of the app) is a 400."""
    encoded = request.query_params.get("cursor")
    if encoded is None:
        return None
    user_id = None
    if CURSOR_TEXT.fullmatch(encoded):
        try:
            user_id = base64.b64decode(encoded, validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            user_id = None
    parsed = user_id_parse(user_id) if user_id is not None else None
    if parsed is None or parsed.app_name != app_name:
        raise ApiError(400, "invalid_request", "'cursor' must be a page's `next` cursor, unchanged")
    return user_id
