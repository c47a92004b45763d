"""Hard links across the edge of a plan: which other names share an inode (a file's,
or a symlink's, fifo's, socket's or device's: every non-directory can have links).

A plan lists only touched paths, but an inode's other names may lie outside it: a name
deleted after the point was touched, its surviving twin was not.  Three things need the
other names, and all are rare, so the index is built lazily by one walk of the tree
(under the root fd, never following symlinks, skipping ignored paths):

- the filesystem (``fs.ops``), before a change reaches a hard-linked inode through one
  name: every other name of it is captured too (DESIGN invariants 1 and 13).  The mount
  is an overmount, so the daemon knows only the names the kernel looked up; a file
  linked before mounting and written through one name has names it never saw.  Finding
  them needs a look at the tree — there is no other record of a link's other names —
  and the choice is *when*:

  * a walk at mount time would cost every mount a full scan (a large tree: seconds)
    although most sessions never write a multiply-linked file;
  * a store-kept index would still need that first scan, and goes stale with every
    change made while unmounted, so it would have to be checked anyway;
  * a walk "bounded by what the turn touches" cannot exist: the other name may be in
    any directory.

  So the daemon keeps one ``InodeIndex`` per mount, built by one walk the first time a
  capture meets an inode with ``st_nlink`` above the names the daemon knows, and kept
  current from then on by the daemon's own ``link``/``unlink``/``rename`` (``add``,
  ``discard``, ``moved``, ``exchanged``) — while mounted, every change to the tree's
  names passes through those handlers, except a rewind's landings, after which the
  daemon drops the index (rebuilt lazily at the next need).  A mount whose agent never
  touches a hard-linked file never walks, and a turn mark never does.  Names the walk
  cannot see (outside the workspace, under ignored paths) are not captured — they are
  not the workspace's.  Capturing a name too many is harmless (its pre-image is its
  state at the start of the epoch, as for any capture), so a stale entry costs a
  capture, never a wrong result;
- capturing (restore): before a rewind drops or replaces a name whose inode has more links, every
  other name of it is captured too (its link count is about to change), so the rewind
  epoch itself is complete and a redo rebuilds the same link structure;
- landing: a name whose target belongs to hard-link group ``b"dev:ino"`` links to a
  surviving name of that inode when no name of the group was landed in this run — after
  checking that the survivor still holds the target content (inode numbers get reused).
"""

from __future__ import annotations

import logging
import os

from rewindfs.overlay.tree import meta

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
    """(dev, ino) → relative names of non-directories with more than one link."""

    def __init__(self, root_fd: int, rules):
        self.root_fd, self.rules = root_fd, rules
        self._map: dict[tuple[int, int], list[bytes]] | None = None

    def names(self, dev: int, ino: int) -> list[bytes]:
        if self._map is None:
            self._map = self._build()
        return list(self._map.get((dev, ino), ()))

    # -- kept current by the filesystem (a no-op until the first walk) ----------------

    @property
    def built(self) -> bool:
        """True once the walk ran (until then there is nothing to keep current)."""
        return self._map is not None

    def add(self, key: tuple[int, int], path: bytes) -> None:
        """*path* now names inode *key* (a hard link was made)."""
        if self._map is not None:
            names = self._map.setdefault(key, [])
            if path not in names:
                names.append(path)

    def discard(self, key: tuple[int, int], path: bytes) -> None:
        """*path* no longer names inode *key* (unlinked, or renamed over)."""
        if self._map is not None and path in self._map.get(key, ()):
            self._map[key].remove(path)
            if not self._map[key]:
                del self._map[key]

    def moved(self, old: bytes, new: bytes, key: tuple[int, int] | None = None) -> None:
        """*old* is now *new*: a file of inode *key* (one entry looked at), or with
        ``key`` None a directory and everything below it (every entry looked at)."""
        if self._map is None:
            return
        if key is not None:
            names = self._map.get(key, [])
            if old in names:
                names[names.index(old)] = new
            return
        prefix, cut = old + b"/", len(old)
        for names in self._map.values():
            for i, p in enumerate(names):
                if p == old or p.startswith(prefix):
                    names[i] = new + p[cut:]

    def exchanged(self, a: bytes, b: bytes) -> None:
        """RENAME_EXCHANGE: the subtrees at *a* and *b* swapped places."""
        if self._map is None:
            return
        pa, pb = a + b"/", b + b"/"
        for names in self._map.values():
            for i, p in enumerate(names):
                if p == a or p.startswith(pa):
                    names[i] = b + p[len(a):]
                elif p == b or p.startswith(pb):
                    names[i] = a + p[len(b):]

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
            if name.startswith(meta.TMP_PREFIX):
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
            else:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue    # removed meanwhile (a rewind landing beside the daemon)
                if st.st_nlink > 1:
                    out.setdefault((st.st_dev, st.st_ino), []).append(rel)
