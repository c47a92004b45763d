"""Capture: turn the real state of a workspace path into a ``PreImage`` (+ blob).

One home for both users: the filesystem calls ``capture`` *before* a mutation reaches
the real file (write-ahead, DESIGN invariant 1), and the restore engine calls it for its
own pre-images in the rewind epoch.

Guarantees:

- Nothing is followed: the path is resolved under the root fd with ``O_NOFOLLOW``
  components (``tree.walk``), the final entry is ``lstat``-ed, a regular file is opened
  ``O_NOFOLLOW`` and checked to be the inode that was stat-ed.
- ``capture`` returns only after ``store.record`` committed (one LMDB write txn for
  all paths), so when it returns the caller may mutate.  If it raises, nothing of the
  caller's mutation may happen (fail closed, invariant 2).
- A regular file's content is streamed into the store (``store.put_fd``); the store
  deduplicates, so an unchanged large file costs one read and no second copy.

- Every file type has its image: a fifo, socket or device node is recorded as what it
  is (kind, mode, owner, mtime, xattrs and a device's number), never opened, so a
  rewind gives it back like ``rsync -a`` would and never deletes it as ``absent``.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os
import stat

from rewindfs.store import INLINE_MAX
from rewindfs.store._errors import PathEscape
from rewindfs.store._preimage import DEVICES, PreImage

from rewindfs.overlay.tree.fdbudget import share
from rewindfs.overlay.tree.walk import open_dir, open_parent, parent_of
from rewindfs.overlay.tree.meta import TMP_PREFIX

_TMP_NAME = os.fsdecode(TMP_PREFIX)

log = logging.getLogger(__name__)

__all__ = ["capture", "capture_images", "rename_paths", "snapshot", "snapshot_at", "subtree"]

_MISSING = (errno.ENOENT, errno.ENOTDIR)


def read_xattrs(dir_fd: int, name: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """Every xattr of *name* in *dir_fd* (not following a symlink), sorted by name."""
    # The directory itself by its fd; an entry through /proc without following it.
    path, kw = (b"/proc/self/fd/%d/%s" % (dir_fd, name), {"follow_symlinks": False}) \
        if name else (dir_fd, {})
    try:
        names = os.listxattr(path, **kw)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM, errno.EACCES):
            return ()
        raise
    out = []
    for xname in names:
        try:
            value = os.getxattr(path, xname, **kw)
        except OSError as exc:
            if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EPERM, errno.EACCES):
                continue
            raise
        out.append((os.fsencode(xname), value))
    out.sort()
    return tuple(out)


class _Pending:
    """The blob of a file whose content waits in a ``_ContentBatch``."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _ContentBatch:
    """Files opened while snapshotting, put into the store together (``store.put_fds``:
    their small contents in one transaction instead of one each).  Their images carry a
    ``_Pending`` blob until ``put`` replaces it with the key.  Bounded in open fds (with
    a restore run's directory fds, at most a quarter of the limit, well under
    ``RLIMIT_NOFILE``) and in bytes held for the put."""

    MAX_FILES = 256     # at most; 1/16 of the fd limit under a lower one (_fdbudget)
    MAX_BYTES = 64 << 20

    def __init__(self):
        self.fds: list[int] = []
        self.nbytes = 0
        self.max_files = share(16, self.MAX_FILES)

    def hold(self, fd: int, size: int) -> _Pending:
        self.fds.append(fd)
        self.nbytes += size
        return _Pending(len(self.fds) - 1)

    @property
    def full(self) -> bool:
        return len(self.fds) >= self.max_files or self.nbytes >= self.MAX_BYTES

    def put(self, store, entries: list) -> list:
        """Store the held contents; return *entries* (path, image) with real keys."""
        if not self.fds:
            return entries
        try:
            done = store.put_fds(self.fds)
        finally:
            self.close()
        return [(path, _with_blob(img, done)) for path, img in entries]

    def close(self) -> None:
        fds, self.fds, self.nbytes = self.fds, [], 0
        for fd in fds:
            os.close(fd)


def _with_blob(img: PreImage, done: list) -> PreImage:
    if not isinstance(img.blob, _Pending):
        return img
    key, size = done[img.blob.index]
    return dataclasses.replace(img, blob=key, size=size)


def _file_content(dir_fd: int, name: bytes, st: os.stat_result, store,
                  batch: _ContentBatch | None = None, put=None) -> tuple:
    """(key, size) of the file's content, put into the store now (by ``put(dir_fd,
    name, fd)`` if given) — or, with ``batch`` and a small file, (``_Pending``, size)
    and the open fd handed to the batch."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                 dir_fd=dir_fd)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(errno.EAGAIN, "file replaced while capturing")
        # a larger file would get its own put inside ``put_fds`` anyway, so a ``put``
        # hook (the rewind's adoption of large files) takes it directly
        if batch is not None and (put is None or now.st_size <= INLINE_MAX):
            pending, fd = batch.hold(fd, now.st_size), None     # the batch closes it
            return pending, now.st_size
        return store.put_fd(fd) if put is None else put(dir_fd, name, fd)
    finally:
        if fd is not None:
            os.close(fd)


def snapshot_at(dir_fd: int, name: bytes, store, *, with_content: bool = True,
                batch: _ContentBatch | None = None, put=None) -> PreImage:
    """The image of entry *name* in directory *dir_fd* (``name == b""``: the dir itself).
    With ``batch`` a small file's content is left to ``batch.put`` (its blob is
    pending).  ``put(dir_fd, name, fd)``, if given, stores a regular file's content
    instead of ``store.put_fd(fd)`` (``fd``: the file opened without following, checked
    to be the inode stat-ed) and returns (key, size)."""
    try:
        if name:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        else:
            st = os.fstat(dir_fd)
    except OSError as exc:
        if exc.errno in _MISSING:
            return PreImage.ABSENT
        raise
    common = {"mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
              "mtime_ns": st.st_mtime_ns}
    fmt = stat.S_IFMT(st.st_mode)
    if fmt == stat.S_IFDIR:
        return PreImage("dir", xattrs=read_xattrs(dir_fd, name), **common)
    # any non-directory can have hard links (fsstress links symlinks and devices too)
    common["link_group"] = b"%d:%d" % (st.st_dev, st.st_ino) if st.st_nlink > 1 else None
    if fmt == stat.S_IFREG:
        key, size = (_file_content(dir_fd, name, st, store, batch, put) if with_content
                     else (b"\0" * 16, st.st_size))
        return PreImage("file", size=size, xattrs=read_xattrs(dir_fd, name), blob=key,
                        **common)
    if fmt == stat.S_IFLNK:
        target = os.readlink(name, dir_fd=dir_fd)
        return PreImage("symlink", size=len(target), xattrs=read_xattrs(dir_fd, name),
                        target=target, **common)
    kind = _SPECIAL_KIND.get(fmt)
    if kind is None:    # no other file type exists on Linux; never guessed as absent
        raise OSError(errno.EINVAL, f"unknown file type {fmt:o}", os.fsdecode(name))
    rdev = st.st_rdev if kind in DEVICES else 0
    return PreImage(kind, xattrs=read_xattrs(dir_fd, name), rdev=rdev, **common)


_SPECIAL_KIND = {stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "chardev",
                 stat.S_IFBLK: "blockdev"}


def snapshot(root_fd: int, relpath: bytes, store, *, with_content: bool = True) -> PreImage:
    """Stat the real *relpath* (never following symlinks) and return its ``PreImage``.

    A regular file's content is streamed into the store unless ``with_content`` is
    false (then ``blob`` is a placeholder of 16 zero bytes, for dry runs).  ``ABSENT``
    if the path (or a parent) does not exist.  A symlinked parent raises ``PathEscape``.
    """
    if relpath == b"":
        fd = open_dir(root_fd, b"")
        try:
            return snapshot_at(fd, b"", store, with_content=with_content)
        finally:
            os.close(fd)
    try:
        dir_fd, name = open_parent(root_fd, relpath)
    except OSError as exc:
        if exc.errno in _MISSING:
            return PreImage.ABSENT
        raise
    try:
        return snapshot_at(dir_fd, name, store, with_content=with_content)
    finally:
        os.close(dir_fd)


def capture(root_fd: int, store, ws: int, epoch_id: int, relpaths, *,
            parent=None) -> int | None:
    """Record the current state of every path in *relpaths* not yet recorded in the epoch.

    Write-ahead: returns after one committed ``store.record`` call; raises (``StoreFull``,
    ``StoreError``, ``OSError``) with nothing recorded on failure.  Returns that commit's
    ``generation`` (see ``store.Recorded``), None if every path was recorded already
    (those keep their first image: nothing committed).
    ``parent(relpath)``, if given, is a context manager yielding ``(dir_fd, name)`` for
    a path (the filesystem passes its cached directory fds); the default walks from the
    root with ``open_parent``.  A path below a symlink is recorded ``absent`` (it names
    no entry of the workspace; nothing is followed).
    """
    todo = _unrecorded(store, ws, epoch_id, relpaths)
    if not todo:
        return None
    if parent is None:
        parent = functools.partial(parent_of, root_fd)
    entries = [(path, _snapshot_via(parent, root_fd, path, store)) for path in todo]
    return store.record(ws, epoch_id, entries).generation


def record_absent(store, ws: int, epoch_id: int, relpaths) -> int | None:
    """``capture`` of paths the caller has just seen not to exist (the name a create
    makes): their pre-image is ``absent``, recorded without looking again or asking the
    store first.  The same contract as ``capture``; a path already recorded in the
    epoch keeps its first image (``record`` never overwrites one)."""
    entries = [(path, PreImage.ABSENT) for path in dict.fromkeys(relpaths)]
    return store.record(ws, epoch_id, entries).generation


def images(root_fd: int, store, relpaths, *, parent) -> list[tuple[bytes, PreImage]]:
    """``(path, image)`` of each distinct path of *relpaths* as it is now, contents in
    the store, recorded nowhere yet: for a caller that commits them in the same
    transaction as something else (the epoch of a turn mark, ``Store.begin_turn``'s
    ``records``).  Raises like ``capture`` (``StoreFull``, ``StoreError``, ``OSError``)."""
    return [(path, _snapshot_via(parent, root_fd, path, store))
            for path in dict.fromkeys(relpaths)]


def _unrecorded(store, ws: int, epoch_id: int, relpaths) -> list[bytes]:
    """The distinct paths of *relpaths*, in order, with no pre-image in the epoch yet."""
    return store.unrecorded(ws, epoch_id, dict.fromkeys(relpaths))


def capture_images(root_fd: int, store, ws: int, epoch_id: int, relpaths, *,
                   parent_at, put_file=None) -> dict[bytes, PreImage]:
    """``capture`` for the restore engine: the same write-ahead contract (returns after
    one committed ``store.record``; raises with nothing recorded), but returns
    ``{path: image}`` of the paths newly recorded, in order, so the caller can judge
    their state without looking again.  ``parent_at(relpath)`` returns ``(dir_fd,
    name)`` with a *borrowed* fd (``tree.walk.DirCache.parent``), not closed here.

    File contents go into the store in batches (``_ContentBatch``), all before the
    record: a rewind of 10,000 small files makes a few dozen blob commits, not 10,000.
    A failed batch raises like a failed ``put_fd`` (nothing recorded).
    ``put_file(relpath, dir_fd, name, fd)``, if given, stores each regular file larger
    than a batch takes (see ``snapshot_at``'s ``put``)."""
    todo = _unrecorded(store, ws, epoch_id, relpaths)
    if not todo:
        return {}
    entries = _snapshot_batched(parent_at, root_fd, todo, store, put_file)
    fresh = store.record(ws, epoch_id, entries).fresh
    return {path: img for (path, img), new in zip(entries, fresh) if new}


def _snapshot_batched(parent_at, root_fd: int, paths, store, put_file=None) -> list:
    entries, start, batch = [], 0, _ContentBatch()
    try:
        for path in paths:
            entries.append((path, _snapshot_borrowed(parent_at, root_fd, path, store, batch,
                                                     put_file)))
            if batch.full:
                entries[start:] = batch.put(store, entries[start:])
                start = len(entries)
        entries[start:] = batch.put(store, entries[start:])
    finally:
        batch.close()
    return entries


def _snapshot_borrowed(parent_at, root_fd: int, relpath: bytes, store,
                       batch: _ContentBatch | None = None, put_file=None) -> PreImage:
    if relpath == b"":
        return snapshot(root_fd, relpath, store)
    try:
        dir_fd, name = parent_at(relpath)
    except OSError as exc:
        if exc.errno in _MISSING:
            return PreImage.ABSENT
        raise
    put = None if put_file is None else functools.partial(put_file, relpath)
    return snapshot_at(dir_fd, name, store, batch=batch, put=put)


def _snapshot_via(parent, root_fd: int, relpath: bytes, store) -> PreImage:
    if relpath == b"":
        return snapshot(root_fd, relpath, store)
    try:
        with parent(relpath) as (dir_fd, name):
            return snapshot_at(dir_fd, name, store)
    except OSError as exc:
        if exc.errno in _MISSING:
            return PreImage.ABSENT
        raise
    except PathEscape:
        # A component is a symlink (a checked relpath has no other way to escape), so
        # the path names no entry of the workspace: absent, as below a file.  A rename
        # exchanging a directory with a symlink lists the directory's names under the
        # symlink's name; they have no state there before the exchange.
        return PreImage.ABSENT


def rename_paths(root_fd: int, old: bytes, new: bytes, old_is_dir: bool,
                 new_is_dir: bool | None, *, exchange: bool = False) -> list:
    """Every ``(path, is_dir)`` a rename changes, to capture before it happens.

    The moved subtree at its source *and* at its destination (where each path's state
    is usually ``absent``), and an overwritten destination (``new_is_dir`` is None when
    nothing is there).  With ``exchange`` both subtrees move, so both are listed at both
    places.
    """
    items = []
    for p, d in subtree(root_fd, old, old_is_dir):
        items += [(p, d), (new + p[len(old):], d)]
    if new_is_dir is not None:
        for p, d in subtree(root_fd, new, new_is_dir):
            items.append((p, d))
            if exchange:
                items.append((old + p[len(new):], d))
    return items


def subtree(root_fd: int, relpath: bytes, is_dir: bool | None = None):
    """Yield ``(path, is_dir)`` for *relpath* and, if it is a real directory, every path
    below it (pre-order).  Symlinks are listed, never entered; vanished paths are skipped,
    and so are a rewind's temp names (``.rewindfs~…``, never part of the tree).
    """
    if is_dir is None:
        try:
            is_dir = stat.S_ISDIR(_lstat(root_fd, relpath).st_mode)
        except OSError:
            is_dir = False
    yield relpath, is_dir
    if not is_dir:
        return
    try:
        fd = open_dir(root_fd, relpath)
    except (OSError, PathEscape):
        return
    stack = [(fd, relpath)]
    try:
        while stack:
            dfd, base = stack.pop()
            try:
                for entry in os.scandir(dfd):
                    if entry.name.startswith(_TMP_NAME):
                        continue    # a running rewind's temp file: never captured
                    child = (base + b"/" if base else b"") + os.fsencode(entry.name)
                    sub = entry.is_dir(follow_symlinks=False)
                    yield child, sub
                    if sub:
                        try:
                            cfd = os.open(os.fsencode(entry.name), os.O_RDONLY |
                                          os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                          dir_fd=dfd)
                        except OSError:
                            continue
                        stack.append((cfd, child))
            finally:
                os.close(dfd)
    finally:
        for dfd, _ in stack:
            os.close(dfd)


def _lstat(root_fd: int, relpath: bytes) -> os.stat_result:
    if relpath == b"":
        return os.fstat(root_fd)
    dir_fd, name = open_parent(root_fd, relpath)
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(dir_fd)
