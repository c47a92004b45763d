"""Points: the workspace as it stood at the start of epoch E.

The rule (DESIGN.md): the state of path P at point E is P's pre-image in the earliest
epoch >= E that touched P; if no epoch >= E touched P it is P's current state (``None``
here: "untouched since, leave it").  ``state_at`` is one cursor ``set_range`` on the
per-path index; ``targets`` collects the rule for every touched path of a point.
"""

from __future__ import annotations

from . import _journal
from . import _schema as S
from ._preimage import PreImage, check_relpath, is_under


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
    for key in cur.iternext(values=False):
        if len(key) != len(prefix) + 8 or key[:len(prefix)] != prefix:
            return
        yield S.read_u64(key, len(prefix))


def _touched_under(txn, db, ws: int, top: bytes):
    """Yield (path, epoch id) for every index entry of ``top``'s subtree (``top``
    excluded), grouped by path, epochs ascending within a path."""
    prefix = S.u32(ws) + S.subtree_prefix(top)
    cur = txn.cursor(db=db["touched"])
    if not cur.set_range(prefix):
        return
    for key, value in cur:
        if key[:len(prefix)] != prefix:
            break
        path = bytes(value) if value else bytes(key[4:-9])
        if path != top and is_under(path, top):
            yield path, S.read_u64(key, len(key) - 8)


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
    A path whose deciding entry is damaged maps to a ``Damaged`` marker."""
    if paths is None or b"" in paths:
        out: dict[bytes, PreImage] = {}
        for _eid, path, img in _journal.entries_from(txn, db, ws, epoch_id):
            out.setdefault(path, img)
        return out
    return {path: _journal.get_or_damaged(txn, db, ws, eid, path)
            for path, eid in touched_since(txn, db, ws, epoch_id, paths).items()}
