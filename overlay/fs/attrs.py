"""What a handler answers for an inode's attributes: ``attributes(ino, st, timeout)``.

The libfuse session needs pyfuse3's ``EntryAttributes`` (fifteen fields set one by one
on a C object, then read back one by one by pyfuse3).  The kernel-direct session packs
the reply itself, so it takes a ``StatAttr`` instead: the stat result the handler
already has, our inode number and the cache timeout — three fields, and the
dispatcher packs ``fuse_attr`` straight from the stat (``kernel.dispatch``).  Both
expose the same read-only attribute names (``st_ino`` is ours, every other ``st_*``
is the real file's), so handler code reads either.
"""

from __future__ import annotations

__all__ = ["StatAttr"]


class StatAttr:
    """``EntryAttributes``' read side over an ``os.stat_result``."""

    __slots__ = ("st_ino", "st", "entry_timeout", "attr_timeout")
    generation = 0

    def __init__(self, ino: int, st, timeout: float):
        self.st_ino = ino
        self.st = st
        self.entry_timeout = timeout
        self.attr_timeout = timeout

    def __getattr__(self, name: str):     # st_mode, st_size, st_mtime_ns, …
        return getattr(self.st, name)
