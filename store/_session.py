"""Sessions, turns and point names.

A harness session maps its turns to epochs (``turns``: the newest epoch begun for that
turn number in that workspace).  ``fork_session(child, parent, boundary_turn)`` lets
the child inherit the parent's points for turns ``<= boundary_turn`` (the point of turn
N is the start of turn N, so a child forked "at turn N" can go back to it), recursively
through the parent's own parent.  Sessions are store-wide; turns are per workspace.

Points are named absolutely (DESIGN invariant 8): an epoch (``"e12"``,
``"epoch:12"``) or a turn (``"t3"``, ``"turn:3"``, a bare ``"3"`` or ``3``).  A bare
number is never an epoch.  A turn without a session means the turn of the workspace's
only session; with several sessions it is refused (``AmbiguousPoint``, naming them).
Relative names (``-1``, ``~1``, ``HEAD~1``, ``prev``…) raise ``BadPoint``.
"""

from __future__ import annotations

import re
import time

from . import _epoch
from . import _schema as S
from ._errors import (AmbiguousPoint, BadPoint, BadSession, SessionConflict, TurnOpen,
                      UnknownPoint)
from ._limits import MAX_SESSION
_RELATIVE_WORDS = {"prev", "previous", "last", "head", "next", "latest", "current"}
_EPOCH_RE = re.compile(r"(?:e|epoch:)(\d+)")
_TURN_RE = re.compile(r"(?:t|turn:)?(\d+)")


def check_session(session) -> str:
    if not isinstance(session, str) or not session:
        raise BadSession(session=session, reason="not a non-empty string")
    if "\0" in session or len(session.encode()) > MAX_SESSION:
        raise BadSession(session=session, reason=f"contains NUL or exceeds {MAX_SESSION} bytes")
    return session


def ensure(txn, db, session: str) -> None:
    key = session.encode()
    if txn.get(key, db=db["sessions"]) is None:
        txn.put(key, S.dump(key, [None, None, time.time_ns()]), db=db["sessions"])


def lineage(txn, db, session: str) -> list[str]:
    """``session`` and its fork ancestors, nearest first (a loop is cut)."""
    out: list[str] = []
    while session is not None and session not in out:
        out.append(session)
        rec = _record(txn, db, session)
        session = None if rec is None else rec[0]
    return out


def _record(txn, db, session: str):
    """(parent, boundary turn, created_ns) of ``session``, verified; None if unknown."""
    key = session.encode()
    raw = txn.get(key, db=db["sessions"])
    if raw is None:
        return None
    value = S.load("sessions", key, raw)
    with S.decoding("sessions", key):
        parent, boundary, created = value
        if not (parent is None or isinstance(parent, str)) \
                or not (boundary is None or isinstance(boundary, int)):
            raise TypeError("parent or boundary")
        return parent, boundary, created


def begin_turn(txn, db, ws: int, session: str, turn: int, label: str,
               force: bool = False) -> _epoch.Epoch:
    """Open a turn epoch.  The turn already open is returned as is; a stale open turn of
    the same session is closed (a harness that lost its ``turn.end``).  Another
    session's open turn is never closed silently: its later writes would land in this
    turn and its ``turn.end`` would fail, so it raises ``TurnOpen`` naming the holder
    unless ``force``."""
    cur = _epoch.last(txn, db, ws)
    if cur is not None and cur.kind == "turn" and cur.is_open:
        if (cur.session, cur.turn) == (session, turn):
            return cur
        if cur.session != session and not force:
            raise TurnOpen(turn=cur.turn, session=cur.session)
    ensure(txn, db, session)
    e = _epoch.open_new(txn, db, ws, "turn", session=session, turn=turn, label=label)
    key = S.turn_key(ws, session, turn)
    txn.put(key, S.seal(key, S.u64(e.id)), db=db["turns"])
    return e


def fork(txn, db, child: str, parent: str, boundary_turn: int) -> None:
    ensure(txn, db, parent)
    key = child.encode()
    old = _record(txn, db, child)
    if old is not None:
        old_parent, old_boundary, _ = old
        if (old_parent, old_boundary) == (parent, boundary_turn):
            return
        if old_parent is not None:
            raise SessionConflict(child=child)
    if _ancestors(txn, db, parent) & {child}:
        raise SessionConflict(child=child)
    txn.put(key, S.dump(key, [parent, boundary_turn, time.time_ns()]), db=db["sessions"])


def _ancestors(txn, db, session: str) -> set[str]:
    seen = {session}
    while True:
        rec = _record(txn, db, session)
        parent = rec[0] if rec is not None else None
        if parent is None or parent in seen:
            return seen
        seen.add(parent)
        session = parent


def own_turns(txn, db, ws: int, session: str) -> dict[int, int]:
    # a session name holds no NUL, so every key under this prefix is one of its turns
    check_session(session)   # a name from the caller (``points``, a point's session)
    prefix = S.u32(ws) + session.encode() + b"\0"
    cur = txn.cursor(db=db["turns"])
    out = {}
    if cur.set_range(prefix):
        for key, value in cur:
            if key[:len(prefix)] != prefix:
                break
            eid = turn_epoch(key, value)        # verifies the key too
            out[S.read_u32(key, len(prefix))] = eid
    return out


def turn_epoch(key: bytes, raw) -> int:
    """The epoch id a ``turns`` entry names, verified (``IndexCorrupt``)."""
    payload = S.unseal("turns", key, raw)
    with S.decoding("turns", key):
        if len(key) < 9 or len(payload) != 8:   # ws u32 + session + NUL + turn u32
            raise ValueError("not an epoch id")
        return S.read_u64(payload)


def points(txn, db, ws: int, session: str) -> list[tuple[int, int]]:
    """(turn, epoch id) of ``session`` including inherited ones, by turn."""
    merged: dict[int, int] = {}
    limit, seen = None, set()
    while session is not None and session not in seen:
        seen.add(session)
        for turn, eid in own_turns(txn, db, ws, session).items():
            if (limit is None or turn <= limit) and turn not in merged:
                merged[turn] = eid
        rec = _record(txn, db, session)
        if rec is None:
            break
        parent, boundary, _ = rec
        if boundary is not None:
            limit = boundary if limit is None else min(limit, boundary)
        session = parent
    return sorted(merged.items())


def _is_relative(text: str) -> bool:
    t = text.strip().lower()
    return any(c in t for c in "-~^+") or t in _RELATIVE_WORDS or t.startswith("head")


def resolve(txn, db, ws: int, point, session: str | None) -> int:
    """The epoch id ``point`` names (see the module docstring)."""
    if isinstance(point, bool) or not isinstance(point, (int, str)):
        raise UnknownPoint(point=point)
    if isinstance(point, int):
        if point < 0:
            raise BadPoint(point=str(point))
        return _turn(txn, db, ws, point, session, typed=str(point))
    if _is_relative(point):
        raise BadPoint(point=point)
    text = point.strip().lower()
    if m := _TURN_RE.fullmatch(text):
        return _turn(txn, db, ws, int(m.group(1)), session, typed=point.strip())
    if m := _EPOCH_RE.fullmatch(text):
        return _epoch_id(txn, db, ws, int(m.group(1)))
    raise UnknownPoint(point=point)


def _epoch_id(txn, db, ws: int, eid: int) -> int:
    return _epoch.get_in(txn, db, ws, eid).id


def of_workspace(txn, db, ws: int) -> dict[str, list[int]]:
    """Each session that ran turns in ``ws`` → its turn numbers, sorted."""
    turns: dict[str, set[int]] = {}
    for e in _epoch.all_of(txn, db, ws):
        if e.kind == "turn" and e.session is not None:
            turns.setdefault(e.session, set()).add(e.turn)
    return {s: sorted(t) for s, t in sorted(turns.items())}


def _turn(txn, db, ws: int, turn: int, session: str | None, *, typed: str) -> int:
    if session is None:
        session = _only_session(txn, db, ws, turn, typed)
    found = dict(points(txn, db, ws, session)).get(turn)
    if found is None:
        raise UnknownPoint(point=f"t{turn} of session {session}")
    return found


def _only_session(txn, db, ws: int, turn: int, typed: str) -> str:
    """The session a turn named without one means: the workspace's only session."""
    sessions = of_workspace(txn, db, ws)
    if len(sessions) == 1:
        return next(iter(sessions))
    if not sessions:
        raise UnknownPoint(f"No turn {typed} in this workspace: no session ran a turn here "
                           f"(write e{turn} for epoch {turn}; see `rewindfs log`)",
                           point=typed)
    listed = ", ".join(f"{s} ({_span(t)})" for s, t in sessions.items())
    raise AmbiguousPoint(point=typed, number=turn, sessions=listed,
                         choices=[{"session": s, "turns": [t[0], t[-1]]}
                                  for s, t in sessions.items()])


def _span(turns: list[int]) -> str:
    return f"turn {turns[0]}" if len(turns) == 1 else f"turns {turns[0]}–{turns[-1]}"
