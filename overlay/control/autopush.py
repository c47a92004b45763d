"""Pushing from the daemon: one ``Pusher`` per remote, a bounded coalescing queue, a
worker thread per push (docs/remote.md "Pushing in the background").

Contract:

- ``Pusher.request_nowait()`` never waits and never fails: it counts one more request
  and wakes the pusher.  The queue is bounded by construction: a push sends everything
  not yet pushed, so however many requests wait they are served by *one* push — the
  one that starts after them (a push that was already running when a request came may
  have read the history before that turn end, so it does not count for it).
- A push runs in a worker thread (``trio.to_thread``): the tree walk, the hashing and
  the uploads never run on the trio thread, so FUSE requests and turn marks go on.
  It reads the tree through its own ``dup`` of the root fd (never through the mount)
  and the store through its own LMDB transactions; the trio thread only starts it and
  takes its result.
- At most one push per remote runs at a time (``lock``): the background loop and a
  ``push`` request with ``wait`` take turns.
- A failure is kept (``last_error``, with its time) and retried with backoff
  (``BACKOFF_S``, capped by ``$REWINDFS_PUSH_RETRY_MAX_S``); it never touches the local
  history and never fails a turn mark.
- ``finish(bound)`` (unmount): one last attempt for each remote with work left, for at
  most ``bound`` seconds; the push thread checks the deadline before every path and
  every object and stops (``PushStopped``); a thread stuck in one network call is left
  behind (``abandon_on_cancel``), the daemon exits without waiting for it.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import trio

from rewindfs.store._errors import RewindfsError
from rewindfs.store.remote import open_backend

from rewindfs.overlay.errors import PushStopped
from rewindfs.overlay.rewind import remote as tree_remote

log = logging.getLogger(__name__)

__all__ = ["Pusher", "Pushers", "final_bound_s"]

BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)
# How long a thread holding the GIL keeps it while another waits (CPython's default is
# 5 ms).  A push thread hashes and compresses in Python for seconds; at 5 ms a turn mark,
# which needs the GIL back a few times per round trip, waited up to 10-15 ms behind it.
SWITCH_INTERVAL_S = 0.0005


def _retry_max_s() -> float:
    return float(os.environ.get("REWINDFS_PUSH_RETRY_MAX_S", BACKOFF_S[-1]))


def final_bound_s() -> float:
    """How long the last attempt at unmount may take (``$REWINDFS_PUSH_FINAL_S``)."""
    return float(os.environ.get("REWINDFS_PUSH_FINAL_S", "10"))


class Pusher:
    """The pushes of one workspace to one remote.  ``host``: the daemon context
    (``store``, ``ws``, ``root_fd``, ``workspace_path``, ``ignore_rules()``)."""

    def __init__(self, host, name: str):
        self.host, self.name = host, name
        self.lock = trio.Lock()
        self.requests = 0             # requests no finished push has served yet
        self.state = "idle"           # idle | pushing | retrying
        self.failures = 0
        self.pushes = 0               # successful pushes since the mount
        self.last_error: dict | None = None
        self.retry_at_ns: int | None = None
        self.stop_at: float | None = None     # monotonic deadline, read by the thread
        self.closed = False
        self._wake = trio.Event()
        self._backend = None

    # -- the queue --------------------------------------------------------------------
    def request_nowait(self) -> int:
        """One more push wanted; the number of requests now waiting."""
        self.requests += 1
        self._wake.set()
        return self.requests

    async def serve(self) -> None:
        """The background loop: wait for requests, push, back off after a failure."""
        while not self.closed:
            await self._wake.wait()
            self._wake = trio.Event()
            while self.requests and not self.closed:
                try:
                    await self.push()
                except RewindfsError:
                    await self._back_off()

    async def _back_off(self) -> None:
        delay = min(BACKOFF_S[min(self.failures, len(BACKOFF_S)) - 1], _retry_max_s())
        self.state = "retrying"
        self.retry_at_ns = time.time_ns() + int(delay * 1e9)
        await trio.sleep(delay)
        if self.state == "retrying":
            self.state = "idle"
        self.retry_at_ns = None

    # -- one push ---------------------------------------------------------------------
    async def push(self, progress=None) -> dict:
        """Push now (after any running push of this remote): the ``push.done`` record.
        ``progress(event)`` is called on the trio thread with each ``push.progress``
        record.  Raises the push's ``RewindfsError`` (kept as ``last_error``)."""
        async with self.lock:
            served = self.requests
            self.state = "pushing"
            try:
                done = await trio.to_thread.run_sync(
                    self._push_sync, _relay(progress), abandon_on_cancel=True)
            except RewindfsError as exc:
                self._failed(exc)
                raise
            except Exception as exc:   # a bug or an OSError: kept and retried like any
                log.exception("push to %s failed", self.name)
                wrapped = PushStopped(remote=self.name, reason=f"{type(exc).__name__}: {exc}")
                self._failed(wrapped)
                raise wrapped from exc
            self.requests = max(0, self.requests - served)
            self.state, self.failures = "idle", 0
            self.pushes += 1
            return done

    def _failed(self, exc: RewindfsError) -> None:
        self.state = "idle"
        self.failures += 1
        self.last_error = {**exc.to_dict(), "at_ns": time.time_ns()}
        log.warning("push to %s failed (attempt %d): %s", self.name, self.failures, exc)

    def _push_sync(self, progress) -> dict:
        """In the worker thread: the whole push, on its own fd and transactions."""
        host = self.host
        config = tree_remote.remote_config(host.store, self.name)
        if self._backend is None or self._backend.config != config:
            self._backend = open_backend(config)
        fd = os.dup(host.root_fd)       # ours: the daemon may close its own at exit
        try:
            report = tree_remote.push_tree(host.store, host.ws, fd, self._backend, config,
                                           rules=host.ignore_rules(), progress=progress,
                                           check=self._check)
        finally:
            os.close(fd)
        return tree_remote.done_record(self.name, host.workspace_path, report)

    def _check(self) -> None:
        if self.stop_at is not None and time.monotonic() > self.stop_at:
            raise PushStopped(remote=self.name, reason="the daemon is unmounting")

    # -- what status shows ----------------------------------------------------------
    def statistics(self) -> dict:
        return {"state": self.state, "queued": self.requests, "failures": self.failures,
                "pushes": self.pushes,
                "last_error": self.last_error, "retry_at_ns": self.retry_at_ns}


def _relay(progress):
    """A ``push_workspace`` progress callback for the worker thread that hands
    ``push.progress`` records to ``progress`` on the trio thread, never blocking."""
    if progress is None:
        return None
    token = trio.lowlevel.current_trio_token()

    def deliver(event):
        try:
            progress(event)
        except Exception:   # an exception in run_sync_soon would end the daemon
            log.exception("push progress not delivered")

    def on_object(report, done, total):
        token.run_sync_soon(deliver, {"type": "push.progress", "objects": report.objects,
                                      "bytes": report.bytes, "blobs_done": done,
                                      "blobs_total": total})
    return on_object


class Pushers:
    """Every ``Pusher`` of the daemon, by remote name; ``auto`` is the remote of
    ``mount --auto`` (or None).  ``serve()`` runs in the daemon's nursery."""

    def __init__(self, host, auto: str | None = None):
        self.host, self.auto = host, auto
        self._by_name: dict[str, Pusher] = {}
        self._nursery = None
        self.finished: list | None = None

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.auto is not None:
                self.get(self.auto)
            await trio.sleep_forever()

    def get(self, name: str) -> Pusher:
        """The pusher of ``name``, started on first use; ``UnknownRemote``."""
        pusher = self._by_name.get(name)
        if pusher is None:
            self.host.store.remote(name)
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            pusher = self._by_name[name] = Pusher(self.host, name)
            self._nursery.start_soon(pusher.serve)
        return pusher

    def resolve(self, name: str | None) -> str:
        """A request's remote: the named one, else the auto remote, else the only one."""
        if name is None and self.auto is not None:
            return self.auto
        return tree_remote.default_remote(self.host.store, name)

    def turn_ended(self) -> None:
        """Queue a push to the auto remote (if any); never waits."""
        if self.auto is not None and self._nursery is not None and self.finished is None:
            self.get(self.auto).request_nowait()

    def status(self) -> dict:
        """``{"auto": name or None, "remotes": [...]}``: for every configured remote,
        what is not pushed (``Store.push_state``), and for those with a pusher its
        queue state; a pusher whose remote was removed meanwhile says ``removed``."""
        store, ws = self.host.store, self.host.ws
        names = store.remotes()
        out = []
        for name in sorted(set(names) | set(self._by_name)):
            row = {"remote": name, **(store.push_state(name, ws) if name in names
                                      else _REMOVED)}
            pusher = self._by_name.get(name)
            row.update(pusher.statistics() if pusher is not None else {"state": "idle"})
            out.append(row)
        return {"auto": self.auto, "remotes": out}

    async def finish(self, bound: float) -> dict | None:
        """The last attempt before unmount (once; later calls return the same): every
        remote with a pusher and unpushed epochs or queued requests is pushed, for at
        most ``bound`` seconds in all; then what is left, as ``status()`` — None when
        this daemon never pushed (nothing to say)."""
        if self.finished is not None or not self._by_name:
            return self.finished
        try:
            await self._last_attempts(bound)
            self.finished = self.status()
        except Exception:     # the unmount must go on whatever happened here
            log.exception("the last pushes before unmount failed")
            self.finished = {"auto": self.auto, "remotes": []}
        for row in self.finished["remotes"]:
            if row["remote"] in self._by_name and row["unpushed_epochs"]:
                log.warning("unmounting with %d epoch(s) not pushed to %s",
                            row["unpushed_epochs"], row["remote"])
        return self.finished

    async def _last_attempts(self, bound: float) -> None:
        deadline = time.monotonic() + bound
        for pusher in list(self._by_name.values()):
            pusher.closed, pusher.stop_at = True, deadline
            if pusher.requests or self._unpushed(pusher.name):
                with trio.move_on_at(trio.current_time() + max(0.0, deadline - time.monotonic())):
                    try:
                        await pusher.push()
                    except RewindfsError as exc:
                        log.warning("last push to %s before unmount: %s", pusher.name, exc)

    def _unpushed(self, name: str) -> int:
        if name not in self.host.store.remotes():
            return 0
        return self.host.store.push_state(name, self.host.ws)["unpushed_epochs"]


# a pusher's remote that was removed from the store while mounted
_REMOVED = {"removed": True, "workspace": None, "head_epoch": None, "pushed_epoch": None,
            "pushed_ns": None, "unpushed_epochs": 0}
