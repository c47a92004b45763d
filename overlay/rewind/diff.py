"""Comparing points and reading a file as it was: ``diff_points``, ``content_at``,
``open_content`` (the same, as a stream of chunks: the daemon's ``show``).

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

from rewindfs.store import PreImage, check_relpath

from rewindfs.overlay.tree import meta
from rewindfs.overlay.capture import snapshot
from rewindfs.overlay.tree.walk import open_parent
from rewindfs.overlay.errors import NotAFile

__all__ = ["Change", "Content", "content_at", "diff_points", "open_content", "state_now", "state_of"]


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
    is renamed away or removed between the ``lstat`` and the read of its xattrs or its
    hash is looked at again, and one that keeps vanishing counts as absent."""
    for _attempt in range(_RACE_RETRIES):
        try:    # the entry may go between its lstat and the read of its xattrs
            img = snapshot(root_fd, path, store, with_content=False)
        except OSError as exc:
            if exc.errno not in _VANISHED:
                raise
            continue
        if img.kind != "file":
            return img
        try:
            dir_fd, name = open_parent(root_fd, path)
            try:
                return dataclasses.replace(img, blob=meta.file_key(dir_fd, name))
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
    return ((a.kind, a.blob, a.target, a.rdev, a.mode, a.xattrs)
            != (b.kind, b.blob, b.target, b.rdev, b.mode, b.xattrs))


def diff_points(root_fd: int, store, ws: int, a: int, b: int | None, *, paths=None
                ) -> list[Change]:
    """Paths whose kind, content, target, device number, mode or xattrs differ between
    points ``a`` and ``b`` (epoch ids; ``b=None``: the current tree).  Only paths
    touched since the older point can differ, so only those are looked at."""
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
    ``None`` if absent.  Raises ``NotAFile`` for a directory or special file."""
    content = open_content(root_fd, store, ws, epoch, path)
    if content is None:
        return None
    with content:
        return b"".join(content.chunks)


class Content:
    """A file's content at a point, open and read in chunks of at most ``chunk`` bytes.

    ``size`` is the size recorded (stored points) or seen by ``fstat`` at open (now);
    ``chunks`` yields ``bytes``.  The source is open once this exists (the blob file,
    or the current file through the root fd, ``O_NOFOLLOW``), so reading it needs no
    lock: a blob is immutable and one that gc unlinks meanwhile stays readable; the
    current file may change while it is read (a live file, as ``cat`` sees it).  A
    stored blob is verified as it goes: ``BlobCorrupt`` comes after its last chunk,
    and whoever consumed the chunks must then treat them as invalid.  ``close()``
    (or ``with``) releases the source, also one never read."""

    def __init__(self, size: int, source: "_Inline | _Blob | _FdChunks", *, chunk: int):
        self.size = size
        self._source = source
        self.chunks = _pieces(source, chunk)

    def close(self) -> None:
        self.chunks.close()
        self._source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


SHOW_CHUNK = 192 * 1024   # 256 KiB once in base64: one protocol line stays far below 1 MiB


def open_content(root_fd: int, store, ws: int, epoch: int | None, path: bytes, *,
                 chunk: int = SHOW_CHUNK) -> Content | None:
    """``content_at`` as an open ``Content`` (``None`` if absent; ``NotAFile`` for a
    directory or special file); memory stays at one chunk whatever the file's size."""
    stored = None if epoch is None else store.state_at(ws, epoch, path)
    img = stored if stored is not None else snapshot(root_fd, path, store, with_content=False)
    if img.kind == "absent":
        return None
    if img.kind == "symlink":
        return Content(len(img.target), _Inline(img.target), chunk=chunk)
    if img.kind != "file":
        raise NotAFile(path=path, what=f"a {img.kind}", point=f"e{epoch}" if epoch else "now")
    if stored is not None:
        return Content(img.size, _Blob(store.iter_blob(img.blob)), chunk=chunk)
    now = _FdChunks(_open_now(root_fd, path), chunk)
    return Content(now.size, now, chunk=chunk)


class _Inline:
    """A symlink's target as a source: one chunk, nothing to release."""

    def __init__(self, data: bytes):
        self._data = data

    def __iter__(self):
        yield self._data

    def close(self) -> None:
        pass


class _Blob:
    """A verified blob stream whose file is open from the start (the first chunk is
    read at once: ``BlobMissing`` raises here, and a later gc cannot take it away)."""

    def __init__(self, gen):
        self._gen = gen
        self._head = next(gen, None)

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        if self._head is not None:
            head, self._head = self._head, None
            return head
        return next(self._gen)

    def close(self) -> None:
        self._head = None
        self._gen.close()


class _FdChunks:
    """Chunks read from an open fd; the fd is closed at EOF or by ``close()``."""

    def __init__(self, fd: int, size: int):
        self._fd, self._size = fd, size
        self.size = os.fstat(fd).st_size

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        if self._fd < 0:
            raise StopIteration
        chunk = os.read(self._fd, self._size)
        if not chunk:
            self.close()
            raise StopIteration
        return chunk

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _pieces(chunks, size: int):
    """Re-cut *chunks* into pieces of at most *size* bytes (never the whole at once)."""
    for c in chunks:
        if len(c) <= size:
            yield c
        else:
            view = memoryview(c)
            for i in range(0, len(c), size):
                yield bytes(view[i:i + size])


def _open_now(root_fd: int, path: bytes) -> int:
    dir_fd, name = open_parent(root_fd, path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return fd
