"""What belongs to one event loop: its clients, pools and semaphores.

Keyed by the loop itself, held weakly, never by `id(loop)`: once a loop is collected (each
`asyncio.run` makes a new one) a later loop can get the same id, and a client whose connections or
futures belong to the dead loop would wait on it for ever.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
_of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Any]] = weakref.WeakKeyDictionary()


def loop_local(key: Hashable, make: Callable[[], T]) -> T:
    """The running loop's own `key` (made by `make` on first use, gone with the loop)."""
    loop = asyncio.get_running_loop()
    mine = _of_loop.get(loop)
    if mine is None:
        mine = _of_loop[loop] = {}
    if key not in mine:
        mine[key] = make()
    return mine[key]
