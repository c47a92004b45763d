"""Garbage collection: retention policies, then blobs by reachability.

Retention (optional, ``keep_epochs`` / ``max_age_s`` / ``max_bytes``) drops the oldest
epochs of a workspace — always a contiguous oldest-first prefix, because dropping an
epoch's pre-images invalidates every point at or before it (those points are then
unknown; ``resolve_point`` says so).  Never dropped: the open epoch, and — unless
``drop_redo`` — every epoch at or after the target of any rewind still on an owner's
redo stack (``_history``): a pending redo, or undoing that redo, needs them.
Nothing after a kept epoch is dropped either.  ``max_bytes`` counts the pre-image bytes
recorded per epoch (``Epoch.bytes``, before dedup) summed over the store.

Reachability: a blob no retained journal entry references is removed once its
``touched_ns`` (set by every put, including dedup hits) is older than ``grace_s`` — a
capture in flight has put its blob but not yet recorded its pre-image.  Files in the
blob area without an index entry (a crash between rename and commit) follow the same
grace; a temp file goes only once it is older than the grace *and* the process named in
it is gone.  Index entries are deleted in a write transaction first; a blob file is
unlinked afterwards only under the write lock and only if its entry is still absent, so
a concurrent put of the same content can never lose its file.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from . import _epoch, _history, _journal, _txn
from ._process import pid_alive
from . import _schema as S
from ._blob import decode_entry
from ._errors import BadPolicy, BlobCorrupt

log = logging.getLogger(__name__)


# Policy bounds.  A grace or age beyond ~317 years is a typo, and the nanosecond
# arithmetic below must stay finite; counts fit the u64 epoch ids and byte sizes.
MAX_SECONDS = 10 ** 10
MAX_COUNT = (1 << 63) - 1
_SECONDS = ("grace_s", "max_age_s")
_COUNTS = ("keep_epochs", "max_bytes")


def policy_problem(name: str, value) -> str | None:
    """Why *value* is not a usable ``name`` (``grace_s``, ``max_age_s``: finite seconds
    in ``[0, MAX_SECONDS]``; ``keep_epochs``, ``max_bytes``: integers in
    ``[0, MAX_COUNT]``), or None.  Checked before anything is read or dropped."""
    if name in _SECONDS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value <= MAX_SECONDS:    # NaN fails every comparison
            return f"must be a number of seconds from 0 to {MAX_SECONDS}"
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return f"must be an integer from 0 to {MAX_COUNT}"
    return None


def check_policy(**policy) -> None:
    for name, value in policy.items():
        if value is not None and (reason := policy_problem(name, value)) is not None:
            raise BadPolicy(name=name, reason=reason)


@dataclass
class GcReport:
    epochs_dropped: int = 0
    entries_dropped: int = 0
    blobs_removed: int = 0
    bytes_freed: int = 0      # logical (uncompressed) size of the blobs removed
    files_removed: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GcPlan(GcReport):
    """What ``collect(dry_run=True)`` would do, in ``GcReport``'s counts, plus the
    epochs it would drop (``Epoch``s, oldest first).  ``files_removed`` counts the blob
    files of the blobs it would remove; orphan and temp files are left out (they
    depend on what runs when the real gc does)."""
    epochs: tuple = ()
    workspaces: dict = None     # workspace id → its real path (bytes)

    def to_dict(self) -> dict:
        paths = self.workspaces or {}
        return {**{k: v for k, v in super().to_dict().items()
                   if k not in ("epochs", "workspaces")}, "dry_run": True,
                "epochs": [e.as_point() | {"workspace": os.fsdecode(paths.get(e.workspace, b""))}
                           for e in self.epochs]}


def collect(store, *, grace_s, keep_epochs, max_age_s, max_bytes,
            drop_redo: bool = False, dry_run: bool = False) -> GcReport:
    """Retention, then blobs by reachability; with ``dry_run`` the same choices made
    in one read transaction, nothing changed (``GcPlan``)."""
    check_policy(grace_s=grace_s, keep_epochs=keep_epochs, max_age_s=max_age_s,
                 max_bytes=max_bytes)
    retaining = keep_epochs is not None or max_age_s is not None or max_bytes is not None
    cutoff = time.time_ns() - int(grace_s * 1e9)
    if dry_run:
        return _plan(store, (keep_epochs, max_age_s, max_bytes, drop_redo) if retaining
                     else None, cutoff)
    report = GcReport()
    if retaining:
        _retain(store, report, keep_epochs, max_age_s, max_bytes, drop_redo)
    doomed_files = _drop_unreferenced(store, report, cutoff)
    _unlink_files(store, report, doomed_files, cutoff)
    return report


def _plan(store, retention, cutoff) -> GcPlan:
    db = store._db
    with store._r() as txn:
        doomed = _doomed(txn, db, *retention) if retention else []
        gone = {e.id for e in doomed}
        refs = referenced_blobs(txn, db, skip_epochs=gone)
        plan = GcPlan(epochs_dropped=len(doomed), entries_dropped=sum(e.paths for e in doomed),
                      epochs=tuple(sorted(doomed, key=lambda e: e.id)),
                      workspaces=dict(S.workspace_paths(txn, db)))
        for _key, size, where in _unreferenced(txn, db, refs, cutoff):
            plan.blobs_removed += 1
            plan.bytes_freed += size
            plan.files_removed += where == S.FILE
    return plan


# -- retention -------------------------------------------------------------------------
def _droppable(epochs: list[_epoch.Epoch], drop_redo: bool = False) -> list[_epoch.Epoch]:
    """Oldest-first epochs (of one workspace, ``epochs``) that retention may drop."""
    floor = epochs[-1].id if epochs else 0
    if not drop_redo:
        for rew in _pending_redos(epochs):
            floor = min(floor, rew.target)
    return [e for e in epochs if e.id < floor]


def _pending_redos(epochs) -> list[_epoch.Epoch]:
    """Every rewind still on an owner's redo stack: what ``redo`` may yet undo."""
    return [r for stack in _history.redo_stacks(epochs).values() for r in stack
            if r.target is not None]


def _retain(store, report, keep_epochs, max_age_s, max_bytes, drop_redo) -> None:
    with store._w() as txn:
        for e in _doomed(txn, store._db, keep_epochs, max_age_s, max_bytes, drop_redo):
            _drop_epoch(txn, store._db, e, report)


def _doomed(txn, db, keep_epochs, max_age_s, max_bytes, drop_redo) -> list[_epoch.Epoch]:
    """The epochs retention drops (each workspace's an oldest-first prefix)."""
    now = time.time_ns()
    ws_ids = [S.read_u32(k) for k in txn.cursor(db=db["ws_paths"]).iternext(values=False)
              if len(k) == 4]    # another key is damage, named by fsck
    totals = {ws: _epoch.all_of(txn, db, ws) for ws in ws_ids}
    per_ws = {ws: _droppable(epochs, drop_redo) for ws, epochs in totals.items()}
    doomed: list[_epoch.Epoch] = []
    for ws, cands in per_ws.items():
        total = len(totals[ws])
        n = 0
        if keep_epochs is not None:
            n = max(n, min(len(cands), max(0, total - keep_epochs)))
        if max_age_s is not None:
            old = now - int(max_age_s * 1e9)
            n = max(n, next((i for i, c in enumerate(cands) if c.ended_ns >= old),
                            len(cands)))
        doomed += cands[:n]
        per_ws[ws] = cands[n:]
    if max_bytes is not None:
        doomed += _over_budget(txn, db, per_ws, doomed, max_bytes)
    return doomed


def _over_budget(txn, db, per_ws, doomed, max_bytes) -> list[_epoch.Epoch]:
    gone = {e.id for e in doomed}
    total = sum(e.bytes for e in _epoch.every(txn, db) if e.id not in gone)
    queue = sorted((e for cands in per_ws.values() for e in cands), key=lambda e: e.id)
    # Oldest first across the store; each workspace's candidates are already an
    # oldest-first suffix of what is left, so stopping early keeps every cut a prefix.
    extra = []
    for e in queue:
        if total <= max_bytes:
            break
        extra.append(e)
        total -= e.bytes
    return extra


def _drop_epoch(txn, db, e: _epoch.Epoch, report: GcReport) -> None:
    report.entries_dropped += _journal.delete_epoch(txn, db, e.workspace, e.id)
    _epoch.delete(txn, db, e)
    if e.kind == "turn" and e.session is not None:
        tkey = S.turn_key(e.workspace, e.session, e.turn)
        raw = txn.get(tkey, db=db["turns"])
        if raw is not None and S.is_sealed(tkey, raw) and raw[:8] == S.u64(e.id):
            txn.delete(tkey, db=db["turns"])
    report.epochs_dropped += 1
    log.info("gc dropped epoch %d of workspace %d", e.id, e.workspace)


# -- reachability ------------------------------------------------------------------------
def referenced_blobs(txn, db, skip_epochs=frozenset()) -> dict[bytes, list[bytes]]:
    """Blob key → paths of journal entries referencing it (those of *skip_epochs* left
    out: what would reference it once they are dropped)."""
    refs: dict[bytes, list[bytes]] = {}
    for key, raw in txn.cursor(db=db["journal"]):
        if skip_epochs and _journal.key_epoch(key) in skip_epochs:
            continue
        path, img = _journal.decode_value(key, raw)
        blob = getattr(img, "blob", None)   # a damaged entry names no blob we can trust
        if blob is not None:
            refs.setdefault(blob, []).append(path)
    return refs


def _unreferenced(txn, db, refs, cutoff):
    """Yield ``(key, size, where)`` of each blob no entry of *refs* names, last put
    before *cutoff* (a damaged entry is left for fsck to name)."""
    for k, raw in txn.cursor(db=db["blobs"]):
        key = bytes(k)
        if key not in refs and _touched_before(key, raw, cutoff):
            size, where, _touched, _ = decode_entry(key, raw)
            yield key, size, where


def _drop_unreferenced(store, report, cutoff) -> list[bytes]:
    db = store._db
    with store._r() as txn:
        refs = referenced_blobs(txn, db)
        cands = [key for key, _size, _where in _unreferenced(txn, db, refs, cutoff)]
    files = []
    with store._w() as txn:
        for key in cands:
            raw = txn.get(key, db=db["blobs"])
            if raw is None:
                continue
            if not _touched_before(key, raw, cutoff):
                continue   # re-put since the scan (a capture is using it) or damaged
            size, where, _touched, _ = decode_entry(key, raw)
            txn.delete(key, db=db["blobs"])
            report.blobs_removed += 1
            report.bytes_freed += size
            if where == S.FILE:
                files.append(key)
    return files


def _touched_before(key, raw, cutoff) -> bool:
    """Whether the blob entry was last put before ``cutoff``; a damaged entry is left
    for fsck to name, never collected on a guess."""
    try:
        return decode_entry(key, raw)[2] < cutoff
    except BlobCorrupt:
        return False


def blob_files(root: str):
    """Yield (key, path) of every file in the sharded blob directory."""
    for shard in sorted(os.listdir(root)):
        if len(shard) != 2 or shard == "tmp":
            continue
        for name in os.listdir(os.path.join(root, shard)):
            try:
                key = bytes.fromhex(shard + name)
            except ValueError:
                continue
            if len(key) == 16:
                yield key, os.path.join(root, shard, name)


def _unlink_files(store, report, keys, cutoff) -> None:
    area = store.blobs
    with _txn.translate():
        orphans = [k for k, p in blob_files(area.root)
                   if os.stat(p).st_mtime_ns < cutoff]
        stale_tmp = [os.path.join(area.tmp_dir, n) for n in os.listdir(area.tmp_dir)]
    with store._w() as txn:   # the write lock keeps puts out while we unlink
        for key in set(keys) | set(orphans):
            if txn.get(key, db=store._db["blobs"]) is None:
                _unlink(area.file_path(key), report)
    for path in stale_tmp:
        try:
            if os.stat(path).st_mtime_ns < cutoff and not _writer_alive(path):
                _unlink(path, report)
        except FileNotFoundError:
            pass


def _writer_alive(tmp_path: str) -> bool:
    """Whether the process that named this temp file (``<pid>-…``) still runs: its put
    may be in flight, whatever the grace period says."""
    try:
        pid = int(os.path.basename(tmp_path).split("-", 1)[0])
    except ValueError:
        return False
    return pid == os.getpid() or pid_alive(pid)


def _unlink(path: str, report: GcReport) -> None:
    try:
        os.unlink(path)
        report.files_removed += 1
    except FileNotFoundError:
        pass
