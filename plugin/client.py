"""Control-socket clients: blocking :class:`Client` and :class:`TrioClient`.

Both speak protocol v1 (``plugin/_protocol.py``) over one Unix-socket connection,
one call at a time (calls on one client are serialized; use a client per thread or
task for parallel calls).  Every call either returns a typed result or raises
:class:`RewindfsClientError` whose ``code`` is the daemon's error code or one of the
client's own (``not-mounted``, ``daemon-unreachable``, ``connection-lost``,
``timeout``, ``bad-response``).  Progress events of long calls (rewind, redo) go to
the optional ``on_event`` callback, in order, before the call returns.

A timeout leaves the connection in an unknown state, so the client drops it and
reconnects on the next call.  The clients never retry a call by themselves: a
rewind is not idempotent from the caller's point of view.

Find a daemon with :meth:`Client.for_directory` (walks up from a directory inside
the workspace; see ``plugin/_paths.py``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket as _socket
import stat
import struct
import threading
import time

from . import _results as R
from ._errors import (BadResponse, ConnectionLost, DaemonUnreachable, NotMounted,
                      RewindfsClientError, Timeout, UnsafeSocket)
from ._paths import find_socket
from ._protocol import Conversation, ShowAssembler

log = logging.getLogger(__name__)

__all__ = ["Client", "TrioClient", "RewindfsClientError"]

DEFAULT_TIMEOUT = 60.0


def _locate(directory, store) -> tuple[bytes, bytes]:
    """(socket, workspace) of the daemon serving *directory*'s workspace."""
    found = find_socket(directory, store)
    if found is None:
        raise NotMounted(os.fsdecode(os.path.abspath(directory)))
    return found


def _unreachable(client, exc: OSError) -> DaemonUnreachable:
    """The connect error, and for a socket nobody listens on (``ECONNREFUSED``: its
    daemon died and left the file) the workspace a person brings back."""
    gone = client.workspace if exc.errno == errno.ECONNREFUSED else None
    return DaemonUnreachable(os.fsdecode(client.socket_path), exc.strerror or str(exc),
                             gone=gone and os.fsdecode(gone))


def _check_owner(path: bytes, sock=None) -> None:
    """Refuse (``UnsafeSocket``) a socket file not owned by us or root (``lstat``: a
    symlink is refused too) and, given the connected *sock*, a peer process that runs
    as neither (``SO_PEERCRED``).  Both clients call it before sending anything: in a
    squatted runtime directory another user could have put her own daemon there."""
    ok = (os.getuid(), 0)
    name = os.fsdecode(path)
    if sock is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return          # connect fails next: daemon-unreachable
        if not stat.S_ISSOCK(st.st_mode):
            raise UnsafeSocket(name, "it is not a socket")
        if st.st_uid not in ok:
            raise UnsafeSocket(name, f"it is owned by uid {st.st_uid}, not by us or root")
        return
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    uid = struct.unpack("3i", raw)[1]
    if uid not in ok:
        raise UnsafeSocket(name, f"the process answering runs as uid {uid}, not as us or root")


def _epoch(result: dict) -> int:
    return int(result["epoch"])


def _nothing(result: dict) -> None:
    return None


def _given(**params) -> dict:
    """The params that are set (an optional one is left out, not sent as null)."""
    return {k: v for k, v in params.items() if v is not None}


class _Calls:
    """The typed calls, written once for both clients.

    Each builds its request and hands it to ``self._run(method, params, parse,
    on_event)``: :class:`Client` runs it and returns the parsed result;
    :class:`TrioClient`'s ``_run`` is a coroutine function, so there every call
    returns an awaitable (``await c.status()``).
    """

    def _run(self, method: str, params: dict | None, parse, on_event=None):
        raise NotImplementedError

    def turn_begin(self, session: str, turn: int, label: str = "", *,
                   force: bool = False) -> int:
        """Mark the start of *turn* of *session*; returns the new epoch id.  Another
        session's open turn is refused (``turn-open``, naming it) unless *force*."""
        params = {"session": session, "turn": turn, "label": label}
        if force:
            params["force"] = True
        return self._run("turn.begin", params, _epoch)

    def turn_end(self, session: str | None = None) -> int:
        """End the open turn (of *session*, if given); returns the idle epoch that
        follows it."""
        return self._run("turn.end", {"session": session}, _epoch)

    def status(self) -> R.Status:
        return self._run("status", None, lambda r: R.from_wire(R.Status, r))

    def points(self, session: str | None = None) -> list[R.Point]:
        return self._run("points", {"session": session}, R.points)

    def rewind(self, to, *, paths=None, dry_run=False, session=None, undo_for=None,
               force=False, on_event=None) -> R.RewindResult:
        params = {"to": to, "paths": list(paths) if paths is not None else None,
                  "dry_run": dry_run or None, "session": session, "undo_for": undo_for,
                  "force": force or None}
        return self._run("rewind", params, R.RewindResult.parse, on_event)

    def redo(self, session=None, *, force=False, on_event=None) -> R.RewindResult:
        params = {"session": session, "force": force or None}
        return self._run("redo", params, R.RewindResult.parse, on_event)

    def diff(self, a, b, paths=None) -> list[R.Change]:
        return self._run("diff", {"a": a, "b": b, "paths": paths}, R.changes)

    def show(self, point, path: str) -> bytes:
        """The bytes of *path* at *point* (None: now); b"" if absent.  The daemon
        streams them in ``show.chunk`` events of ≤ 256 KiB, so no reply line is large."""
        parts = ShowAssembler()
        return self._run("show", {"point": point, "path": path, "stream": True},
                         parts.finish, parts.on_event)

    def fork(self, child: str, parent: str, boundary_turn: int) -> None:
        return self._run("fork", {"child": child, "parent": parent,
                                  "boundary_turn": boundary_turn}, _nothing)

    def remote_learn(self, remote: str, *, session: str | None = None,
                     workspace: str | None = None) -> dict:
        """Teach the workspace (no history here yet) the history pushed to *remote*:
        the remote workspace *workspace*, or the one where *session* ran turns.  No
        file changes; returns what was learned (``head_epoch``, ``epoch``, …).  Refused
        with ``learn-target-has-history`` when the store has history for it."""
        return self._run("remote.learn", _given(remote=remote, session=session,
                                                workspace=workspace), dict)

    def push(self, remote: str | None = None, *, session: str | None = None,
             wait: bool = False) -> dict:
        """Ask the daemon to push to *remote* (default: its only one); ``wait=False``
        queues it (``{queued: true, pending: N}``) and returns at once."""
        return self._run("push", _given(remote=remote, session=session, wait=bool(wait)),
                         dict)

    def gc(self, **policy) -> dict:
        return self._run("gc", policy, dict)

    def unmount(self) -> None:
        """Ask the daemon to unmount; refused with ``rewind-running`` while a rewind,
        redo or gc runs (ask again when ``status()`` has no ``busy``)."""
        return self._run("unmount", None, _nothing)


class Client(_Calls):
    """Blocking client.  Thread-safe (calls are serialized by a lock)."""

    def __init__(self, socket_path, *, timeout: float | None = DEFAULT_TIMEOUT,
                 workspace=None):
        self.socket_path = os.fsencode(socket_path)
        self.workspace = workspace      # known when found from a directory: for errors
        self.timeout = timeout
        self._sock: _socket.socket | None = None
        self._conv: Conversation | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_directory(cls, directory=".", *, store=None, timeout=DEFAULT_TIMEOUT) -> Client:
        """A client for the daemon serving *directory* (raises NotMounted if none)."""
        socket_path, workspace = _locate(directory, store)
        return cls(socket_path, timeout=timeout, workspace=workspace)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self):
        _check_owner(self.socket_path)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise _unreachable(self, exc) from None
        try:
            _check_owner(self.socket_path, sock)
        except UnsafeSocket:
            sock.close()
            raise
        self._sock, self._conv = sock, Conversation()
        log.debug("connected to %s", os.fsdecode(self.socket_path))

    def _run(self, method, params, parse, on_event=None):
        return parse(self.call(method, params, on_event=on_event))

    def call(self, method: str, params: dict | None = None, *, on_event=None) -> dict:
        """Send one request; return its result dict or raise RewindfsClientError."""
        with self._lock:
            if self._sock is None:
                self._connect()
            try:
                return self._exchange(method, params, on_event)
            except (Timeout, ConnectionLost, BadResponse, OSError) as exc:
                self.close()  # state unknown: the next call reconnects
                if isinstance(exc, OSError):
                    raise ConnectionLost() from exc
                raise

    def _exchange(self, method, params, on_event) -> dict:
        rid, line = self._conv.request(method, params)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            self._sock.sendall(line)
        except TimeoutError:
            raise Timeout(method, self.timeout) from None
        while True:
            reply = self._conv.next_reply(rid)
            if reply is None:
                self._recv_into_conv(method, deadline)
                continue
            if reply.final:
                return Conversation.raise_for(reply)
            if on_event is not None:
                on_event(reply.event)

    def _recv_into_conv(self, method, deadline):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(method, self.timeout)
            self._sock.settimeout(left)
        try:
            data = self._sock.recv(65536)
        except TimeoutError:
            raise Timeout(method, self.timeout) from None
        if not data:
            raise ConnectionLost()
        self._conv.feed(data)


class TrioClient(_Calls):
    """trio client; the same calls as :class:`Client`, as coroutines.

    Use ``async with await TrioClient.open(path) as c:`` or
    ``TrioClient.for_directory(...)``; calls on one client are serialized by a lock.
    """

    def __init__(self, socket_path, *, timeout: float | None = DEFAULT_TIMEOUT,
                 workspace=None):
        import trio

        self._trio = trio
        self.socket_path = os.fsencode(socket_path)
        self.workspace = workspace
        self.timeout = timeout
        self._stream = None
        self._conv: Conversation | None = None
        self._lock = trio.Lock()

    @classmethod
    def for_directory(cls, directory=".", *, store=None, timeout=DEFAULT_TIMEOUT) -> TrioClient:
        socket_path, workspace = _locate(directory, store)
        return cls(socket_path, timeout=timeout, workspace=workspace)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()

    async def call(self, method: str, params: dict | None = None, *, on_event=None) -> dict:
        trio = self._trio
        async with self._lock:
            if self._stream is None:
                _check_owner(self.socket_path)
                try:
                    stream = await trio.open_unix_socket(self.socket_path)
                except OSError as exc:
                    raise _unreachable(self, exc) from None
                try:
                    _check_owner(self.socket_path, stream.socket)
                except UnsafeSocket:
                    await stream.aclose()
                    raise
                self._stream = stream
                self._conv = Conversation()
            try:
                with trio.fail_after(self.timeout if self.timeout is not None else float("inf")):
                    return await self._exchange(method, params, on_event)
            except trio.TooSlowError:
                await self.aclose()
                raise Timeout(method, self.timeout) from None
            except (ConnectionLost, BadResponse, trio.BrokenResourceError, OSError) as exc:
                await self.aclose()
                if isinstance(exc, (ConnectionLost, BadResponse)):
                    raise
                raise ConnectionLost() from exc

    async def _exchange(self, method, params, on_event) -> dict:
        rid, line = self._conv.request(method, params)
        await self._stream.send_all(line)
        while True:
            reply = self._conv.next_reply(rid)
            if reply is None:
                data = await self._stream.receive_some(65536)
                if not data:
                    raise ConnectionLost()
                self._conv.feed(data)
                continue
            if reply.final:
                return Conversation.raise_for(reply)
            if on_event is not None:
                on_event(reply.event)

    async def _run(self, method, params, parse, on_event=None):
        return parse(await self.call(method, params, on_event=on_event))
