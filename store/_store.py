"""``Store``: the one public object of the store package.

Concurrency contract: one ``Store`` per process and store path (``open`` hands back the
same LMDB environment to a second opener in the same process, because LMDB forbids
opening one environment twice in a process).  A ``Store`` is thread-safe.  Several
processes (the daemon and CLI commands) may use one store at once: LMDB serialises
write transactions across processes, and every read-modify-write here (epoch ids,
workspace ids, counters) happens inside one write transaction.  A ``Store`` must not
cross ``fork()``; open it again in the child.

Durability: see docs/store.md.  The environment runs with ``sync=False`` by default: a
committed transaction survives a SIGKILL of the process (the pages are in the kernel's
page cache), not necessarily a power loss; ``flush()`` forces it to disk, and turn
boundaries call it; ``sync()`` does the same only when something committed since the
last one (the overlay calls it before every ``fsync`` through the mount).
"""

from __future__ import annotations

import logging
import os
import pathlib
import threading

import xxhash

from . import _epoch, _history, _intent, _journal, _plan, _point, _remotes, _session, _transfer
from . import _tree, _txn
from . import _schema as S
from ._blob import BlobArea
from ._errors import NothingToRedo, StoreError
from ._location import check_outside, is_inside
from ._limits import MAX_TURN
from ._preimage import PreImage, check_relpath
from ._usage import usage

log = logging.getLogger(__name__)

_registry: dict[tuple[int, str], list] = {}   # (pid, index realpath) -> [env, dbs, refs]
_registry_lock = threading.Lock()


def _cannot_write(index: str) -> bool:
    """The index directory is on a read-only file system or not writable by us."""
    return bool(os.statvfs(index).f_flag & os.ST_RDONLY) or not os.access(index, os.W_OK)


class Store:
    """The on-disk store: LMDB index + content-addressed blobs (see docs/architecture.md)."""

    def __init__(self, path: pathlib.Path, env, db, key):
        self.path = path
        self._env, self._db, self._key = env, db, key
        self._pid = os.getpid()
        self._closed = False
        self._real = os.fsencode(os.path.realpath(path))
        # opened for reading only (a store that cannot be written: Store.open)
        self.readonly = bool(env.flags()["readonly"])
        self.blobs = BlobArea(env, db["blobs"], str(path / "blobs"))

    # -- lifecycle ------------------------------------------------------------------
    @staticmethod
    def exists(path) -> bool:
        """Whether a store was ever made at ``path`` (its index directory is there)."""
        return (pathlib.Path(path) / "index").is_dir()

    @classmethod
    def open(cls, path, *, create: bool = True, sync: bool = False) -> Store:
        """Open (and with ``create`` make) the store at ``path`` (the callers resolve the
        default, ``rewindfs.plugin._paths.default_store_path``).  ``SchemaTooNew`` for a
        store from a newer rewindfs."""
        path = pathlib.Path(path).absolute()
        with _txn.translate():
            if not cls.exists(path):
                if not create:
                    raise StoreError(f"no store at {path}")
                (path / "index").mkdir(mode=0o700, parents=True, exist_ok=True)
            index = os.path.realpath(path / "index")
            key = (os.getpid(), index)
            with _registry_lock:
                slot = _registry.get(key)
                if slot is None:
                    # a store that cannot be written is still read (git log in a
                    # read-only clone): its writes are refused as StoreReadOnly
                    readonly = not create and _cannot_write(index)
                    env, dbs = S.open_env(index, create=create, sync=sync,
                                          readonly=readonly)
                    slot = _registry[key] = [env, dbs, 0]
                slot[2] += 1
        return cls(path, slot[0], slot[1], key)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _registry_lock:
            slot = _registry.get(self._key)
            if slot is None or self._pid != os.getpid():
                return
            slot[2] -= 1
            if slot[2] == 0:
                del _registry[self._key]
                slot[0].close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def flush(self) -> None:
        """Force every committed transaction to disk (survives power loss)."""
        self._check_usable()
        _txn.sync(self._env, force=True)

    def sync(self) -> bool:
        """Make every pre-image this process has committed durable (DESIGN invariant
        12): ``flush()`` when a write transaction committed since the last sync, else
        nothing — a lock and two integer reads.  True if it had to write.  Blob files
        need nothing here: each is fsynced, with its directory, before its entry
        commits.  Thread-safe; covers every transaction whose call returned before this
        one started, from any thread.  ``StoreError`` if the disk refuses."""
        self._check_usable()
        return _txn.sync(self._env)

    def has_unsynced(self) -> bool:
        """A write transaction of this process committed since the last sync: what
        ``sync()`` would write.  A lock and two integer reads."""
        counts = _txn.sync_statistics(self._env)
        return counts["commits"] != counts["synced"]

    def _w(self):
        self._check_usable()
        return _txn.write(self._env)

    def _r(self):
        self._check_usable()
        return _txn.read(self._env)

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
        if self._pid != os.getpid():
            raise StoreError("a Store cannot cross fork(); open it again in the child")

    # -- workspaces -----------------------------------------------------------------
    def workspace(self, real_path) -> int:
        """The id of the workspace at ``real_path`` (resolved by the caller), created on
        first use.  ``StoreInsideWorkspace`` if this store lies inside it."""
        real_path, hkey = self._workspace_key(real_path)
        with self._r() as txn:
            ws = _workspace_id(txn, self._db, hkey, real_path)
        if ws is not None:
            return ws
        with self._w() as txn:   # look again: another process may have just added it
            return _workspace_in(txn, self._db, hkey, real_path)

    def _workspace_key(self, real_path) -> tuple[bytes, bytes]:
        real_path = os.fsencode(real_path)
        if not real_path.startswith(b"/") or b"\0" in real_path:
            raise StoreError(f"workspace path must be absolute: {real_path!r}")
        real_path = os.path.normpath(real_path)
        check_outside(self._real, real_path)
        return real_path, xxhash.xxh3_128(real_path).digest()

    def check_import(self, real_path, history, *, point, session=None):
        """What ``import_history`` would answer for the workspace at ``real_path``,
        registered or not, without writing anything: the same checks (``RestoreTargetInUse``, the
        point: ``UnknownPoint``, ``AmbiguousPoint``), and nothing is written — not
        even the workspace (``restore`` asks before it makes anything)."""
        real_path, hkey = self._workspace_key(real_path)
        try:
            with self._w() as txn:
                ws = _workspace_in(txn, self._db, hkey, real_path)
                raise _transfer.Rollback(_transfer.import_into(
                    txn, self._db, ws, history, label="", head=[], point=point,
                    session=session))
        except _transfer.Rollback as done:
            return done.result

    def workspaces(self) -> list[tuple[int, bytes]]:
        with self._r() as txn:
            return S.workspace_paths(txn, self._db)

    def workspace_containing(self, real_path) -> tuple[int, bytes] | None:
        """``(id, root)`` of the innermost known workspace that is ``real_path`` or
        contains it (a resolved absolute path), or None.  Never creates one."""
        real_path = os.path.normpath(os.fsencode(real_path))
        best = None
        for ws, root in self.workspaces():
            if is_inside(real_path, root) and (best is None or len(root) > len(best[1])):
                best = (ws, root)
        return best

    # -- epochs and sessions --------------------------------------------------------
    def generation(self) -> int:
        """A number that changes with every write transaction committed to the store,
        by any process or thread (LMDB's last transaction id): a cheap "has anything
        changed since" (~1 µs, no transaction)."""
        self._check_usable()
        return self._env.info()["last_txnid"]

    def current_epoch(self, ws) -> _epoch.Epoch:
        with self._r() as txn:
            e = _epoch.last(txn, self._db, ws)
        if e is not None:
            return e
        with self._w() as txn:
            return _epoch.current(txn, self._db, ws)

    def begin_turn(self, ws, session: str, turn: int, label: str,
                   force: bool = False, *, flush: bool = True, records=()) -> _epoch.Epoch:
        """Open a ``turn`` epoch; idempotent for the turn already open, otherwise the
        open epoch (idle, rewind, or a turn of the same session) is closed first.
        Another session's open turn raises ``TurnOpen`` (nothing changes) unless
        ``force``.  ``flush=False`` leaves the boundary to the caller's next ``sync()``
        (the daemon's background sync, docs/store.md "Durability").  ``records``:
        ``(path, PreImage)`` pairs recorded in the epoch returned, in the same
        transaction — the epoch never exists without them (``journal.record``)."""
        _session.check_session(session)
        if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn <= MAX_TURN:
            raise _session.BadSession(session=session, reason=f"bad turn number {turn!r}")
        with self._w() as txn:
            e = _session.begin_turn(txn, self._db, ws, session, turn, str(label),
                                    force=bool(force))
            if records:
                _journal.record(txn, self._db, ws, e.id, list(records))
        if flush:
            self.flush()
        return e

    def end_turn(self, ws, session: str | None = None, *, flush: bool = True,
                 records=()) -> _epoch.Epoch:
        """Close the open turn and open an ``idle`` epoch (returned); without an open
        turn, return the current epoch unchanged.  With ``session``, the open turn must
        belong to it (``BadSession`` otherwise, and nothing changes): a harness ending
        its own turn never closes another session's.  ``records``: as ``begin_turn``'s,
        into the new idle epoch (none when nothing changes)."""
        with self._w() as txn:
            cur = _epoch.current(txn, self._db, ws)
            if cur.kind != "turn":
                return cur
            if session is not None and cur.session != session:
                raise _session.BadSession(
                    session=session, reason=f"the open turn belongs to session "
                                            f"{cur.session!r}; nothing was ended")
            e = _epoch.open_new(txn, self._db, ws, "idle")
            if records:
                _journal.record(txn, self._db, ws, e.id, list(records))
        if flush:
            self.flush()
        return e

    def begin_mount(self, ws, label: str = "") -> _epoch.Epoch:
        """A mount begins serving ``ws``: if its open epoch is an ``idle`` one that
        recorded anything, close it and open a new ``idle`` epoch, so the tree as
        mounted is a point (edits made while unmounted are not seen, and one of them
        changed again in the old epoch would have no pre-image: that path has one
        there).  With a ``label`` (``rewindfs run``: its command) an open idle epoch
        is always followed by a new one carrying it.  Any other open epoch (an empty
        idle one without a label, a turn a harness still ends) is returned as is."""
        with self._w() as txn:
            cur = _epoch.last(txn, self._db, ws)
            if cur is not None and (cur.kind != "idle" or (cur.paths == 0 and not label)):
                return cur
            e = _epoch.open_new(txn, self._db, ws, "idle", label=str(label))
        self.flush()
        return e

    def open_turn(self, ws) -> _epoch.Epoch | None:
        with self._r() as txn:
            e = _epoch.last(txn, self._db, ws)
        return e if e is not None and e.kind == "turn" and e.is_open else None

    def begin_rewind(self, ws, target: int, session: str | None,
                     kind: str = "rewind") -> _epoch.Epoch:
        """Close the open epoch and open a ``rewind`` epoch restoring point ``target``
        owned by ``session`` (None: the manual owner) — or, ``kind="redo"``, a redo
        epoch undoing the rewind epoch ``target`` (``_history``).  Refusing while a
        turn is open is the caller's policy (it may be forced)."""
        if session is not None:
            _session.check_session(session)
        if kind not in ("rewind", "redo"):
            raise StoreError(f"not a rewind kind: {kind!r}")
        with self._w() as txn:
            found = _epoch.get_in(txn, self._db, ws, target)
            if kind == "redo" and found.kind != "rewind":
                raise StoreError(f"a redo undoes a rewind epoch; e{target} is {found.kind}")
            return _epoch.open_new(txn, self._db, ws, kind, session=session,
                                   target=target)

    def end_rewind(self, ws) -> _epoch.Epoch:
        """Close the open rewind (or redo) epoch and open (and return) an ``idle`` one."""
        with self._w() as txn:
            cur = _epoch.current(txn, self._db, ws)
            if cur.kind not in ("rewind", "redo"):
                raise StoreError(f"epoch {cur.id} is not a rewind")
            e = _epoch.open_new(txn, self._db, ws, "idle")
        self.flush()
        return e

    def epochs(self, ws) -> list[_epoch.Epoch]:
        with self._r() as txn:
            return _epoch.all_of(txn, self._db, ws)

    def history(self, ws) -> list[_tree.Node]:
        """The workspace's state tree (``_tree``: each epoch under the state it started
        from), in id order; one read transaction."""
        with self._r() as txn:
            return _tree.history(txn, self._db, ws)

    def own_files(self, ws, sessions: list[str]) -> dict[str, _tree.OwnFiles]:
        """Where each session's own files are (``_tree.own_files``); one read of the
        tree for them all."""
        epochs = self.epochs(ws)
        parent_of = _tree.parents(epochs)
        return {s: _tree.own_files(epochs, parent_of, s) for s in sessions}

    def points(self, ws, session: str | None = None) -> list[_epoch.Epoch]:
        """The epochs a user can rewind to: all of the workspace's, or those of
        ``session`` and its fork ancestry (in the session's order)."""
        if session is None:
            return self.epochs(ws)
        with self._r() as txn:
            # the workspace's epochs as all_of keeps them, not one decode per point
            known = {e.id: e for e in _epoch.all_of(txn, self._db, ws)}
            return [known.get(eid) or _epoch.get_known(txn, self._db, eid)
                    for _turn, eid in _session.points(txn, self._db, ws, session)]

    def epoch(self, epoch_id) -> _epoch.Epoch:
        with self._r() as txn:
            return _epoch.get_known(txn, self._db, epoch_id)

    def fork_session(self, child: str, parent: str, boundary_turn: int) -> None:
        _session.check_session(child)
        _session.check_session(parent)
        if (not isinstance(boundary_turn, int) or isinstance(boundary_turn, bool)
                or not 0 <= boundary_turn < 1 << 32):   # the bound of begin_turn's turn
            raise _session.BadSession(session=child,
                                      reason=f"bad boundary turn {boundary_turn!r}")
        with self._w() as txn:
            _session.fork(txn, self._db, child, parent, int(boundary_turn))

    def session_lineage(self, session: str) -> list[str]:
        """``session`` and the sessions it was forked from, nearest first."""
        _session.check_session(session)
        with self._r() as txn:
            return _session.lineage(txn, self._db, session)

    def session_points(self, ws, session) -> list[tuple[int, int]]:
        with self._r() as txn:
            return _session.points(txn, self._db, ws, session)

    def resolve_point(self, ws, point, session: str | None = None) -> int:
        with self._r() as txn:
            return _session.resolve(txn, self._db, ws, point, session)

    def redo_target(self, ws, owner: str | None):
        """The rewind ``redo`` of ``owner`` undoes (the top of its stack) and that
        redo's stale changes (``_history``); ``NothingToRedo`` when the stack is empty."""
        with self._r() as txn:
            epochs = _epoch.all_of(txn, self._db, ws)
        stack = _history.redo_stack(epochs, owner)
        if not stack:
            raise NothingToRedo(scope=f" of session {owner}" if owner is not None
                                else " made without a session")
        return stack[-1], _history.stale_changes(epochs, stack[-1])

    def redo_stacks(self, ws) -> dict:
        """Every owner's redo stack (rewinds not yet undone, oldest first)."""
        with self._r() as txn:
            return _history.redo_stacks(_epoch.all_of(txn, self._db, ws))

    def paths_changed_by(self, ws, epochs) -> int:
        """How many paths ``epochs`` (of ``ws``) touched, each counted once."""
        ids = {e.id for e in epochs}
        if not ids:
            return 0
        return sum(1 for _p, eps in self.touches_since(ws, min(ids))
                   if any(e.id in ids for e in eps))

    def sessions(self, ws) -> dict[str, list[int]]:
        """The sessions that ran turns in ``ws``, each with its turn numbers (sorted)."""
        with self._r() as txn:
            return _session.of_workspace(txn, self._db, ws)

    # -- blobs ------------------------------------------------------------------------
    def put_fd(self, fd: int, hint: bytes | None = None) -> tuple[bytes, int]:
        """Store ``fd``'s content; ``hint`` = the key the caller expects (a dedup hit
        is tried first and verified; never trusted)."""
        self._check_usable()
        return self.blobs.put_fd(fd, hint)

    def put_known(self, fd: int, key: bytes) -> tuple[bytes, int] | None:
        """The dedup hit alone: touch blob ``key`` if ``fd`` holds exactly it (verified
        by hash and bytes) and return (key, size); None otherwise.  Writes no data."""
        self._check_usable()
        return self.blobs.put_known(fd, key)

    def blob_differs(self, key: bytes, fd: int) -> bool:
        """True if a cheap sample proves ``fd``'s content is not blob ``key``
        (``BlobArea.differs``); False means "hash to know"."""
        self._check_usable()
        return self.blobs.differs(key, fd)

    def adoption_path(self) -> str:
        """A fresh name in the blob area's temp directory for ``put_adopted``."""
        self._check_usable()
        return self.blobs.adoption_path()

    def put_adopted(self, path: str) -> tuple[bytes, int]:
        """Take the file hard-linked at ``path`` as a blob without copying it (the
        caller's guarantees: ``BlobArea.put_adopted``)."""
        self._check_usable()
        return self.blobs.put_adopted(path)

    def unshare_blob(self, key: bytes) -> bool:
        """Give blob ``key`` a private copy if its file still has another name."""
        self._check_usable()
        return self.blobs.unshare(key)

    def put_fds(self, fds) -> list[tuple[bytes, int]]:
        """``put_fd`` of each fd; the small contents in one transaction (``BlobArea``)."""
        self._check_usable()
        return self.blobs.put_fds(list(fds))

    def put_bytes(self, data: bytes) -> tuple[bytes, int]:
        self._check_usable()
        return self.blobs.put_bytes(data)

    def blob_file(self, key: bytes) -> str | None:
        """The file holding blob ``key`` when it is kept as one (never write to it),
        else None (inline); ``BlobMissing``.  For streaming a large blob elsewhere; its
        reader verifies it (or reads it through ``iter_blob``, which does)."""
        self._check_usable()
        entry = self.blobs.entry(key)
        return self.blobs.file_path(key) if entry[1] == S.FILE else None

    def read_blob(self, key: bytes) -> bytes:
        self._check_usable()
        return self.blobs.read(key)

    def iter_blob(self, key: bytes):
        """The blob's content in chunks (a generator; its file is opened at the first
        ``next``), without holding it whole; ``BlobCorrupt`` is raised after the last
        chunk if size or hash is wrong, so a consumer must treat what it got as invalid
        then."""
        self._check_usable()
        return self.blobs.iter_verified(key)

    def copy_blob_to_fd(self, key: bytes, fd: int) -> int:
        """Write the blob at ``fd``'s offset; ``BlobCorrupt`` is raised after the last
        chunk if it did not verify (write to a temp file and discard it then)."""
        self._check_usable()
        return self.blobs.copy_to_fd(key, fd)

    # -- journal ----------------------------------------------------------------------
    def record(self, ws, epoch_id, entries) -> _journal.Recorded:
        """Record pre-images (write-ahead: durable against a process crash on return).
        One transaction: all entries or none.  ``EpochClosed`` if the epoch is no
        longer open.  Returns which entries were new and the commit's generation."""
        entries = list(entries)
        with self._w() as txn:
            fresh = _journal.record(txn, self._db, ws, epoch_id, entries)
            at = txn.id() if any(fresh) else None
        return _journal.Recorded(fresh, at)

    def is_recorded(self, ws, epoch_id, path) -> bool:
        with self._r() as txn:
            return _journal.is_recorded(txn, self._db, ws, epoch_id, path)

    def unrecorded(self, ws, epoch_id, paths) -> list[bytes]:
        """The paths (in order) with no pre-image in the epoch yet; one read txn."""
        with self._r() as txn:
            return [p for p in paths
                    if not _journal.is_recorded(txn, self._db, ws, epoch_id, p)]

    def journal(self, ws, epoch_id):
        with self._r() as txn:
            _epoch.get_in(txn, self._db, ws, epoch_id)
            return iter(list(_journal.entries(txn, self._db, ws, epoch_id)))

    # -- points and plans ---------------------------------------------------------------
    def state_at(self, ws, epoch_id, path) -> PreImage | None:
        with self._r() as txn:
            _epoch.get_in(txn, self._db, ws, epoch_id)
            return _point.state_at(txn, self._db, ws, epoch_id, path)

    def plan(self, ws, epoch_id, paths=None) -> _plan.Plan:
        """Actions restoring every path touched in epochs >= ``epoch_id`` (within
        ``paths`` and their subtrees) to its state at that point."""
        paths = _check_paths(paths)
        with self._r() as txn:
            _epoch.get_in(txn, self._db, ws, epoch_id)
            states = _point.targets(txn, self._db, ws, epoch_id, paths)
        return _plan.build(epoch_id, states)

    def changed_since(self, ws, epoch_id, paths=None):
        """Every path touched in epochs >= ``epoch_id`` with the newest such epoch."""
        paths = _check_paths(paths)
        with self._r() as txn:
            _epoch.get_in(txn, self._db, ws, epoch_id)
            found = _point.touched_since(txn, self._db, ws, epoch_id, paths, newest=True)
            epochs = {eid: _epoch.get(txn, self._db, eid) for eid in set(found.values())}
        # a damaged journal key may name an epoch that never was: fsck names it
        return iter([(p, epochs[found[p]]) for p in sorted(found)
                     if epochs[found[p]] is not None])

    def touches_since(self, ws, epoch_id, paths=None):
        """Every path touched in epochs >= ``epoch_id`` with *every* such epoch (oldest
        first) — for "who else changed this since the point" reports."""
        paths = _check_paths(paths)
        with self._r() as txn:
            _epoch.get_in(txn, self._db, ws, epoch_id)
            found = _point.all_touches(txn, self._db, ws, epoch_id, paths)
            ids = {eid for eids in found.values() for eid in eids}
            epochs = {eid: _epoch.get(txn, self._db, eid) for eid in ids}
        out = [(p, [epochs[e] for e in found[p] if epochs[e] is not None]) for p in sorted(found)]
        return iter([(p, eps) for p, eps in out if eps])

    # -- intents ------------------------------------------------------------------------
    def put_intent(self, ws, intent: dict) -> None:
        with self._w() as txn:
            _intent.put(txn, self._db, ws, intent)

    def get_intent(self, ws) -> dict | None:
        with self._r() as txn:
            return _intent.get(txn, self._db, ws)

    def clear_intent(self, ws) -> None:
        with self._w() as txn:
            _intent.clear(txn, self._db, ws)

    # -- remotes (``store.remote``: configuration and moving history) -------------------
    def export_history(self, ws) -> _transfer.History:
        """Every epoch, journal entry, session and turn of ``ws``, read in one read
        transaction (``_transfer``)."""
        with self._r() as txn:
            return _transfer.export(txn, self._db, ws)

    def import_history(self, ws, history, *, label: str, head, point=None, session=None,
                       replace_empty: bool = False, settle: bool = False):
        """Write ``history`` into ``ws`` (no history yet), open an ``idle`` epoch
        holding ``head`` and resolve ``point``: (offset, that epoch, point's epoch id);
        one transaction, all or nothing (``_transfer.import_into``).  ``check_import``
        asks the same without writing.  ``replace_empty`` and ``settle``: learning into
        an existing workspace (``_transfer``'s contract)."""
        with self._w() as txn:
            return _transfer.import_into(txn, self._db, ws, history, label=label,
                                         head=head, point=point, session=session,
                                         replace_empty=replace_empty, settle=settle)

    def store_id(self) -> str:
        with self._w() as txn:
            return _remotes.store_id(txn, self._db)

    def add_remote(self, name, url, endpoint=None, region=None, conditional=None) -> None:
        with self._w() as txn:
            _remotes.add(txn, self._db, name, url, endpoint, region, conditional)

    def remove_remote(self, name) -> None:
        with self._w() as txn:
            _remotes.remove(txn, self._db, name)

    def remote(self, name) -> list:
        """[url, endpoint, region, conditional, added_ns]; ``UnknownRemote``."""
        with self._r() as txn:
            return _remotes.get(txn, self._db, name)

    def remotes(self) -> dict[str, list]:
        with self._r() as txn:
            return _remotes.every(txn, self._db)

    def remote_binding(self, name, ws) -> str | None:
        """The id ``ws`` has on remote ``name``, None before its first push."""
        with self._r() as txn:
            return _remotes.binding(txn, self._db, name, ws)

    def bind_remote(self, name, ws, remote_ws: str) -> None:
        with self._w() as txn:
            _remotes.get(txn, self._db, name)
            _remotes.bind(txn, self._db, name, ws, remote_ws)

    def record_push(self, name, ws, epoch: int, pushed_ns: int) -> None:
        with self._w() as txn:
            _remotes.record_push(txn, self._db, name, ws, epoch, pushed_ns)

    def push_state(self, name, ws) -> dict:
        """What is not pushed to ``name`` yet, from this store's own record (no remote
        call): ``workspace`` (its id there, None before a push), ``head_epoch`` (the
        newest local epoch), ``pushed_epoch`` and
        ``pushed_ns`` of the last successful push (None before the first),
        ``unpushed_epochs`` (local epochs newer than it).  One read transaction."""
        with self._r() as txn:
            _remotes.get(txn, self._db, name)
            last = _remotes.last_push(txn, self._db, name, ws)
            bound = _remotes.binding(txn, self._db, name, ws)
            ids = list(_epoch.ids_of(txn, self._db, ws))    # index keys only: cheap
        pushed = None if last is None else last[0]
        return {"workspace": bound, "head_epoch": max(ids, default=None), "pushed_epoch": pushed,
                "pushed_ns": None if last is None else last[1],
                "unpushed_epochs": sum(1 for i in ids if pushed is None or i > pushed)}

    # -- maintenance --------------------------------------------------------------------
    def gc(self, *, grace_s: float = 3600, keep_epochs=None, max_age_s=None, max_bytes=None,
           drop_redo: bool = False, dry_run: bool = False):
        """Retention (oldest epochs first) then unreferenced blobs; see ``_gc``.
        ``drop_redo`` lets retention drop what pending redos need; ``dry_run`` changes
        nothing and returns what would go (``GcPlan``)."""
        from ._gc import collect
        self._check_usable()
        return collect(self, grace_s=grace_s, keep_epochs=keep_epochs,
                       max_age_s=max_age_s, max_bytes=max_bytes, drop_redo=drop_redo,
                       dry_run=dry_run)

    def usage(self, ws=None) -> dict:
        """Store usage: on disk, and per workspace and session (see ``_usage``)."""
        self._check_usable()
        return usage(self, ws)

    def fsck(self):
        from ._check import check
        self._check_usable()
        return check(self)

    def statistics(self) -> dict:
        with self._r() as txn:
            stat = {name: txn.stat(db)["entries"] for name, db in self._db.items()}
        info = self._env.info()
        return {"path": str(self.path), "entries": stat,
                "map_used_bytes": info["last_pgno"] * self._env.stat()["psize"],
                "durability": _txn.sync_statistics(self._env)}


def _workspace_in(txn, db, hkey: bytes, real_path: bytes) -> int:
    """The id of the workspace at ``real_path``, registered in *txn* if it is new."""
    ws = _workspace_id(txn, db, hkey, real_path)
    if ws is not None:
        return ws
    meta = db["meta"]
    ws = S.load("meta", b"next_ws", txn.get(b"next_ws", db=meta) or b"")
    if not isinstance(ws, int) or isinstance(ws, bool) or not 0 < ws < 1 << 32:
        raise S.corrupt("meta", b"next_ws", f"not a workspace id: {ws!r}")
    txn.put(b"next_ws", S.dump(b"next_ws", ws + 1), db=meta)
    txn.put(hkey, S.dump(hkey, [ws, real_path]), db=db["workspaces"])
    txn.put(S.u32(ws), S.seal(S.u32(ws), real_path), db=db["ws_paths"])
    return ws


def _workspace_id(txn, db, hkey: bytes, real_path: bytes) -> int | None:
    """The id recorded for ``real_path`` (verified: ``IndexCorrupt``), None if none."""
    raw = txn.get(hkey, db=db["workspaces"])
    if raw is None:
        return None
    value = S.load("workspaces", hkey, raw)
    with S.decoding("workspaces", hkey):
        ws, recorded = value
        if recorded != real_path or not isinstance(ws, int):
            raise ValueError("another path or no id")
        return ws


def _check_paths(paths):
    if paths is None:
        return None
    if isinstance(paths, bytes):
        raise TypeError("paths is an iterable of bytes, not bytes")
    return [check_relpath(p) for p in paths]
