"""A size-limited tmpfs, for tests that fill a disk on purpose (needs root)."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager


@contextmanager
def small_tmpfs(mnt, size: str):
    """Mount a tmpfs of ``size`` (e.g. ``"2m"``) on the new directory ``mnt``; always
    unmounted on the way out (lazily as a last resort), also when the test fails."""
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)
