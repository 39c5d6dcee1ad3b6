"""EVENT frames for an app's users connected over /ws (to build: the ws helper)."""

from __future__ import annotations
