"""Comparing points and reading a file as it was: ``diff_points``, ``content_at``.

Read-only: nothing is written to the workspace or the store (a file's current content is
hashed in place to compare it, never stored).  A path's state at a point follows the
one rule of DESIGN.md (``store.state_at``; ``None`` there means "untouched since": the
current state, read through the root fd without following symlinks).
"""

from __future__ import annotations

import dataclasses
import errno
import os
from dataclasses import dataclass

from store import PreImage, RewindfsError, check_relpath

from . import _restore_land as L
from ._capture import snapshot
from ._resolve import open_parent

__all__ = ["Change", "NotAFile", "content_at", "diff_points", "state_now", "state_of"]


class NotAFile(RewindfsError):
    """{path!r} is {what} at point {point}; only files and symlinks have content."""

    code = "not-a-file"
    exit_code = 2


@dataclass(frozen=True)
class Change:
    path: bytes
    a: PreImage
    b: PreImage

    def to_dict(self) -> dict:
        return {"path": os.fsdecode(self.path), "a_kind": self.a.kind, "b_kind": self.b.kind,
                "a_size": self.a.size, "b_size": self.b.size,
                "a_mode": self.a.mode, "b_mode": self.b.mode}


def state_now(root_fd: int, store, path: bytes) -> PreImage:
    """The current image of ``path`` with its real content key (hashed, not stored).

    The tree may change while we look (diff runs beside a working agent): a file that
    is renamed away or removed between the ``lstat`` and the hash is looked at again,
    and one that keeps vanishing counts as absent."""
    for _attempt in range(_RACE_RETRIES):
        img = snapshot(root_fd, path, store, with_content=False)
        if img.kind != "file":
            return img
        try:
            dir_fd, name = open_parent(root_fd, path)
            try:
                return dataclasses.replace(img, blob=L.file_key(dir_fd, name))
            finally:
                os.close(dir_fd)
        except OSError as exc:   # gone, or its parent or itself swapped for a symlink
            if exc.errno not in _VANISHED:
                raise
    return PreImage.ABSENT


_RACE_RETRIES = 3
_VANISHED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def state_of(root_fd: int, store, ws: int, epoch: int | None, path: bytes) -> PreImage:
    """``path`` at point ``epoch`` (``None``: now)."""
    img = None if epoch is None else store.state_at(ws, epoch, path)
    return state_now(root_fd, store, path) if img is None else img


def _differs(a: PreImage, b: PreImage) -> bool:
    return (a.kind, a.blob, a.target, a.mode, a.xattrs) != (b.kind, b.blob, b.target, b.mode,
                                                           b.xattrs)


def diff_points(root_fd: int, store, ws: int, a: int, b: int | None, *, paths=None
                ) -> list[Change]:
    """Paths whose kind, content, target, mode or xattrs differ between points ``a`` and
    ``b`` (epoch ids; ``b=None``: the current tree).  Only paths touched since the older
    point can differ, so only those are looked at."""
    paths = None if paths is None else [check_relpath(p) for p in paths]
    lo = a if b is None else min(a, b)
    out = []
    for path, _epoch in store.changed_since(ws, lo, paths):
        ia = store.state_at(ws, a, path)
        ib = None if b is None else store.state_at(ws, b, path)
        if ia is None and ib is None:
            continue    # both sides are the current state: equal, nothing to hash
        if ia is None or ib is None:    # one side is now: hash the file once
            now = state_now(root_fd, store, path)
            ia, ib = (now, ib) if ia is None else (ia, now)
        if _differs(ia, ib):
            out.append(Change(path, ia, ib))
    return out


def content_at(root_fd: int, store, ws: int, epoch: int | None, path: bytes) -> bytes | None:
    """The bytes of ``path`` at point ``epoch`` (``None``: now) — a symlink's target;
    ``None`` if absent.  Raises ``NotAFile`` for a directory or fifo."""
    stored = None if epoch is None else store.state_at(ws, epoch, path)
    img = stored if stored is not None else snapshot(root_fd, path, store, with_content=False)
    if img.kind == "absent":
        return None
    if img.kind == "symlink":
        return img.target
    if img.kind != "file":
        raise NotAFile(path=path, what=f"a {img.kind}", point=epoch if epoch else "now")
    if stored is not None:
        return store.read_blob(img.blob)
    return _read_now(root_fd, path)


def _read_now(root_fd: int, path: bytes) -> bytes:
    dir_fd, name = open_parent(root_fd, path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
