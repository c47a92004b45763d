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

from store._errors import BadPath, PathEscape

__all__ = ["PathEscape", "check_components", "open_dir", "open_parent", "parent_of",
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
