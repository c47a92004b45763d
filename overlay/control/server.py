"""The control socket's server: bind, accept, frame, dispatch.

- ``bind_socket``: 0600 in the verified runtime directory, exclusive (``bind`` never
  follows a symlink and fails on an existing name); refused if a live daemon answers.
- Every connection: the peer's uid must be ours or root (``forbidden`` otherwise), then
  newline-framed requests of at most ``MAX_LINE`` bytes (``too-large`` for a longer one,
  and the connection goes on after its newline), each dispatched to ``methods``.
- ``accept()`` out of fds never ends the loop (see ``serve_control``).

Nothing raised while serving one connection ends the daemon: it closes that
connection and is logged.
"""

from __future__ import annotations

import logging
import os
import socket

import trio

from rewindfs.overlay.control import methods, wire
from rewindfs.overlay.control.host import DaemonHost
from rewindfs.overlay.errors import (AlreadyMounted, DaemonStopping, FdExhausted, Forbidden,
                                     ProtocolError, TooLarge)
from rewindfs.overlay.places import ensure_runtime_dir, peer_uid
from rewindfs.overlay.tree.fdbudget import EXHAUSTED

log = logging.getLogger(__name__)

__all__ = ["bind_socket", "serve_control"]

_LISTEN_BACKLOG = 128


def bind_socket(sock_path: bytes, workspace: bytes) -> socket.socket:
    """Bind the 0600 control socket in the verified runtime directory
    (``ensure_runtime_dir``); refuse if a live daemon already answers on it.  ``bind``
    never follows a symlink and fails on any existing name (exclusive creation)."""
    ensure_runtime_dir(os.path.dirname(sock_path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(sock_path)
    except OSError:
        try:
            os.unlink(sock_path)  # left by a dead daemon
        except FileNotFoundError:
            pass
    else:
        raise AlreadyMounted(path=os.fsdecode(workspace))
    finally:
        probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(sock_path)
    finally:
        os.umask(old)
    os.chmod(sock_path, 0o600)
    sock.listen(_LISTEN_BACKLOG)
    return sock


async def _serve_connection(ctx: DaemonHost, stream: trio.SocketStream) -> None:
    """One client, until it hangs up.  Nothing raised here may end the daemon: a bug
    in serving one connection closes that connection and is logged."""
    async with stream:
        try:
            uid = peer_uid(stream.socket)
            if uid not in (os.getuid(), 0):
                log.warning("refused control connection from uid %d", uid)
                await stream.send_all(wire.reply_error(None, Forbidden(uid=uid)))
                return
            await _read_requests(ctx, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            log.exception("control connection failed; closed it")


async def _read_requests(ctx: DaemonHost, stream) -> None:
    lines = wire.LineBuffer()   # linear: each byte searched for a newline once
    skipping = False  # inside an oversized line: drop bytes up to its newline
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return
        lines.feed(data)
        while (line := lines.next_line()) is not None:
            if skipping:
                skipping = False
                continue
            if len(line) > wire.MAX_LINE:
                await stream.send_all(wire.reply_error(None, TooLarge()))
                continue
            if not line.strip():
                continue
            if ctx.shutdown.is_set():    # nothing new starts while the daemon stops
                await stream.send_all(wire.reply_error(
                    _request_id(line), DaemonStopping(path=os.fsdecode(ctx.workspace_path))))
                continue
            ctx.requests_running += 1
            try:
                await methods.dispatch(ctx, line, stream.send_all)
            finally:
                ctx.requests_running -= 1
            if ctx.unmount_pending:
                ctx.shutdown.set()
        if lines.pending() > wire.MAX_LINE:
            if not skipping:
                await stream.send_all(wire.reply_error(None, TooLarge()))
            skipping = True
            lines.clear()


def _request_id(line: bytes):
    """The id of a request line, to echo in a refusal (None if it cannot be read)."""
    try:
        return wire.parse_request(line)[0]
    except ProtocolError as exc:
        return exc.request_id


_BACKOFF_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)


async def serve_control(ctx: DaemonHost, listener: socket.socket) -> None:
    """Accept control connections until cancelled; each runs in its own task.

    ``accept()`` out of fds (``EMFILE``/``ENFILE``) never ends this loop: the inode
    table's cached fds are shed and the accept retried; if that frees nothing, a reserve
    fd kept for this moment is closed so the waiting client can be accepted and told
    ``fd-exhausted`` (instead of hanging in the backlog), then the reserve is reopened.
    Other accept errors (and a reserve that cannot be had) back off and retry.
    """
    tsock = trio.socket.from_stdlib_socket(listener)
    reserve = _reserve_fd()
    failures = 0
    async with trio.open_nursery() as nursery:
        while True:
            try:
                # wait first: accept() fails with EMFILE before it looks for a client,
                # so without the wait an exhausted daemon would spin here
                await trio.lowlevel.wait_readable(tsock)
                conn, _ = await tsock.accept()
                failures = 0
                nursery.start_soon(_serve_connection, ctx, trio.SocketStream(conn))
                continue
            except OSError as exc:
                if exc.errno in EXHAUSTED and ctx.fs.table.shed():
                    continue
                if exc.errno in EXHAUSTED and reserve is not None:
                    os.close(reserve)
                    reserve = None
                    _refuse_one(listener)
                    reserve = _reserve_fd()
                    continue
                log.warning("accept on the control socket failed: %s", exc)
            except Exception:
                log.exception("serving the control socket failed")
            delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
            failures += 1
            await trio.sleep(delay)
            reserve = reserve if reserve is not None else _reserve_fd()


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse_one(listener: socket.socket) -> None:
    """Accept one waiting client on the fd just freed, answer ``fd-exhausted``, close
    (never waits: no client waiting, nothing to do)."""
    try:
        raw, _ = listener.accept()
    except OSError:
        return
    log.warning("out of file descriptors: refused one control connection")
    with raw:
        try:
            raw.setblocking(False)
            raw.send(wire.reply_error(None, FdExhausted()))
            raw.shutdown(socket.SHUT_WR)
            # read what the client sent already: closing on unread data resets the
            # connection (the client's next send fails; its read still gets the line)
            while raw.recv(65536):
                pass
        except OSError:
            pass
