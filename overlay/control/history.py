"""The ``history`` method: the workspace's state tree (``store._tree``), for
``rewindfs log --tree``; ``redo.state``: what ``redo`` of an owner would undo now; and
``own.state``: where sessions' own files are (a harness's "back to this session's files").

    → {"method": "history", "params": {"session"?: S}}
    ← {"nodes": [{...epoch point fields, "parent", "children", "current", "fork"}, ...]}

Nodes come oldest first (a parent before its children).  With ``session`` every node
also says ``in_session``: one of that session's points (its turns and the inherited
ones, ``Store.points``) or a rewind/redo it owns; a session with none of them in this
workspace is refused (``bad-session``).  Read-only: one read transaction, no lock (a
running rewind does not hold it up; its epoch is simply the newest node).  The CLI on an
unmounted workspace calls ``history_sync`` on its offline host.
"""

from __future__ import annotations

import trio

from rewindfs.store import NothingToRedo
from rewindfs.store._errors import BadSession

from rewindfs.overlay.control.host import RewindHost
from rewindfs.overlay.errors import BadParams
from rewindfs.overlay.rewind import engine
from rewindfs.overlay.control.wire import check_text, opt_str

__all__ = ["METHODS", "history_sync", "own_state_sync", "redo_state_sync"]


def history_sync(ctx: RewindHost, params: dict) -> dict:
    session = opt_str(params, "session", "history")     # bad-params before any read
    nodes = [n.as_dict() for n in ctx.store.history(ctx.ws)]
    if session is not None:
        mine = {e.id for e in ctx.store.points(ctx.ws, session)}
        mine |= {n["epoch"] for n in nodes if n["session"] == session}
        if not mine:
            raise BadSession(session=session, reason="it has no turn, rewind or redo "
                                                     "in this workspace")
        for n in nodes:
            n["in_session"] = n["epoch"] in mine
    return {"nodes": nodes}


async def history(ctx: RewindHost, params: dict, emit) -> dict:
    # a long history is a few ms of decoding: off the trio thread, like the rewind reads
    return await trio.to_thread.run_sync(history_sync, ctx, params)


def redo_state_sync(ctx: RewindHost, params: dict) -> dict:
    """``{"session"?: S}`` (the owner; absent: the manual owner) →
    ``{"can_redo", "rewind", "stale": [point], "reason"}``: the rule of
    ``store._history``, so a UI may ask on every render; only when epochs after the
    rewind changed paths is the tree compared with the point they began at (changes
    all put back are no reason to refuse: ``engine.redo_target``).  ``can_redo`` is
    what a plain ``redo`` would do now (a stale one needs ``force``)."""
    owner = opt_str(params, "session", "redo.state")
    try:
        rewind, stale = engine.redo_target(ctx.root_fd, ctx.store, ctx.ws, session=owner,
                                           rules=None if ctx.live is None
                                           else ctx.live.ignore_rules())
    except NothingToRedo as exc:
        return {"can_redo": False, "rewind": None, "stale": [], "reason": exc.message}
    reason = None if not stale else (
        f"the tree changed after rewind e{rewind.id} (a redo would discard that; "
        "/rewind to a point instead)")
    return {"can_redo": not stale, "rewind": rewind.id,
            "stale": [e.as_point() for e in stale], "reason": reason}


async def redo_state(ctx: RewindHost, params: dict, emit) -> dict:
    return await trio.to_thread.run_sync(redo_state_sync, ctx, params)


# a harness asks for the sessions it shows; more than this in one request is a bug
_MAX_OWN_SESSIONS = 256


def own_state_sync(ctx: RewindHost, params: dict) -> dict:
    """``{"sessions": [S, ...]}`` → ``{"sessions": {S: {"state", "turn", "left",
    "holder", "undoes"}}}``: ``store._tree.own_files`` for each — ``none`` (no turn of
    its own here), ``here``, or ``away`` with ``left`` (rewind to ``e<left>`` to put
    them back; null when no point holds them any more), ``holder`` (whose files are
    here) and ``undoes`` (``[{session, turn}]``: the turns that rewind takes out)."""
    sessions = params.get("sessions")
    if (not isinstance(sessions, list) or not 1 <= len(sessions) <= _MAX_OWN_SESSIONS
            or not all(isinstance(s, str) and s for s in sessions)):
        raise BadParams(method="own.state", reason="'sessions' must be a list of 1 to "
                        f"{_MAX_OWN_SESSIONS} non-empty session ids")
    names = [check_text(s, "sessions", "own.state") for s in sessions]
    found = ctx.store.own_files(ctx.ws, names)
    return {"sessions": {s: where.as_dict() for s, where in found.items()}}


async def own_state(ctx: RewindHost, params: dict, emit) -> dict:
    return await trio.to_thread.run_sync(own_state_sync, ctx, params)


METHODS = {"history": history, "redo.state": redo_state, "own.state": own_state}
PARAMS = {"history": ("session",), "redo.state": ("session",),    # control.methods checks
          "own.state": ("sessions",)}
