"""Control-socket methods of the restore engine: rewind, redo, diff, show, gc.

``METHODS`` (name → ``async def h(ctx, params, emit) -> dict``) is merged into the
protocol's dispatch table.  The blocking restore runs in a worker thread
(``trio.to_thread``, not cancellable: once begun a rewind finishes, or its intent lets
the next start finish it); progress events hop back to the trio thread to be sent.
Rewinds of one daemon are serialised.

Before planning, the kernel's dirty pages are pushed to the daemon (``flush_writes``):
with the writeback cache on, an agent's last writes could otherwise land on top of the
restored files later.  After each landed path the kernel caches are invalidated
(``ctx.invalidate``), so the mount shows the restored tree at once.
"""

from __future__ import annotations

import base64
import functools
import logging
import math
import os

import trio

from rewindfs.store._gc import policy_problem

from rewindfs.overlay.rewind import diff
from rewindfs.overlay.rewind import engine
from rewindfs.overlay.tree import syscalls
from rewindfs.overlay.control.handoff import Handoff
from rewindfs.overlay.control.host import DaemonHost, RewindHost
from rewindfs.overlay.control.wire import flag, opt_paths, opt_str, point_param, wire_path
from rewindfs.overlay.errors import BadParams
from rewindfs.overlay.errors import ContentTooLarge, NotAFile

log = logging.getLogger(__name__)

__all__ = ["METHODS", "SYNC", "call_local", "events_of", "plan_dict"]



# -- wire forms -----------------------------------------------------------------------

def plan_dict(plan: engine.RewindPlan, *, with_changes: bool) -> dict:
    counts = plan.counts()
    out = {"target": plan.target, **counts,
           "foreign": [{"path": os.fsdecode(p), "epoch": e.id, "kind": e.kind,
                        "session": e.session, "turn": e.turn} for p, e in plan.foreign]}
    if plan.unrecorded:   # asked for, but no epoch since the point knows them
        out["unrecorded"] = [os.fsdecode(p) for p in plan.unrecorded]
    damaged = plan.plan.damaged
    if damaged:
        out["damaged"] = [{"path": os.fsdecode(p), "message": reason}
                          for p, reason in sorted(damaged.items())]
    if with_changes:
        out["changes"] = [{"path": os.fsdecode(it.action.path), "op": it.action.op,
                           "change": it.change} for it in plan.items
                          if it.change not in ("unchanged", "ignored")]
    return out


def events_of(event: dict) -> dict:
    """An engine progress event (bytes path) → its wire form."""
    return {**event, "path": os.fsdecode(event["path"])}


# -- the methods, synchronous (run in a worker thread, or by the CLI on an unmounted dir)
#
# ``ctx`` is a ``RewindHost``: the daemon, or the CLI offline (``ctx.live`` None: no
# mount to invalidate or fence).  ``send(event)`` gets each progress event in its wire form.

def _run_rewind(ctx: RewindHost, make_plan, *, dry_run: bool, session, force: bool,
                send, point=None) -> dict:
    if not dry_run and ctx.store.get_intent(ctx.ws) is not None:
        # An earlier rewind of this workspace broke off: finish it before planning anew.
        engine.recover(ctx.root_fd, ctx.store, ctx.ws,
                         **_hooks(ctx), fence=ctx.live)
    plan = make_plan()
    named = _named(ctx, plan, point, session)
    summary = {**plan_dict(plan, with_changes=dry_run), **named}  # once: event and reply
    send({"type": "rewind.planned", "dry_run": dry_run, **summary})
    if dry_run:
        return {"dry_run": True, "epoch": None, **summary}
    result = engine.apply_plan(
        ctx.root_fd, ctx.store, ctx.ws, plan, session=session, force=force,
        progress=lambda ev: send(events_of(ev)), **_hooks(ctx),
        writers=_writers(ctx), fence=ctx.live)
    done = {**result.to_dict(), "exit_code": result.exit_code, **named}
    send({"type": "rewind.done", **done, "failed": len(result.failed)})
    return {**done, "foreign": summary["foreign"]}


def _named(ctx: RewindHost, plan: engine.RewindPlan, point, session) -> dict:
    """How a reply names what it did: ``point`` as the user gave it (a redo: the rewind
    it undid, ``eN``), the ``owner`` the new epoch belongs to, and ``target_point``: the
    target epoch as a point (a turn's session, number and label)."""
    target = ctx.store.epoch(plan.target).as_point()
    if plan.kind == "redo":
        return {"point": f"e{plan.undid}", "owner": plan.owner, "undid": plan.undid,
                "target_point": target}
    return {"point": str(point), "owner": session, "undid": None, "target_point": target}


def _hooks(ctx: RewindHost) -> dict:
    """The engine's cache hooks: a daemon's, or none offline."""
    if ctx.live is None:
        return {"invalidate": None, "epoch_changed": None, "rules": None}
    return {"invalidate": ctx.live.invalidate, "epoch_changed": ctx.live.epoch_changed,
            "rules": _rules(ctx)}


def _rules(ctx: RewindHost):
    """The ignore rules in force: a mount's own (the previous ones while
    ``.rewindignore`` is invalid, invariant 7: what it never captured it never
    restores), or None: the engine reads the file, and refuses an invalid one."""
    return None if ctx.live is None else ctx.live.ignore_rules()


def _writers(ctx: RewindHost):
    """Only a daemon can fence writers of a file the rewind adopts (``rewind.adopt``);
    ``REWINDFS_ADOPT=0`` turns adopting off (A/B runs in docs/benchmarks.md).  The
    fence of the plan's paths (``fence=ctx.live``: DESIGN invariant 14) likewise needs
    a mount; the CLI on an unmounted workspace has none."""
    if os.environ.get("REWINDFS_ADOPT") == "0":
        return None
    return ctx.live


def rewind_sync(ctx: RewindHost, params: dict, send) -> dict:
    to = point_param(params, "to", "rewind")
    paths = opt_paths(params, "rewind")
    session = opt_str(params, "session", "rewind")
    undo_for = opt_str(params, "undo_for", "rewind")
    dry_run, force = flag(params, "dry_run", "rewind"), flag(params, "force", "rewind")
    make = functools.partial(engine.plan_rewind, ctx.root_fd, ctx.store, ctx.ws, to,
                             paths=paths, session=session, rules=_rules(ctx))
    # The owner: undo_for, else the session, else the manual owner (None); its `redo`
    # undoes this rewind (store._history).
    return _run_rewind(ctx, make, dry_run=dry_run, force=force, send=send, point=to,
                       session=undo_for if undo_for is not None else session)


def redo_sync(ctx: RewindHost, params: dict, send) -> dict:
    session = opt_str(params, "session", "redo")
    dry_run, force = flag(params, "dry_run", "redo"), flag(params, "force", "redo")
    make = functools.partial(engine.plan_redo, ctx.root_fd, ctx.store, ctx.ws,
                             session=session, rules=_rules(ctx), force=force)
    return _run_rewind(ctx, make, dry_run=dry_run, force=force, session=session, send=send)


def diff_sync(ctx: RewindHost, params: dict, send) -> dict:
    a, b = point_param(params, "a", "diff"), point_param(params, "b", "diff", required=False)
    paths = opt_paths(params, "diff")
    session = opt_str(params, "session", "diff")
    ea = ctx.store.resolve_point(ctx.ws, a, session)
    eb = None if b is None else ctx.store.resolve_point(ctx.ws, b, session)
    changes = diff.diff_points(ctx.root_fd, ctx.store, ctx.ws, ea, eb, paths=paths)
    return {"a": ea, "b": eb, "changes": [c.to_dict() for c in changes]}


# ``show`` streams: with ``stream: true`` the content travels as events, one line each,
#     {"type": "show.start", "point": E, "size": N}
#     {"type": "show.chunk", "offset": O, "data_b64": "..."}    (≤ 192 KiB raw, 256 KiB b64)
# and the result is ``{point, exists: true, size, streamed: true}`` (no content), so
# neither side ever holds the whole file, its base64 and its JSON line at once.  An
# error reply after chunks (``blob-corrupt``: verified only after the last byte)
# invalidates them.  Without ``stream`` (protocol v1 as before) the content comes in
# the result's ``content_b64``, for files up to ``SHOW_INLINE_MAX`` only.
SHOW_INLINE_MAX = 512 * 1024


def open_show(ctx: RewindHost, params: dict):
    """Validate a ``show`` request and open its content: ``(epoch, Content | None,
    path)`` (``epoch`` None: now; ``Content`` None: absent there)."""
    point = point_param(params, "point", "show", required=False)
    if "path" not in params:
        raise BadParams(method="show", reason="'path' is required")
    path = wire_path(params["path"], "show")
    session = opt_str(params, "session", "show")
    flag(params, "stream", "show")
    epoch = None if point is None else ctx.store.resolve_point(ctx.ws, point, session)
    if not path:     # the root: a directory at every point, said as for any other one
        raise NotAFile(path=b".", what="a directory (the workspace's root)",
                       point="now" if epoch is None else f"e{epoch}")
    return epoch, diff.open_content(ctx.root_fd, ctx.store, ctx.ws, epoch, path), path


def _chunk_event(offset: int, chunk: bytes) -> dict:
    return {"type": "show.chunk", "offset": offset,
            "data_b64": base64.b64encode(chunk).decode("ascii")}


def _show_inline(epoch, content, path: bytes) -> dict:
    if content.size > SHOW_INLINE_MAX:
        raise ContentTooLarge(path=path, size=content.size)
    data = b"".join(content.chunks)
    if len(data) > SHOW_INLINE_MAX:     # a live file that grew while read
        raise ContentTooLarge(path=path, size=len(data))
    return {"point": epoch, "exists": True,
            "content_b64": base64.b64encode(data).decode("ascii")}


def show_sync(ctx: RewindHost, params: dict, send) -> dict:
    epoch, content, path = open_show(ctx, params)
    if content is None:
        return {"point": epoch, "exists": False, "content_b64": None}
    with content:
        if not params.get("stream"):
            return _show_inline(epoch, content, path)
        send({"type": "show.start", "point": epoch, "size": content.size})
        n = 0
        for chunk in content.chunks:
            send(_chunk_event(n, chunk))
            n += len(chunk)
    return {"point": epoch, "exists": True, "size": n, "streamed": True}


def gc_sync(ctx: RewindHost, params: dict, send) -> dict:
    policy = {}
    for name in ("grace_s", "max_age_s", "max_bytes", "keep_epochs"):
        value = params.get(name)
        if value is None:
            continue
        # negative, NaN, infinite, absurdly large: refused here, before the store
        if (reason := policy_problem(name, value)) is not None:
            raise BadParams(method="gc", reason=f"{name!r} {reason}")
        policy[name] = value
    policy["drop_redo"] = flag(params, "drop_redo", "gc")
    policy["dry_run"] = flag(params, "dry_run", "gc")
    return ctx.store.gc(**policy).to_dict()


SYNC = {"rewind": rewind_sync, "redo": redo_sync, "diff": diff_sync, "show": show_sync,
        "gc": gc_sync}


def call_local(ctx: RewindHost, method: str, params: dict, on_event=None) -> dict:
    """Run a method in this process (the CLI on an unmounted workspace)."""
    return SYNC[method](ctx, params, on_event or (lambda event: None))


# -- the protocol handlers ----------------------------------------------------------------

# Methods that change the tree (unless a dry run): the kernel's pending writes are
# flushed first and its caches settled after.
_CHANGE_THE_TREE = frozenset({"rewind", "redo"})
# Long mutations (unless a dry run): ``status`` names them (``busy``), an unmount is
# refused while one runs; the heap they grew is given back after (malloc_trim).
_LONG_MUTATIONS = frozenset({"rewind", "redo", "gc"})


async def _handle(method: str, ctx: DaemonHost, params: dict, emit) -> dict:
    """The rewind lock is held for the work only, never for the client's pace: the
    progress stream and the reply are sent after it is released, so a client that stops
    reading (a suspended ``rewindfs rewind``, a full pipe) holds up no turn mark and no
    other rewind — only its own connection, which ends when it hangs up."""
    real = params.get("dry_run") is not True
    changes = real and method in _CHANGE_THE_TREE
    long_mutation = method in _LONG_MUTATIONS

    async def work(send) -> dict:
        async with ctx.mutation_lock:   # a turn mark waits for a running rewind
            if real and long_mutation:
                ctx.busy_with = method
            try:
                if changes:
                    await ctx.flush_writes()
                result = await trio.to_thread.run_sync(SYNC[method], ctx, params, send)
            finally:
                ctx.busy_with = None
                if long_mutation:
                    await trio.to_thread.run_sync(syscalls.malloc_trim)
            if changes:
                await ctx.invalidations_settled()
            return result

    return await _streaming(work, emit)


async def _show(ctx: DaemonHost, params: dict, emit) -> dict:
    """``show`` in the daemon: the content is opened under the rewind lock (a
    consistent point), then streamed *outside* it, one chunk per worker-thread read,
    each sent (``await emit``: the socket's pace) before the next is read — memory is
    one chunk, and a reader that stops reading (``rewindfs show | less``) holds up no
    turn mark or rewind."""
    async with ctx.mutation_lock:
        epoch, content, path = await trio.to_thread.run_sync(open_show, ctx, params)
    if content is None:
        return {"point": epoch, "exists": False, "content_b64": None}
    with content:
        if not params.get("stream"):
            return await trio.to_thread.run_sync(_show_inline, epoch, content, path)
        await emit({"type": "show.start", "point": epoch, "size": content.size})
        n = 0
        while (chunk := await trio.to_thread.run_sync(next, content.chunks, None)) is not None:
            await emit(_chunk_event(n, chunk))
            n += len(chunk)
    return {"point": epoch, "exists": True, "size": n, "streamed": True}


async def _run_streaming(fn, ctx: DaemonHost, params: dict, emit) -> dict:
    """Run the blocking ``fn(ctx, params, send)`` in a worker thread, its events
    streamed (``_streaming``)."""
    return await _streaming(
        lambda send: trio.to_thread.run_sync(fn, ctx, params, send), emit)


async def _streaming(work, emit) -> dict:
    """``await work(send)``; the events ``send`` gets (from any thread) are queued
    without waiting (a blocking hop per event cost a 3,000-file rewind ~14 %), handed
    to the trio thread in batches (``Handoff``) and sent in order by a task here, each
    batch in one write.  ``Handoff`` delivers every event before the worker's result
    arrives (FIFO), so closing the channel then loses none.

    The work never waits for the client: a client that hangs up (Ctrl-C, killed) only
    makes the remaining events be dropped — the work runs to its end, nothing is raised
    into it or into the trio run — and one that stops reading only keeps this function
    (and its connection) waiting after ``work`` has returned."""
    send_ch, recv_ch = trio.open_memory_channel(math.inf)

    async def pump() -> None:
        async with recv_ch:
            try:
                async for events in recv_ch:
                    await emit(*events)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The client hung up: the rewind runs on (it cannot be stopped half-way);
                # its remaining events are drained and dropped, the reply fails later.
                async for events in recv_ch:
                    pass

    send = Handoff(trio.lowlevel.current_trio_token(), send_ch.send_nowait).put

    failure = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        try:
            result = await work(send)
        except Exception as exc:  # re-raised bare below: the nursery would wrap it in a group
            failure = exc
        finally:
            send_ch.close()
    if failure is not None:
        raise failure
    return result


METHODS = {name: functools.partial(_handle, name) for name in SYNC}
METHODS["show"] = _show
# the parameters each method reads (control.methods refuses any other)
PARAMS = {
    "rewind": ("to", "session", "paths", "dry_run", "force", "undo_for"),
    "redo": ("session", "dry_run", "force"),
    "diff": ("a", "b", "paths", "session"),
    "show": ("point", "path", "session", "stream"),
    "gc": ("grace_s", "keep_epochs", "max_age_s", "max_bytes", "drop_redo", "dry_run"),
}
