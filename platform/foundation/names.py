"""Name rules that settings, system checks and the registry share (one definition each)."""

from __future__ import annotations

import re

# A domain of the network: letters, digits, '-', '_' and '.', at most 64 characters.
DOMAIN_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_DOMAIN_NAME = re.compile(DOMAIN_NAME_PATTERN)


def domain_name_valid(name: str) -> bool:
    # fullmatch, not match with "$": "$" also matches before a trailing newline.
    return bool(_DOMAIN_NAME.fullmatch(name or ""))
