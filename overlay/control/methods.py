"""The control methods and their dispatch: one request line in, events and exactly one
reply line out.

A handler is ``async def h(ctx: DaemonHost, params: dict, emit) -> dict``; ``emit(*events)``
sends one progress line per event (several in one write).  Handlers raise
``RewindfsError`` subclasses for refusals; ``dispatch`` turns them into error lines, and
any other exception into an ``internal`` error line, so a bug costs one request, never
the daemon.  ``TABLE`` holds the turn marks, status, points, fork and unmount here, the
restore engine's methods from ``rewind_methods`` and ``history`` (the state tree).

Turn marks and rewinds take ``ctx.mutation_lock``: a turn mark during a rewind would
close the rewind's epoch under it.
"""

from __future__ import annotations

import json
import logging
import os

import trio

from rewindfs.store._errors import InternalError, RewindfsError
from rewindfs.store._limits import MAX_TURN

from rewindfs.overlay.control import history, remote_methods, rewind_methods
from rewindfs.overlay.control.autopush import final_bound_s
from rewindfs.overlay.control.host import DaemonHost
from rewindfs.overlay.control.wire import (VERSION, check_text, opt_str, parse_request,
                                           reply_error, reply_ok, req_int, req_str)
from rewindfs.overlay.errors import (BadParams, FdExhausted, MutationRunning, ProtocolError,
                                     UnknownMethod)
from rewindfs.overlay.tree.fdbudget import EXHAUSTED

log = logging.getLogger(__name__)

__all__ = ["TABLE", "dispatch"]


async def turn_begin(ctx: DaemonHost, params: dict, emit) -> dict:
    session = req_str(params, "session", "turn.begin")
    turn = req_int(params, "turn", "turn.begin", minimum=1, maximum=MAX_TURN)
    label = params.get("label", "")
    if not isinstance(label, str):
        raise BadParams(method="turn.begin", reason="'label' must be a string")
    check_text(label, "label", "turn.begin")
    label = label.split("\n", 1)[0]
    force = params.get("force", False)
    if not isinstance(force, bool):
        raise BadParams(method="turn.begin", reason="'force' must be true or false")
    # A running rewind owns the current epoch: a turn mark waits for it to finish
    # instead of closing the rewind epoch under it.
    async with ctx.mutation_lock:
        await ctx.flush_writes()
        # No await between the epoch switch and telling the filesystem: no FUSE request
        # can run in between, so every change lands in exactly one of the two epochs.
        # another session's open turn: TurnOpen (nothing changed) unless forced.  The
        # files passed-through writers hold go into the new epoch with it, or no mark
        # (MarkRefused, nothing changed): see RewindOperations.writer_images.
        cur = ctx.store.open_turn(ctx.ws)
        same = cur is not None and (cur.session, cur.turn) == (session, turn)
        held = [] if same else ctx.fs.writer_images()
        epoch = ctx.store.begin_turn(ctx.ws, session, turn, label, force=force,
                                     flush=False,   # durable within _FLUSH_EVERY_S
                                     records=held)
        ctx.fs.set_epoch(epoch.id, recorded=[path for path, _ in held])
    return {"epoch": epoch.id, **_warnings(ctx)}


def _warnings(ctx: DaemonHost) -> dict:
    """``{"warnings": [...]}`` while something needs the user's attention (today: an
    invalid ``.rewindignore`` whose previous rules are still in force), else ``{}``."""
    problem = ctx.fs.rules_problem
    return {"warnings": [problem]} if problem else {}


async def turn_end(ctx: DaemonHost, params: dict, emit) -> dict:
    session = opt_str(params, "session", "turn.end")
    async with ctx.mutation_lock:
        await ctx.flush_writes()
        # no await until set_epoch (see turn_begin); another session's turn stays open
        before = ctx.store.current_epoch(ctx.ws).id
        held = ctx.fs.writer_images() if ctx.store.open_turn(ctx.ws) else []   # as in turn_begin
        epoch = ctx.store.end_turn(ctx.ws, session, flush=False, records=held)
        ctx.fs.set_epoch(epoch.id, recorded=[path for path, _ in held])
    ctx.pushers.turn_ended()    # mount --auto: queued, never waited for
    # ended: False when no turn was open (the current epoch is returned unchanged)
    return {"epoch": epoch.id, "ended": epoch.id != before}


async def status(ctx: DaemonHost, params: dict, emit) -> dict:
    cur = ctx.store.current_epoch(ctx.ws)
    open_turn = ctx.store.open_turn(ctx.ws)
    out = {
        "workspace": os.fsdecode(ctx.workspace_path), "store": str(ctx.store.path),
        "socket": os.fsdecode(ctx.socket_path), "epoch": cur.id,
        "epoch_kind": cur.kind, "mounted": True, "pid": os.getpid(), "dev": ctx.mount_dev,
        "open_turn": open_turn.as_point() if open_turn else None,
        "fs": ctx.fs.statistics(), **_warnings(ctx),
    }
    bypass = await ctx.bypass_processes()
    if bypass:
        out["bypass_writes"] = {"possible": True, "pids": bypass,
                                "hint": 'these processes work in the bare directory; '
                                        'they should re-enter it (cd "$PWD")'}
    late = ctx.fs.late.report()
    if late:   # writes by processes of turns a rewind removed (fs/latewrites.py)
        out["late_writes"] = late
    intent = ctx.store.get_intent(ctx.ws)
    if intent:
        out["intent"] = True
    if ctx.busy_with:      # a rewind, redo or gc under way (an unmount is refused)
        out["busy"] = ctx.busy_with
    out["push"] = ctx.pushers.status()
    if params.get("usage") is True:   # on request (rewindfs status): a pass over the
        # epochs and a stat per blob file — off the FUSE thread
        out["usage"] = await trio.to_thread.run_sync(ctx.store.usage, ctx.ws)
    return out


async def points(ctx: DaemonHost, params: dict, emit) -> dict:
    session = opt_str(params, "session", "points")
    # off the FUSE thread, like history: a session of 10,000 turns is 10,000 points,
    # and the web UI asks again after every turn
    found = await trio.to_thread.run_sync(ctx.store.points, ctx.ws, session)
    return {"points": [e.as_point() for e in found]}


async def fork(ctx: DaemonHost, params: dict, emit) -> dict:
    child = req_str(params, "child", "fork")
    parent = req_str(params, "parent", "fork")
    boundary = req_int(params, "boundary_turn", "fork", minimum=0)
    ctx.store.fork_session(child, parent, boundary)
    return {}


_MUTATION_WAIT_S = 2.0


async def unmount(ctx: DaemonHost, params: dict, emit) -> dict:
    """Refused while a rewind, redo or gc runs (``MutationRunning``): the daemon would
    only stop after it anyway, and a person unmounting mid-rewind should know it is
    still landing.  A turn mark (milliseconds) is waited for."""
    with trio.move_on_after(_MUTATION_WAIT_S):
        async with ctx.mutation_lock:
            # the last background push first (bounded), so the reply can say what is left
            left = await ctx.pushers.finish(final_bound_s())
            ctx.request_unmount()  # takes effect after this reply is sent
            return {"push": left} if left else {}
    raise MutationRunning(path=os.fsdecode(ctx.workspace_path),
                          what=ctx.busy_with or "rewind")


TABLE = {
    "turn.begin": turn_begin,
    "turn.end": turn_end,
    "status": status,
    "points": points,
    "fork": fork,
    "unmount": unmount,
}
TABLE.update(rewind_methods.METHODS)
TABLE.update(history.METHODS)
TABLE.update(remote_methods.METHODS)

# The parameters each method takes, declared by the module that serves it; any other is
# refused (bad-params) before the method runs.  Why: an unknown one used to be
# ignored, and a safety flag lost on the way — misspelt (``dryRun``) or sent by a newer
# client to an older daemon (``gc``'s ``dry_run``) — became a change nobody asked for.
PARAMS: dict[str, frozenset[str]] = {name: frozenset(names) for name, names in {
    "turn.begin": ("session", "turn", "label", "force"),
    "turn.end": ("session",),
    "status": ("usage",),
    "points": ("session",),
    "fork": ("child", "parent", "boundary_turn"),
    "unmount": (),
    **rewind_methods.PARAMS, **history.PARAMS, **remote_methods.PARAMS,
}.items()}


def _check_names(method: str, params: dict) -> None:
    unknown = sorted(set(params) - PARAMS[method], key=str)
    if unknown:
        takes = ", ".join(sorted(PARAMS[method])) or "no parameters"
        raise BadParams(method=method, reason=f"it takes no {unknown[0]!r} (it takes: "
                                              f"{takes})")



async def dispatch(ctx: DaemonHost, line: bytes, send) -> None:
    """Handle one request line; every outcome is exactly one reply line."""
    try:
        rid, method, params = parse_request(line)
    except ProtocolError as exc:   # the id is echoed when it could be read
        await send(reply_error(exc.request_id, exc))
        return
    try:
        handler = TABLE.get(method)
        if handler is None:
            raise UnknownMethod(method=method)
        _check_names(method, params)

        async def emit(*events: dict) -> None:
            await send(b"".join(json.dumps({"v": VERSION, "id": rid, "event": e}).encode()
                                + b"\n" for e in events))

        result = await handler(ctx, params, emit)
        await send(reply_ok(rid, result if result is not None else {}))
    except RewindfsError as exc:
        await send(reply_error(rid, exc))
    except (trio.Cancelled, trio.BrokenResourceError, trio.ClosedResourceError):
        raise   # cancelled, or the client went away mid-reply (`rewindfs show | head`)
    except Exception as exc:  # a bug must not take the daemon down
        if isinstance(exc, OSError) and exc.errno in EXHAUSTED:
            log.warning("control request refused: %s", exc, exc_info=True)
            await send(reply_error(rid, FdExhausted()))    # refuse this one request
            return
        log.exception("control request failed")
        await send(reply_error(rid, InternalError(f"internal error: {type(exc).__name__}: {exc}")))
