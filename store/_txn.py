"""Transactions with the store's error translation.

Every LMDB or file-system failure leaves the store as a ``StoreError``; a full map or
a full disk as ``StoreFull`` (the overlay turns it into ``ENOSPC`` and fails closed).
A write transaction either commits entirely or not at all (LMDB), so "nothing changed"
holds for every error raised out of ``write()``.
"""

from __future__ import annotations

import contextlib
import errno
import os

import lmdb

from ._errors import RewindfsError, StoreError, StoreFull

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


@contextlib.contextmanager
def translate():
    """Map lmdb/OS errors raised inside the block to the store's error classes."""
    try:
        yield
    except RewindfsError:
        raise
    except lmdb.MapFullError as exc:
        raise StoreFull("the index map is full") from exc
    except lmdb.Error as exc:
        # py-lmdb reports a failed write(2) as a plain Error carrying strerror
        if any(os.strerror(e) in str(exc) for e in _FULL_ERRNOS):
            raise StoreFull(f"index: {exc}") from exc
        raise StoreError(f"index: {exc}") from exc
    except OSError as exc:
        if exc.errno in _FULL_ERRNOS:
            raise StoreFull(exc.strerror or "no space") from exc
        raise StoreError(f"{exc.strerror or exc}: {exc.filename or ''}") from exc


@contextlib.contextmanager
def write(env: lmdb.Environment):
    """A write transaction: serialised across threads and processes by LMDB."""
    with translate(), _short_write_is_full(env), env.begin(write=True) as txn:
        yield txn


# Below this much free space a failed commit is taken for a full disk (see below).
_FULL_SLACK = 1 << 20


@contextlib.contextmanager
def _short_write_is_full(env: lmdb.Environment):
    """LMDB reports a *short* write of a commit — the disk filled part-way through a
    commit of many pages (a batch of blobs) — as EIO, not ENOSPC (``mdb_page_flush``).
    Tell it from a real I/O error by the space left on the index's file system."""
    try:
        yield
    except lmdb.Error as exc:
        if os.strerror(errno.EIO) not in str(exc) or not _nearly_full(env.path()):
            raise
        raise StoreFull(f"index: {exc} (the disk is full)") from exc


def _nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return free * st.f_frsize < _FULL_SLACK


@contextlib.contextmanager
def read(env: lmdb.Environment):
    """A read transaction: a consistent snapshot, never blocks writers."""
    with translate(), env.begin(buffers=False) as txn:
        yield txn
