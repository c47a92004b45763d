"""Control-socket methods of remotes: ``push``.

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
"""

from __future__ import annotations

import math

import trio

from rewindfs.store._errors import RewindfsError

from rewindfs.overlay.control.host import DaemonHost
from rewindfs.overlay.control.wire import opt_str
from rewindfs.overlay.errors import BadParams

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


METHODS = {"push": push}
