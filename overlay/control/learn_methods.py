"""Control-socket method of learning a remote history: ``remote.learn``.

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

import trio

from rewindfs.store._errors import TurnOpen
from rewindfs.store.remote import open_backend

from rewindfs.overlay.control.host import DaemonHost
from rewindfs.overlay.control.wire import opt_str, req_str
from rewindfs.overlay.rewind import learn
from rewindfs.overlay.rewind.remote import remote_config

__all__ = ["METHODS"]


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


METHODS = {"remote.learn": remote_learn}
