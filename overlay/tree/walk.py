"""Safe resolution of workspace-relative paths under the root directory fd.

Every component is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the previous
one, starting at the root fd, so no symlink is ever followed and the walk cannot leave
the tree (DESIGN invariant 4).  A symlink where a directory is expected raises
``PathEscape``; a missing or non-directory component raises the ``OSError`` the kernel
gave (``ENOENT``/``ENOTDIR``), so callers can tell "not there" from "not allowed".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from rewindfs.store._errors import BadPath, PathEscape

__all__ = ["DirCache", "PathEscape", "check_components", "open_dir", "open_parent", "parent_of",
           "split"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_components(relpath: bytes) -> list[bytes]:
    """Split *relpath* into components; raise ``PathEscape``/``BadPath`` on bad shapes."""
    if not isinstance(relpath, bytes):
        raise BadPath(path=relpath, reason="not bytes")
    if relpath.startswith(b"/"):
        raise PathEscape(path=relpath, reason="absolute path")
    if b"\0" in relpath:
        raise BadPath(path=relpath, reason="contains NUL")
    if relpath == b"":
        return []
    parts = relpath.split(b"/")
    for part in parts:
        if part == b"..":
            raise PathEscape(path=relpath, reason="'..' component")
        if part in (b"", b"."):
            raise BadPath(path=relpath, reason="empty or '.' component")
    return parts


def split(relpath: bytes) -> tuple[bytes, bytes]:
    """``b"a/b/c"`` → ``(b"a/b", b"c")``; ``b"c"`` → ``(b"", b"c")``."""
    head, _, tail = relpath.rpartition(b"/")
    return head, tail


def _open_component(dir_fd: int, name: bytes, relpath: bytes) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        return os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                raise exc from None
            if stat.S_ISLNK(st.st_mode):
                raise PathEscape(path=relpath, reason=f"{os.fsdecode(name)!r} is a symlink") from None
        raise


def _walk(root_fd: int, parts: list[bytes], relpath: bytes) -> int:
    fd = os.dup(root_fd)
    try:
        for part in parts:
            nxt = _open_component(fd, part, relpath)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_parent(root_fd: int, relpath: bytes) -> tuple[int, bytes]:
    """Open the directory that holds *relpath*; return ``(dir_fd, name)``.

    The caller owns ``dir_fd`` and must close it.  ``relpath`` must name something
    below the root (not ``b""``).  The final component is not touched, so it may be a
    symlink, missing, or anything else.
    """
    parts = check_components(relpath)
    if not parts:
        raise BadPath(path=relpath, reason="the root has no parent")
    return _walk(root_fd, parts[:-1], relpath), parts[-1]


def open_dir(root_fd: int, relpath: bytes) -> int:
    """Open the directory *relpath* itself (``b""`` = a dup of the root fd)."""
    return _walk(root_fd, check_components(relpath), relpath)


@contextlib.contextmanager
def parent_of(root_fd: int, relpath: bytes):
    """``with parent_of(root_fd, p) as (dir_fd, name):`` — ``open_parent`` that closes."""
    dir_fd, name = open_parent(root_fd, relpath)
    try:
        yield dir_fd, name
    finally:
        os.close(dir_fd)


class DirCache:
    """Directory fds of one restore run, keyed by relpath, each reached by the same
    ``O_NOFOLLOW`` walk as ``open_dir`` (component by component, from the nearest cached
    ancestor, itself so reached from the root fd).

    Why it is safe: a cached fd names the directory *inode* that the walk found, never
    a path, so swapping a component for a symlink later cannot redirect it (the next
    walk through an uncached part still refuses the symlink).  If the real directory is
    renamed, the fd follows it; through the mount a directory cannot leave the tree
    (a rename across mounts is ``EXDEV``), so writes stay in the workspace — the same
    guarantee an uncached walk gives for the instant between its walk and its write.
    A directory the run removes must be ``forget``-ed (its fd, and those below it).

    Fds are *borrowed*: valid until the next ``trim``/``close``; ``forget`` retires
    them to be closed at ``trim``, so an fd still held by a pending batch stays valid.
    The cache never evicts on its own: the caller calls ``trim`` when it holds no
    borrowed fd, and checks ``full`` to decide when to get there.
    """

    def __init__(self, root_fd: int, limit: int = 256):
        self.root_fd, self.limit = root_fd, limit
        self._fds: dict[bytes, int] = {b"": root_fd}     # the root fd is not ours
        self._retired: list[int] = []

    def dir(self, relpath: bytes) -> int:
        """The borrowed fd of directory ``relpath`` (checked like ``open_dir``)."""
        return self._dir(relpath, relpath)

    def _dir(self, relpath: bytes, named: bytes) -> int:
        fd = self._fds.get(relpath)
        if fd is not None:
            return fd
        parts = check_components(relpath)
        prefixes = [b"/".join(parts[:i]) for i in range(len(parts) + 1)]
        at = len(parts)
        while prefixes[at] not in self._fds:    # the deepest cached ancestor ("" is)
            at -= 1
        fd = self._fds[prefixes[at]]
        for i in range(at, len(parts)):
            fd = _open_component(fd, parts[i], named)
            self._fds[prefixes[i + 1]] = fd
        return fd

    def parent(self, relpath: bytes) -> tuple[int, bytes]:
        """``open_parent`` with a borrowed fd: ``(dir_fd, name)``; do not close it."""
        if isinstance(relpath, bytes) and not relpath.startswith(b"/"):
            head, _, name = relpath.rpartition(b"/")
            fd = self._fds.get(head)    # keys are checked relpaths: only ``name`` is new
            if fd is not None and name not in (b"", b".", b"..") and b"\0" not in name:
                return fd, name
        parts = check_components(relpath)
        if not parts:
            raise BadPath(path=relpath, reason="the root has no parent")
        return self._dir(b"/".join(parts[:-1]), relpath), parts[-1]

    def forget(self, relpath: bytes) -> None:
        """``relpath`` was removed or replaced: drop it and everything cached below.
        Cheap when ``relpath`` is not cached: an entry's ancestors are always cached
        (walks insert them first, ``trim`` evicts whole subtrees)."""
        if relpath and relpath in self._fds:
            self._drop_subtree(relpath, self._retired)

    def _drop_subtree(self, relpath: bytes, into: list[int]) -> None:
        prefix = relpath + b"/"
        for key in [k for k in self._fds if k == relpath or k.startswith(prefix)]:
            into.append(self._fds.pop(key))

    @property
    def full(self) -> bool:
        return len(self._fds) > self.limit

    def trim(self) -> None:
        """Close retired fds and, above the limit, the oldest entries (each with its
        subtree)."""
        while len(self._fds) > self.limit:
            self._drop_subtree(next(k for k in self._fds if k), self._retired)
        for fd in self._retired:
            os.close(fd)
        self._retired = []

    def close(self) -> None:
        self.trim()
        for key, fd in list(self._fds.items()):
            if key:
                os.close(fd)
        self._fds = {b"": self.root_fd}
