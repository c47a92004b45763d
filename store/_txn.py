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

from ._errors import FULL_ERRNOS, RewindfsError, StoreError, StoreFull, StoreReadOnly
from ._schema import store_of

@contextlib.contextmanager
def translate():
    """Map lmdb/OS errors raised inside the block to the store's error classes."""
    try:
        yield
    except BaseException as exc:
        _raise_as_store_error(exc)
        raise


def _raise_as_store_error(exc: BaseException, env: lmdb.Environment | None = None) -> None:
    """Raise the store error ``exc`` stands for, if any (else return: the caller lets
    ``exc`` go on).  The one mapping of every transaction and ``translate`` block."""
    translated = _store_error(exc, env)
    if translated is not None:
        raise translated from exc


def _store_error(exc: BaseException, env: lmdb.Environment | None) -> RewindfsError | None:
    """The store error ``exc`` stands for; None: let it through as it is.  With ``env``
    (a write transaction's), a short write of a commit on a full disk is ``StoreFull``
    (``_FULL_SLACK``)."""
    if isinstance(exc, RewindfsError):
        return None
    if isinstance(exc, lmdb.MapFullError):
        return StoreFull("the index map is full")
    if isinstance(exc, lmdb.ReadonlyError):     # a write to an index opened read-only
        store = store_of(env.path()) if env is not None else "?"
        return StoreReadOnly(path=store, reason="opened for reading only")
    if isinstance(exc, lmdb.Error):
        # py-lmdb reports a failed write(2) as a plain Error carrying strerror
        text = str(exc)
        if any(os.strerror(e) in text for e in FULL_ERRNOS):
            return StoreFull(f"index: {exc}")
        if env is not None and os.strerror(errno.EIO) in text and _nearly_full(env.path()):
            return StoreFull(f"index: {exc} (the disk is full)")
        return StoreError(f"index: {exc}")
    if isinstance(exc, OSError):
        if exc.errno in FULL_ERRNOS:
            return StoreFull(exc.strerror or "no space")
        if exc.errno == errno.EROFS:
            return StoreReadOnly(path=exc.filename or "?", reason=exc.strerror)
        return StoreError(f"{exc.strerror or exc}: {exc.filename or ''}")
    return None


class _Transaction:
    """An LMDB transaction as a context manager whose errors leave as the store's
    (``translate``).  (A class, not ``contextlib``'s generators: every capture runs two,
    and three nested generators cost more than a commit's Python.)"""

    __slots__ = ("env", "txn")
    writes = False

    def __init__(self, env: lmdb.Environment):
        self.env = env

    def __enter__(self) -> lmdb.Transaction:
        try:
            self.txn = self.env.begin(write=self.writes, buffers=False)
        except BaseException as exc:
            _raise_as_store_error(exc, self.env if self.writes else None)
            raise
        return self.txn


class write(_Transaction):
    """``with write(env) as txn:`` a write transaction, serialised across threads and
    processes by LMDB.  Once it has committed it is pending for ``sync``."""

    __slots__ = ()
    writes = True

    def __exit__(self, typ, exc, tb) -> bool:
        if typ is not None:
            self.txn.abort()
            _raise_as_store_error(exc, self.env)
            return False
        try:
            self.txn.commit()
        except BaseException as exc2:
            _raise_as_store_error(exc2, self.env)
            raise
        _state(self.env).committed()
        return False


class read(_Transaction):
    """``with read(env) as txn:`` a read transaction: a consistent snapshot, never
    blocks writers."""

    __slots__ = ()

    def __enter__(self) -> lmdb.Transaction:
        txn = super().__enter__()
        _reading.txn = txn
        return txn

    def __exit__(self, typ, exc, tb) -> bool:
        _reading.txn = None
        self.txn.abort()       # a read transaction has nothing to commit
        if typ is not None:
            _raise_as_store_error(exc)
        return False


# The read transaction this thread is in (``read``), so that a memo is filled only from
# committed state: what a write transaction sees may still be aborted.
_reading = threading.local()


def is_snapshot(txn) -> bool:
    """``txn`` is a read transaction of ``read`` (committed state only)."""
    return getattr(_reading, "txn", None) is txn


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


# LMDB reports a *short* write of a commit — the disk filled part-way through a commit
# of many pages (a batch of blobs) — as EIO, not ENOSPC (``mdb_page_flush``): ``write``
# tells it from a real I/O error by the space left on the index's file system, and
# below this much free space takes it for a full disk.
_FULL_SLACK = 1 << 20


def _nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return free * st.f_frsize < _FULL_SLACK
