"""Hard links across the edge of a plan: which other names share a file's inode.

A plan lists only touched paths, but an inode's other names may lie outside it: a name
deleted after the point was touched, its surviving twin was not.  Two things need the
other names, and both are rare, so the index is built lazily by one walk of the tree
(under the root fd, never following symlinks, skipping ignored paths):

- capturing: before a rewind drops or replaces a name whose inode has more links, every
  other name of it is captured too (its link count is about to change), so the rewind
  epoch itself is complete and a redo rebuilds the same link structure;
- landing: a name whose target belongs to hard-link group ``b"dev:ino"`` links to a
  surviving name of that inode when no name of the group was landed in this run — after
  checking that the survivor still holds the target content (inode numbers get reused).
"""

from __future__ import annotations

import logging
import os
import stat

from . import _restore_land as L

log = logging.getLogger(__name__)

__all__ = ["InodeIndex", "parse_group"]


def parse_group(group: bytes | None) -> tuple[int, int] | None:
    """``b"dev:ino"`` (the capture's link_group form) → (dev, ino); None otherwise."""
    if not group:
        return None
    dev, _, ino = group.partition(b":")
    try:
        return int(dev), int(ino)
    except ValueError:
        return None


class InodeIndex:
    """(dev, ino) → relative names of regular files with more than one link."""

    def __init__(self, root_fd: int, rules):
        self.root_fd, self.rules = root_fd, rules
        self._map: dict[tuple[int, int], list[bytes]] | None = None

    def names(self, dev: int, ino: int) -> list[bytes]:
        if self._map is None:
            self._map = self._build()
        return list(self._map.get((dev, ino), ()))

    def _build(self) -> dict[tuple[int, int], list[bytes]]:
        out: dict[tuple[int, int], list[bytes]] = {}
        stack = [(os.dup(self.root_fd), b"")]
        try:
            while stack:
                dir_fd, base = stack.pop()
                try:
                    self._scan(dir_fd, base, out, stack)
                finally:
                    os.close(dir_fd)
        finally:
            for fd, _ in stack:
                os.close(fd)
        log.debug("inode index: %d multiply-linked inodes", len(out))
        return out

    def _scan(self, dir_fd, base, out, stack) -> None:
        for entry in os.scandir(dir_fd):
            name = os.fsencode(entry.name)
            rel = base + b"/" + name if base else name
            if name.startswith(L.TMP_PREFIX):
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if self.rules.ignored(rel, is_dir):
                continue
            if is_dir:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                                 os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError:
                    continue
                stack.append((fd, rel))
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    out.setdefault((st.st_dev, st.st_ino), []).append(rel)
