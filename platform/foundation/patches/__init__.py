"""Every patch of a third party's internals, one module per library, each refusing to patch a version
it was not tested with (foundation.patches.versions).

A module here is where its library is reached into: a method replaced, a private attribute read or
reset, a private hook overridden, something the library does by itself redone by hand. Each patch
says in one line why it is needed. The modules that need a patch import it from here; what the patch
serves (the body cap's rules, the slow-reader limits, the address filter) stays with them.

- `channels_redis`: the pub/sub layer with a SlimQueue per channel; the socket door's pipelined publishes;
- `channels`: a consumer that runs its own dispatch loop, set up as AsyncConsumer.__call__ sets one up;
- `daphne`: daphne, autobahn and Twisted made a safe WebSocket server (checked when installed, by
  config.asgi, and by config.web before daphne starts);
- `django`: the lean ASGI handler's middleware, a pool thread's connection reset, the hot cursor, a
  lock connection, a response marked logged, a command's raw output stream.

PySpark's (the lake's Hadoop file system) is analytics.jobs.patches: the jobs run under spark-submit,
with neither Django nor this package on their path.
"""

from __future__ import annotations

import importlib

# Checked as they are imported (Django's and channels-redis's as Django sets up, Channels' with the
# consumers); daphne's when it installs, which only a web node does.
CHECKED_ON_IMPORT = ("channels", "channels_redis", "django")


def versions_check() -> None:
    """Refuse (versions.UntestedVersions) to go on with any library at a version its patch module was not
    tested with: what a web node does before it starts daphne, so it stops with the message, not a traceback."""
    for name in CHECKED_ON_IMPORT:
        importlib.import_module(f"{__name__}.{name}")
    importlib.import_module(f"{__name__}.daphne").check_versions()
