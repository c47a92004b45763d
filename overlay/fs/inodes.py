"""The filesystem's inode table: FUSE inode ↔ real ``(st_dev, st_ino)`` ↔ known paths.

FUSE inode numbers are our own (a counter; ``ROOT_INODE`` for the root), never reused
within a mount, so a real inode number recycled by the backing filesystem never makes
the kernel confuse two files: when a real inode loses its last name we *detach* it
(drop the ``(dev, ino)`` key) and a new file with the same number gets a new FUSE inode.

An inode knows every path the overlay has seen for it (several for hard links): capture
of a write through a hard-linked file records all of them.  Directories keep an
``O_PATH`` fd (opened lazily, closed on forget/rmdir) so children are reached with one
``*at`` call; a directory fd follows its inode across renames.

Directory fds are a bounded cache, not one fd per known directory: the kernel keeps
every inode it looked up (a ``find`` over the workspace: thousands) and an fd per inode
ran the daemon out of fds.  At most ``limit`` fds stay open (``tree.fdbudget``: a quarter
of ``RLIMIT_NOFILE``), least recently used first out.  An fd handed out is *borrowed*
until the current FUSE request ends: every handler starts with ``begin_request()``, and
an fd used since then is never closed by eviction or ``shed()`` (LRU order makes those
a suffix of the cache).  When no room can be made, ``dir_fd`` answers None and the
caller walks from the root with an fd of its own (``tree.walk.open_parent``), as for a
directory the table does not know.

Only the trio thread touches the table (no locking).
"""

from __future__ import annotations

import collections
import os
import stat

import pyfuse3

from rewindfs.overlay.tree.fdbudget import EXHAUSTED, dir_cache_size

__all__ = ["Inode", "InodeTable"]

_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Inode:
    __slots__ = ("ino", "key", "paths", "nlookup", "is_dir", "dir_fd", "seen", "handles",
                 "wrote", "kernel_mtime_ns", "st", "used", "nocaps")

    def __init__(self, ino: int, key, is_dir: bool):
        self.ino = ino
        self.key = key                  # (st_dev, st_ino) or None once detached
        self.paths: dict[bytes, None] = {}   # ordered set of known names
        self.nlookup = 0
        self.is_dir = is_dir
        self.dir_fd: int | None = None
        self.seen = None                # epoch token whose captures cover all paths
        self.handles: set[int] = set()  # open file handles (fstat for unlinked files)
        self.wrote = False              # data written since the kernel last pushed times
        self.kernel_mtime_ns = None     # the mtime the kernel last pushed (writeback cache)
        self.st = None                  # the last stat result sent to the kernel
        self.used = 0                   # the request that last borrowed dir_fd
        self.nocaps = False             # known to have no security.capability xattr

    def names(self, st: os.stat_result) -> bool:
        """*st* is this inode: the same ``(dev, ino)`` and still a directory or still
        not one.  A number freed behind our back (a rewind's landing) may come back for
        a new entry of another kind before the old name was processed."""
        return (st.st_dev, st.st_ino) == self.key and stat.S_ISDIR(st.st_mode) == self.is_dir

    def changed_behind(self) -> None:
        """The real inode changed behind the kernel and the handlers (a rewind landed on
        it): what they remember of it — captures, the kernel's pushed mtime, "no
        capability xattr" — no longer holds."""
        self.seen = None
        self.nocaps = False
        self.kernel_mtime_ns = None

    @property
    def path(self) -> bytes | None:
        return next(iter(self.paths), None)

    def __repr__(self):
        return f"<Inode {self.ino} {list(self.paths)!r} n={self.nlookup}>"


def child(parent: bytes, name: bytes) -> bytes:
    return parent + b"/" + name if parent else name


class InodeTable:
    """Maps and bookkeeping; no I/O except opening/closing directory fds."""

    def __init__(self, root_fd: int, limit: int | None = None):
        st = os.fstat(root_fd)
        self.root_fd = root_fd
        self.root = Inode(pyfuse3.ROOT_INODE, (st.st_dev, st.st_ino), True)
        self.root.paths[b""] = None
        self.root.nlookup = 1 << 62
        self.root.dir_fd = root_fd
        self.inodes: dict[int, Inode] = {self.root.ino: self.root}
        self.by_key: dict[tuple[int, int], Inode] = {self.root.key: self.root}
        self.by_path: dict[bytes, Inode] = {b"": self.root}
        self._next = pyfuse3.ROOT_INODE + 1
        self.limit = dir_cache_size() if limit is None else limit
        self._open: collections.OrderedDict[Inode, None] = collections.OrderedDict()  # LRU
        self.tick = 1                   # the current request (see begin_request)

    def __getitem__(self, ino: int) -> Inode:
        return self.inodes[ino]

    def known(self, path: bytes, st: os.stat_result) -> Inode:
        """The inode for real entry *st* now at *path* (created if new); lookup count unchanged."""
        key = (st.st_dev, st.st_ino)
        node = self.by_key.get(key)
        if node is not None and not node.names(st):
            self.detach(node)           # the number came back for an entry of another kind
            node = None
        if node is None:
            node = Inode(self._next, key, stat.S_ISDIR(st.st_mode))
            self._next += 1
            self.inodes[node.ino] = node
            self.by_key[key] = node
        self.bind(path, node)
        return node

    def bind(self, path: bytes, node: Inode) -> None:
        """Record that *path* names *node* (dropping whatever it named before)."""
        old = self.by_path.get(path)
        if old is node:
            return
        if old is not None:
            old.paths.pop(path, None)
            old.seen = None
        self.by_path[path] = node
        node.paths[path] = None
        node.seen = None

    def unbind(self, path: bytes, *, gone: bool = False) -> Inode | None:
        """*path* no longer names its inode; ``gone`` = the real inode lost its last name."""
        node = self.by_path.pop(path, None)
        if node is None:
            return None
        node.paths.pop(path, None)
        node.seen = None
        if gone or (node.is_dir and not node.paths):
            self.detach(node)
        return node

    def detach(self, node: Inode) -> None:
        if node.key is not None and self.by_key.get(node.key) is node:
            del self.by_key[node.key]
        node.key = None
        if node.dir_fd is not None and node is not self.root:
            self._close_dir(node)
        for path in list(node.paths):
            if self.by_path.get(path) is node:
                del self.by_path[path]
        node.paths.clear()

    def forget(self, ino: int, count: int) -> None:
        node = self.inodes.get(ino)
        if node is None or node is self.root:
            return
        node.nlookup -= count
        if node.nlookup <= 0 and not node.handles:
            self.drop(node)

    def drop(self, node: Inode) -> None:
        """Remove a node the kernel no longer references."""
        del self.inodes[node.ino]
        self.detach(node)

    def move(self, old: bytes, new: bytes, is_dir: bool) -> None:
        """Rename bookkeeping: *old* (and, for a directory, everything below) → *new*."""
        self.unbind(new)
        node = self.by_path.get(old)
        if node is not None:
            self.by_path.pop(old)
            node.paths.pop(old, None)
            self.bind(new, node)
        if is_dir:
            prefix = old + b"/"
            cut = len(old)
            for path in [p for p in self.by_path if p.startswith(prefix)]:
                node = self.by_path.pop(path)
                node.paths.pop(path, None)
                self.bind(new + path[cut:], node)

    def exchange(self, a: bytes, b: bytes) -> None:
        """RENAME_EXCHANGE bookkeeping: the subtrees at *a* and *b* swap places."""
        tmp = b"\0xchg"  # cannot be a real path (NUL), so it never collides
        na, nb = self.by_path.get(a), self.by_path.get(b)
        self.move(a, tmp, na is None or na.is_dir)
        self.move(b, a, nb is None or nb.is_dir)
        self.move(tmp, b, na is None or na.is_dir)

    def begin_request(self) -> None:
        """A new request starts: fds borrowed before it may be closed from now on."""
        self.tick += 1

    def dir_fd(self, path: bytes) -> int | None:
        """A cached ``O_PATH`` fd for directory *path* (borrowed until the request ends),
        or None if it is not in the table, is stale, or no fd can be had."""
        node = self.by_path.get(path)
        if node is None or not node.is_dir:
            return None
        fd = node.dir_fd
        if fd is not None:
            if node is not self.root:
                node.used = self.tick
                self._open.move_to_end(node)
            return fd
        # The deepest ancestor that has an fd (the root has), then down one name at a
        # time — a loop, not recursion: a path may be ~2,000 directories deep.
        chain = [(path, node)]
        head = path
        while True:
            head = head.rpartition(b"/")[0]
            parent = self.by_path.get(head)
            if parent is None or not parent.is_dir:
                return None
            if parent.dir_fd is not None:
                break
            chain.append((head, parent))
        fd = self.dir_fd(head)          # borrow it first: making room must not close it
        if not self._make_room(len(chain)):
            return None
        for sub, sub_node in reversed(chain):
            fd = self._open_child(fd, sub.rpartition(b"/")[2], sub_node)
            if fd is None:
                return None
        return fd

    def _open_child(self, parent_fd: int, name: bytes, node: Inode) -> int | None:
        try:
            fd = os.open(name, _PATH_DIR, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno not in EXHAUSTED or not self.shed():
                return None
            try:
                fd = os.open(name, _PATH_DIR, dir_fd=parent_fd)
            except OSError:
                return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return None
        if (st.st_dev, st.st_ino) != node.key:  # the table is stale for this name
            os.close(fd)
            return None
        node.dir_fd = fd
        node.used = self.tick
        self._open[node] = None
        return fd

    def _make_room(self, n: int) -> bool:
        """Evict least recently used fds until *n* more fit; False if the rest are all
        borrowed by the current request."""
        lru = self._open
        while len(lru) + n > self.limit:
            if not lru:
                return False
            oldest = next(iter(lru))
            if oldest.used == self.tick:
                return False
            self._close_dir(oldest)
        return True

    def _close_dir(self, node: Inode) -> None:
        self._open.pop(node, None)
        fd, node.dir_fd = node.dir_fd, None
        os.close(fd)

    def shed(self) -> int:
        """Close every cached fd not borrowed by the current request (fds ran out);
        returns how many were closed."""
        closed = 0
        while self._open:
            oldest = next(iter(self._open))
            if oldest.used == self.tick:
                break
            self._close_dir(oldest)
            closed += 1
        return closed

    def statistics(self) -> dict:
        return {"inodes": len(self.inodes), "paths": len(self.by_path),
                "dir_fds": len(self._open), "dir_fd_limit": self.limit}
