"""Transactions with the store's error translation.

Every LMDB or file-system failure leaves the store as a ``StoreError``; a full map or
a full disk as ``StoreFull`` (the overlay turns it into ``ENOSPC`` and fails closed).
A write transaction either commits entirely or not at all (LMDB), so "nothing changed"
holds for every error raised out of ``write()``.

Durability bookkeeping (DESIGN invariant 12): the environment runs without a sync per
commit, so each environment counts its committed write transactions, and ``sync(env)``
forces them to disk only when one was committed since the last sync.  The count goes
up *after* a commit returns and ``sync`` reads it *before* it forces, so a sync that
reports "nothing pending" or finishes has made durable every transaction whose
``write()`` block had returned when it started; one committing meanwhile stays pending.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import weakref

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
    """A write transaction: serialised across threads and processes by LMDB.  Once it
    has committed it is pending for ``sync``."""
    with translate(), _short_write_is_full(env), env.begin(write=True) as txn:
        yield txn
    _state(env).committed()


class _Pending:
    """Commits of one environment in this process, and how many of them are synced."""

    __slots__ = ("lock", "commits", "synced", "syncs")

    def __init__(self):
        self.lock = threading.Lock()
        self.commits = self.synced = self.syncs = 0

    def committed(self) -> None:
        with self.lock:
            self.commits += 1


_pending: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_pending_lock = threading.Lock()


def _state(env: lmdb.Environment) -> _Pending:
    state = _pending.get(env)
    if state is None:
        with _pending_lock:
            state = _pending.setdefault(env, _Pending())
    return state


def sync(env: lmdb.Environment, *, force: bool = False) -> bool:
    """Force the committed transactions to disk (``mdb_env_sync``) if any committed
    since the last sync (always with ``force``); True if it synced.  Thread-safe;
    costs a lock and two integer reads when nothing is pending."""
    state = _state(env)
    with state.lock:
        seen = state.commits
        if seen == state.synced and not force:
            return False
    with translate():
        env.sync(True)
    with state.lock:
        state.synced = max(state.synced, seen)
        state.syncs += 1
    return True


def sync_statistics(env: lmdb.Environment) -> dict:
    """``{"commits", "synced", "syncs"}`` of this process for ``env``."""
    state = _state(env)
    with state.lock:
        return {"commits": state.commits, "synced": state.synced, "syncs": state.syncs}


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
