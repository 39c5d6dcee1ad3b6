"""What a master user's connection has been told about who is online, kept so it can be made right.

Announcements (USER_CONNECTED / USER_DISCONNECTED) travel over Redis pub/sub, which delivers at
most once: one lost on the way (a pub/sub connection reconnecting under load) would leave the
master's view wrong for as long as the user stays. So each master connection remembers what it
told (the ONLINE_USERS snapshot, then every notice written), writes a notice only when it changes
that (a second USER_CONNECTED for a user it already listed is not written), and every
PRESENCE_MASTER_RESYNC_SECONDS compares it with the app's online index and writes the notices
that make up the difference. A lost notice is thereby late by at most that long, never missing.

Pure bookkeeping: the consumer (messaging.gateway.consumers) reads the index and writes the frames.
"""

from __future__ import annotations

from presence.services import presence_frame


class MasterView:
    def __init__(self, online: set[str]):
        self.told = set(online)

    def notice(self, user_id: str, online: bool) -> bool:
        """A notice about `user_id`: True when it changes what the master was told (write it)."""
        if (user_id in self.told) == online:
            return False
        if online:
            self.told.add(user_id)
        else:
            self.told.discard(user_id)
        return True

    def resync(self, online: set[str]) -> list[str]:
        """The frames that make what the master was told match `online` (the index read now)."""
        frames = [presence_frame("USER_DISCONNECTED", u) for u in sorted(self.told - online)]
        frames += [presence_frame("USER_CONNECTED", u) for u in sorted(online - self.told)]
        self.told = set(online)
        return frames
