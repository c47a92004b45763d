"""One entry of the real tree: its stat, kind, xattrs, content key, and rewindfs' temp names.

Everything takes a directory fd and one name in it (from ``tree.walk.open_parent``),
never a path string, and never follows a symlink.  Shared by the filesystem (``fs/``),
the capture and the restore engine (``rewind/``); no pyfuse3, no trio.

Temp names: the restore engine builds each landed file under ``.rewindfs~<epoch>~<hex>``
in the target directory and renames it into place.  Such a name is never looked up,
listed, captured or planned (``is_temp_path``), so a crash's leftovers cannot enter
history.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from rewindfs.store import INLINE_MAX, hash_fd
from rewindfs.store._preimage import DEVICES

TMP_PREFIX = b".rewindfs~"
OPEN_META = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# Namespaces a restore manages: extra names there are removed to match the target.
# security.*/system.* belong to the system (SELinux labels, ACL mirrors) and stay.
MANAGED_XATTR = (b"user.", b"trusted.")


def is_temp_path(path: bytes) -> bool:
    """True if a component of ``path`` is a restore temp name (``.rewindfs~…``): such a
    path is never captured, listed, restored or counted."""
    return path.startswith(TMP_PREFIX) or b"/" + TMP_PREFIX in path



# -- inspection ---------------------------------------------------------------------

def lstat_at(dir_fd: int, name: bytes) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


_KIND = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink",
         stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "chardev",
         stat.S_IFBLK: "blockdev"}


def kind_of(st: os.stat_result | None) -> str:
    """The ``PreImage`` kind of an entry (``absent`` for None)."""
    if st is None:
        return "absent"
    return _KIND.get(stat.S_IFMT(st.st_mode), "other")


def same_node(img, st: os.stat_result) -> bool:
    """True if the entry is ``img``'s kind and, for a device, its device number (which
    only a new ``mknod`` can change)."""
    return kind_of(st) == img.kind and (img.kind not in DEVICES or st.st_rdev == img.rdev)


# Planning and landing a rewind both ask "does this file already hold the target
# content?"; for a large file the second hash is a second full read.  Keys are kept
# per inode *version* — (dev, ino, size, mtime, ctime) — and trusted only when the
# file's ctime lies a safety margin before the hash began: ctime comes from a coarse
# clock, so a write landing in the same tick as the hash could otherwise leave the
# version unchanged (git's "racy clean" problem).
_KEY_CACHE_MIN_SIZE = 8 << 20
_KEY_CACHE_MARGIN_NS = 2_000_000_000
_key_cache: dict[tuple, bytes] = {}
# Every key computed, and the key of every large file landed, without the margin and
# without the ctime (a landing's rename changes it): only a *hint* for the store
# (``store.put_fd(fd, hint=…)`` / ``put_known`` try that dedup hit first and verify it
# by hash and bytes), never trusted to decide anything.  A redo thus finds the file
# the rewind landed already stored without linking or hashing it first.
_key_hints: dict[tuple, bytes] = {}


def _version(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def key_hint(st: os.stat_result) -> bytes | None:
    """The key last computed or landed for this file (inode, size, mtime), if any."""
    return _key_hints.get(_version(st)[:4])


def remember_hint(st: os.stat_result, key: bytes) -> None:
    if st.st_size > INLINE_MAX:    # smaller content is inline: a second hash is cheap
        if len(_key_hints) >= 256:
            _key_hints.clear()
        _key_hints[_version(st)[:4]] = key


def file_key(dir_fd: int, name: bytes) -> bytes:
    """xxh3-128 of a regular file's content (the store's blob key function)."""
    fd = os.open(name, OPEN_META, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        version = _version(st)
        if version in _key_cache:
            return _key_cache[version]
        began = time.time_ns()
        key, _size = hash_fd(fd)
        remember_hint(st, key)
        if st.st_size >= _KEY_CACHE_MIN_SIZE and st.st_ctime_ns < began - _KEY_CACHE_MARGIN_NS:
            if len(_key_cache) >= 256:
                _key_cache.clear()
            _key_cache[version] = key
        return key
    finally:
        os.close(fd)


def differs_from_blob(dir_fd: int, name: bytes, key: bytes, store) -> bool:
    """True if a sample of the file proves it does not hold blob ``key`` — the cheap
    early "written" for a large file before ``file_key`` reads all of it."""
    fd = os.open(name, OPEN_META, dir_fd=dir_fd)
    try:
        return store.blob_differs(key, fd)
    finally:
        os.close(fd)


def proc_path(dir_fd: int, name: bytes) -> bytes:
    # /proc/self/fd/N is followed to the directory itself; the last component is then
    # looked up with follow_symlinks as the caller asks — a safe *at() for xattr calls.
    return b"/proc/self/fd/%d/" % dir_fd + name


def xattrs_at(dir_fd: int, name: bytes) -> dict[bytes, bytes]:
    path = proc_path(dir_fd, name)
    out = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    for n in names:
        nb = os.fsencode(n)
        try:
            out[nb] = os.getxattr(path, nb, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
                raise
    return out


def can_chown() -> bool:
    return os.geteuid() == 0


def meta_equal(img, st: os.stat_result, xattrs: dict[bytes, bytes]) -> bool:
    """True if mode, mtime, xattrs (and owner, when we could change it) match ``img``."""
    if img.kind != "symlink" and stat.S_IMODE(st.st_mode) != img.mode:
        return False
    if st.st_mtime_ns != img.mtime_ns:
        return False
    if can_chown() and (st.st_uid, st.st_gid) != (img.uid, img.gid):
        return False
    return xattrs_match(img, xattrs)


def xattrs_match(img, xattrs: dict[bytes, bytes]) -> bool:
    """Every xattr of ``img`` is in ``xattrs`` with its value, and no other managed one."""
    wanted = dict(img.xattrs)
    for n, v in wanted.items():
        if xattrs.get(n) != v:
            return False
    return all(n in wanted for n in xattrs if n.startswith(MANAGED_XATTR))
