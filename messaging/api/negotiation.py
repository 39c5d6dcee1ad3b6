"""Content negotiation of the server API: it speaks JSON only.

DRF answers 406 when an `Accept` header names nothing a view renders (`Accept: text/csv`, or a
malformed one such as `AJ+9`). A server calling this API can do nothing useful with a 406, and the
OpenAPI schema documents none; RFC 9110 (12.5.1) lets a server disregard `Accept`, so an
unsatisfiable one gets the JSON it would have got without the header.
"""

from __future__ import annotations

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class JsonAlways(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type
