"""Points: the workspace as it stood at the start of epoch E.

The rule (DESIGN.md): the state of path P at point E is P's pre-image in the earliest
epoch >= E that touched P; if no epoch >= E touched P it is P's current state (``None``
here: "untouched since, leave it").  ``state_at`` is one cursor ``set_range`` on the
per-path index; ``targets`` collects the rule for every touched path of a point.
"""

from __future__ import annotations

from . import _epoch, _journal
from . import _schema as S
from ._errors import IndexCorrupt
from ._preimage import Damaged, PreImage, check_relpath, is_under


def state_at(txn, db, ws: int, epoch_id: int, path: bytes) -> PreImage | None:
    check_relpath(path)
    first = first_epoch_at_or_after(txn, db, ws, path, epoch_id)
    return None if first is None else _journal.get(txn, db, ws, first, path)


def first_epoch_at_or_after(txn, db, ws: int, path: bytes, epoch_id: int) -> int | None:
    return next(_epochs_of(txn, db, ws, path, epoch_id), None)


def _epochs_of(txn, db, ws: int, path: bytes, epoch_id: int = 0):
    """Yield, ascending, every epoch >= ``epoch_id`` whose index names ``path`` itself."""
    prefix = S.u32(ws) + S.pkey(path) + b"\0"
    cur = txn.cursor(db=db["touched"])
    if not cur.set_range(prefix + S.u64(epoch_id)):
        return
    for key, raw in cur:
        if len(key) != len(prefix) + 8 or key[:len(prefix)] != prefix:
            return
        S.unseal("touched", key, raw)
        eid = S.read_u64(key, len(prefix))
        if eid >= epoch_id:         # not only trusted to the seek (a damaged page)
            yield eid


def _touched_under(txn, db, ws: int, top: bytes):
    """Yield (path, epoch id) for every index entry of ``top``'s subtree (``top``
    excluded), grouped by path, epochs ascending within a path."""
    prefix = S.u32(ws) + S.subtree_prefix(top)
    cur = txn.cursor(db=db["touched"])
    if not cur.set_range(prefix):
        return
    for key, raw in cur:
        if key[:len(prefix)] != prefix:
            break
        path = touched_path(key, raw)
        if path != top and is_under(path, top):
            yield path, S.read_u64(key, len(key) - 8)


def touched_path(key: bytes, raw) -> bytes:
    """The full path of a ``touched`` entry, verified (``IndexCorrupt``)."""
    value = S.unseal("touched", key, raw)
    if len(key) < 13 or (value and S.pkey(value) != key[4:-9]):
        raise S.corrupt("touched", key, "the full path does not match the key")
    return value or bytes(key[4:-9])


def _touched_at(txn, db, ws: int, top: bytes, epoch_id: int, newest: bool):
    """(path, epoch) pairs for ``top`` and its subtree, restricted to epochs >= E:
    per path the earliest such epoch (or the newest, if ``newest``)."""
    found: dict[bytes, int] = {}
    first = first_epoch_at_or_after(txn, db, ws, top, epoch_id)
    if first is not None:
        found[top] = first
    for path, eid in _touched_under(txn, db, ws, top):
        if eid >= epoch_id and (newest or path not in found):
            found[path] = eid
    if newest and first is not None:
        found[top] = max(_epochs_of(txn, db, ws, top, first))
    return found


def touched_since(txn, db, ws: int, epoch_id: int, paths=None, *, newest=False) -> dict[bytes, int]:
    """Every path touched in an epoch >= ``epoch_id`` (within ``paths`` and their
    subtrees if given) → the earliest (or newest) such epoch."""
    if paths is None or b"" in paths:
        found: dict[bytes, int] = {}
        for eid, path, _img in _journal.entries_from(txn, db, ws, epoch_id):
            if newest or path not in found:
                found[path] = eid
        return found
    found = {}
    for top in paths:
        for path, eid in _touched_at(txn, db, ws, top, epoch_id, newest).items():
            found[path] = eid
    return found


def all_touches(txn, db, ws: int, epoch_id: int, paths=None) -> dict[bytes, list[int]]:
    """Every path touched in an epoch >= ``epoch_id`` (within ``paths`` and their
    subtrees) → *all* such epochs, ascending (who else changed it since the point)."""
    found: dict[bytes, list[int]] = {}
    if paths is None or b"" in paths:
        for eid, path, _img in _journal.entries_from(txn, db, ws, epoch_id):
            found.setdefault(path, []).append(eid)
        return found
    for top in paths:
        own = list(_epochs_of(txn, db, ws, top, epoch_id))
        if own:
            found.setdefault(top, []).extend(own)
        for path, eid in _touched_under(txn, db, ws, top):
            if eid >= epoch_id:
                found.setdefault(path, []).append(eid)
    return {p: sorted(set(e)) for p, e in found.items()}


def targets(txn, db, ws: int, epoch_id: int, paths=None) -> dict[bytes, PreImage]:
    """The state at point ``epoch_id`` of every path touched since (within ``paths``).
    A path whose deciding entry is damaged maps to a ``Damaged`` marker.

    A whole-workspace target reads the journal alone, and checks it against the
    epochs' own counts (``Epoch.paths``, kept in the transaction that records the
    entries): an entry whose key was damaged, or lost with a page, would otherwise
    just be missing — its path silently left as it is now.  On any damage or shortfall
    the per-path index is read too, and every path it says was touched at or after
    the point with no readable entry deciding it is ``Damaged``; a shortfall the index
    cannot explain raises ``IndexCorrupt`` (nothing can be planned safely).  Restricted
    to ``paths`` the per-path index is the source, each entry verified."""
    if paths is None or b"" in paths:
        return _whole_targets(txn, db, ws, epoch_id)
    return {path: _journal.get_or_damaged(txn, db, ws, eid, path)
            for path, eid in touched_since(txn, db, ws, epoch_id, paths).items()}


def _whole_targets(txn, db, ws: int, epoch_id: int) -> dict[bytes, PreImage]:
    out: dict[bytes, PreImage] = {}
    decided: dict[bytes, int] = {}       # path → epoch of the entry that decides it
    found: dict[int, int] = {}           # epoch (as its keys say) → entries
    damaged = False
    for eid, path, img in _journal.entries_from(txn, db, ws, epoch_id):
        damaged = damaged or isinstance(img, Damaged)
        found[eid] = found.get(eid, 0) + 1
        if path not in out:
            out[path], decided[path] = img, eid
    listed = {eid: _epoch.get(txn, db, eid)
              for eid in _epoch.ids_of(txn, db, ws) if eid >= epoch_id}
    # an epoch record or list entry gone missing leaves its count unknown: reconcile
    damaged = damaged or None in listed.values() or not set(found) <= set(listed)
    short = {eid: e.paths - found.get(eid, 0) for eid, e in listed.items()
             if e is not None and e.paths != found.get(eid, 0)}
    if damaged or short:
        _reconcile(txn, db, ws, epoch_id, out, decided, short)
    return out


def _reconcile(txn, db, ws, epoch_id, out, decided, short) -> None:
    """Mark ``Damaged`` every path the per-path index says was touched in an epoch
    >= ``epoch_id`` earlier than (or without) the entry that decided it."""
    prefix = S.u32(ws)
    cur = txn.cursor(db=db["touched"])
    if cur.set_range(prefix):
        for key, raw in cur:
            if key[:4] != prefix:
                break
            if len(key) < 13:
                continue            # a damaged key: fsck names it
            eid = S.read_u64(key, len(key) - 8)
            if eid < epoch_id:
                continue
            try:
                path = touched_path(key, raw)
            except IndexCorrupt:
                continue            # fsck names it; its journal entry decides alone
            if path in decided and decided[path] <= eid:
                continue
            if _journal.is_recorded(txn, db, ws, eid, path):
                continue            # read in the scan (damaged or not)
            out[path] = Damaged(eid, "its journal entry is missing")
            decided[path] = eid
            if eid in short:
                short[eid] -= 1
    unexplained = {e: n for e, n in short.items() if n > 0}
    if unexplained:
        eid = min(unexplained)
        raise S.corrupt("epochs", S.u64(eid), f"it lists {unexplained[eid]} more "
                        "journal entries than the journal and its index hold")
