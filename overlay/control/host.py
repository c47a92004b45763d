"""What the control methods need from where they run — typed seams, not probing.

Two hosts run them: the daemon (``daemon.DaemonContext``, a live mount) and the CLI on
an unmounted workspace (``cli.rewind``'s offline host, no mount).  ``RewindHost`` is
what the restore-engine methods need from both; its ``live`` is the mount's hooks, or
``None`` offline (nothing to invalidate, fence or flush).  ``DaemonHost`` adds what the
socket-only methods need.  These are ``typing.Protocol``s: a host conforms by its shape,
and the methods never ask ``hasattr``.
"""

from __future__ import annotations

from typing import Protocol

import trio

from rewindfs.store import Store


class LiveMount(Protocol):
    """The mount's hooks the restore engine calls from its worker thread (each hops to
    the trio thread itself)."""

    def invalidate(self, relpath: bytes) -> None:
        """Drop the kernel's caches of *relpath* (queued, never blocks)."""

    def epoch_changed(self) -> None:
        """The store's current epoch changed behind the filesystem: reload it."""

    def fence_writes(self, key: tuple[int, int]) -> bool:
        """Refuse new writers of the file ``(st_dev, st_ino)``; False if one is open."""

    def unfence_writes(self, key: tuple[int, int]) -> None: ...

    def fence_rewind(self, entries) -> list[bytes]:
        """Fence the plan's paths against changes through the mount (invariant 14);
        returns the paths open for writing, which the run leaves alone."""

    def unfence_rewind(self) -> None: ...

    def ignore_rules(self):
        """The ``tree.ignore.IgnoreRules`` of ``.rewindignore`` now (the previous ones
        kept when an edit is invalid); a rewind restores by them and the point's
        (``engine._restore_rules``).  Capture also keeps the rules its epoch began
        with until the next epoch (``fs.ops``)."""


class RewindHost(Protocol):
    """Where rewind, redo, diff, show and gc run."""

    store: Store
    ws: int
    root_fd: int
    live: LiveMount | None


class DaemonHost(RewindHost, Protocol):
    """The daemon: a live mount, its socket, and the lock a turn mark and a rewind share."""

    mutation_lock: trio.Lock
    busy_with: str | None     # "rewind", "redo" or "gc" while one runs under the lock
    requests_running: int     # control requests being served (the server counts them)
    shutdown: trio.Event      # set once the daemon is to stop
    workspace_path: bytes
    socket_path: bytes
    mount_dev: int | None     # the mount's device number (found by it once moved)
    fs: object            # fs.ops.RewindOperations (not imported: control stays light)
    pushers: object       # control.autopush.Pushers (the background pushes)

    async def flush_writes(self) -> None: ...

    async def invalidations_settled(self) -> None: ...

    async def bypass_processes(self) -> list[int]: ...

    def request_unmount(self) -> None: ...
