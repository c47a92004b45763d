"""What a handler answers for an inode's attributes: ``attributes(ino, st, timeout)``.

The libfuse session needs pyfuse3's ``EntryAttributes`` (fifteen fields set one by one
on a C object, then read back one by one by pyfuse3).  The kernel-direct session packs
the reply itself, so it takes a ``StatAttr`` instead: the stat result the handler
already has, our inode number and the cache timeout — three fields, and the
dispatcher packs ``fuse_attr`` straight from the stat (``kernel.dispatch``).  Both
expose the same read-only attribute names (``st_ino`` is ours, every other ``st_*``
is the real file's), so handler code reads either.

The number ``stat`` shows (``StatAttr.shown_ino``, the kernel session only): the real
file's, when it lies on the workspace's own device.  Our inode numbers (the FUSE node
ids) are handed out anew when the kernel forgets an inode and looks it up again —
memory pressure does that — so a file's serial number changed while it existed
(pjdfstest's rename/10.t under load; git and editors compare it).  The real number is
stable for as long as the file exists, and the same as without the mount.  A file on
another device (a file system mounted inside the workspace) could carry a number a
file of the workspace's device has too, and two files with one number look like hard
links (``cp -a``, ``tar``, ``rsync -H`` would then copy one as a link to the other):
it shows our node id with the top bit set, which no real number reaches.  pyfuse3
gives a node one number for both, so the libfuse session shows its node ids.
"""

from __future__ import annotations

__all__ = ["FOREIGN_INO", "StatAttr"]

FOREIGN_INO = 1 << 63     # or-ed into a node id shown for a file of another device


class StatAttr:
    """``EntryAttributes``' read side over an ``os.stat_result``."""

    __slots__ = ("st_ino", "st", "entry_timeout", "attr_timeout", "shown_ino")
    generation = 0

    def __init__(self, ino: int, st, timeout: float, home_dev: int):
        self.st_ino = ino
        self.st = st
        self.entry_timeout = timeout
        self.attr_timeout = timeout
        self.shown_ino = st.st_ino if st.st_dev == home_dev else ino | FOREIGN_INO

    def __getattr__(self, name: str):     # st_mode, st_size, st_mtime_ns, …
        return getattr(self.st, name)
