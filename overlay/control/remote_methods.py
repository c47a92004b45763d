"""Control-socket methods of remotes: ``push`` and ``remote.learn``.

``push`` params ``{remote?: str, session?: str, wait?: bool = true}``:

- ``remote``: default the ``mount --auto`` remote, else the store's only remote
  (``remote-unnamed`` when there are none or several; ``unknown-remote`` for a name the
  store does not know).
- ``session``: accepted for the clients that name the session whose turn ended; the
  daemon pushes its one workspace whole either way (a point needs the workspace's whole
  history), and the result echoes it.
- ``wait: true``: push now (after a push of that remote already running), streaming
  ``push.progress`` events; the result is the ``push.done`` record, the fields of
  ``rewindfs push --json``.  A failure is the push's error (``remote-unreachable``,
  ``lease-held``, …).
- ``wait: false``: queue a push with the background pusher of that remote and return
  at once ``{queued: true, pending: N}`` (N requests now waiting; one push serves them
  all).  Never waits for the network, so it is safe right after a turn end.

``remote.learn {remote, session?, workspace?}`` teaches the mounted workspace a pushed
history it has none of (``rewind.learn``: docs/remote.md, "On a new machine").  The
download runs in a worker thread with no lock held (turns and rewinds go on; nothing
local changes but blobs).  Then, under the rewind lock (``mutation_lock``: no turn
mark and no rewind meanwhile), the kernel's dirty pages are pushed to the daemon, an
open turn refuses, the real tree is walked in a worker thread, and the import commits
**on the trio thread with no await before ``fs.set_epoch``**: captures run on that
thread too, so none lands in an epoch the import drops.  A change made through the
mount during the walk is captured into the workspace's empty epoch, which then is no
longer empty: the import refuses (``learn-target-has-history``), nothing changed.
"""

from __future__ import annotations

import math

import trio

from rewindfs.store._errors import RewindfsError, TurnOpen
from rewindfs.store.remote import open_backend

from rewindfs.overlay.control.host import DaemonHost
from rewindfs.overlay.control.wire import opt_str, req_str
from rewindfs.overlay.errors import BadParams
from rewindfs.overlay.rewind import learn
from rewindfs.overlay.rewind.remote import remote_config

__all__ = ["METHODS"]


async def push(ctx: DaemonHost, params: dict, emit) -> dict:
    name = ctx.pushers.resolve(opt_str(params, "remote", "push"))
    session = opt_str(params, "session", "push")
    wait = params.get("wait", True)
    if not isinstance(wait, bool):
        raise BadParams(method="push", reason="'wait' must be true or false")
    pusher = ctx.pushers.get(name)
    if not wait:
        return {"queued": True, "pending": pusher.request_nowait(), "remote": name,
                **({"session": session} if session else {})}
    send, recv = trio.open_memory_channel(math.inf)

    def progress(event: dict) -> None:
        try:
            send.send_nowait(event)
        except trio.ClosedResourceError:   # a late event of a push given up on
            pass

    outcome: dict = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay, recv, emit)
        try:
            outcome["done"] = await pusher.push(progress)
        except RewindfsError as exc:   # raised out here: a nursery would wrap it in a group
            outcome["error"] = exc
        finally:
            send.close()
    if "error" in outcome:
        raise outcome["error"]
    return {**outcome["done"], **({"session": session} if session else {})}


async def _relay(recv, emit) -> None:
    async with recv:
        async for event in recv:
            await emit(event)


def _download(ctx: DaemonHost, name: str, workspace, session):
    config = remote_config(ctx.store, name)
    backend = open_backend(config)
    lineage = ctx.store.session_lineage(session) if session else ()
    pushed = learn.find_pushed(backend, config, workspace=workspace, session=session,
                               lineage=lineage)
    return pushed, pushed.fetch(ctx.store, backend)


async def remote_learn(ctx: DaemonHost, params: dict, emit) -> dict:
    name = req_str(params, "remote", "remote.learn")
    session = opt_str(params, "session", "remote.learn")
    workspace = opt_str(params, "workspace", "remote.learn")
    remote_config(ctx.store, name)                       # an unknown remote: refused here
    learn.check_learnable(ctx.store, ctx.ws, ctx.workspace_path)
    pushed, problems = await trio.to_thread.run_sync(_download, ctx, name, workspace,
                                                     session)
    async with ctx.mutation_lock:
        await ctx.flush_writes()
        turn = ctx.store.open_turn(ctx.ws)
        if turn is not None:
            raise TurnOpen(turn=turn.turn, session=turn.session)
        absent = await trio.to_thread.run_sync(learn.absent_paths, ctx.root_fd, pushed,
                                               ctx.live.ignore_rules())
        # no await from the commit to set_epoch (module docstring).  The new epoch may
        # take the dropped empty epoch's id (``_transfer._offset``); its "already
        # captured" set is empty either way, since nothing was captured in that epoch.
        learned = learn.commit(ctx.store, ctx.ws, pushed, absent, problems)
        ctx.fs.set_epoch(learned.epoch)
    await trio.to_thread.run_sync(ctx.store.flush)
    return learned.to_dict()


METHODS = {"push": push, "remote.learn": remote_learn}
PARAMS = {"push": ("remote", "session", "wait"),        # control.methods checks them
          "remote.learn": ("remote", "session", "workspace")}
