"""Whether a process is alive: the one check gc (temp files of a put in flight) and the
remote lease (a claim left by a crashed push on this host) share."""

from __future__ import annotations

import os


def pid_alive(pid) -> bool:
    """True if ``pid`` names a live process (one of another user's counts: EPERM)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
