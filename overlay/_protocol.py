"""Control protocol v1: message parsing and validation, the method table, a client.

Wire format (DESIGN.md): one JSON object per line, UTF-8, at most ``MAX_LINE`` bytes.

    → {"v":1,"id":7,"method":"turn.begin","params":{...}}
    ← {"v":1,"id":7,"event":{...}}                      (zero or more, long operations)
    ← {"v":1,"id":7,"ok":true,"result":{...}}           (exactly one)
    ← {"v":1,"id":7,"ok":false,"error":{"code":...,"message":...}}

A handler is ``async def h(ctx, params: dict, emit) -> dict``: ``ctx`` is the daemon's
``DaemonContext``, ``emit(*events)`` an async function sending one progress line per
event (several in one write).  Handlers
raise ``RewindfsError`` subclasses for refusals; the server turns them into error
lines and keeps serving.  ``TABLE`` maps method names to handlers; the restore engine's
methods are merged in from ``overlay._rewind_service.METHODS`` when that module exists.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import trio

from rewindfs.store._errors import EXIT_USAGE, RewindfsError, all_error_classes

from ._fdbudget import EXHAUSTED

log = logging.getLogger(__name__)

__all__ = ["BadJson", "BadParams", "BadReply", "BadVersion", "FdExhausted", "Forbidden",
           "LineBuffer", "MAX_LINE", "MAX_REPLY_LINE", "TABLE",
           "TooLarge", "UnknownMethod", "VERSION", "call", "error_from_dict",
           "parse_request", "opt_str", "req_int", "req_str"]

VERSION = 1
MAX_LINE = 1 << 20
# The blocking client's bound on one reply line.  File content is streamed in lines of
# ~256 KiB (``show``); a result can still be one long line (a dry run's ``changes`` of a
# huge tree), so the bound is generous, but it is a bound.
MAX_REPLY_LINE = 64 << 20


class ProtocolError(RewindfsError):
    """{message}"""

    code = "protocol-error"


class BadJson(ProtocolError):
    """The request is not a JSON object: {reason}."""

    code = "bad-json"


class BadVersion(ProtocolError):
    """Protocol version {got!r} is not supported (this daemon speaks v1)."""

    code = "bad-version"


class UnknownMethod(ProtocolError):
    """Unknown method {method!r}."""

    code = "unknown-method"
    exit_code = EXIT_USAGE


class BadParams(ProtocolError):
    """Bad parameters for {method}: {reason}."""

    code = "bad-params"
    exit_code = EXIT_USAGE


class TooLarge(ProtocolError):
    """The request line is longer than 1 MiB."""

    code = "too-large"


class Forbidden(ProtocolError):
    """Peer uid {uid} may not use this daemon (same uid or root only)."""

    code = "forbidden"


class FdExhausted(ProtocolError):
    """The daemon is out of file descriptors (EMFILE); request refused, try again."""

    code = "fd-exhausted"


class DaemonGone(ProtocolError):
    """The daemon closed the connection before answering."""

    code = "daemon-gone"


class BadReply(ProtocolError):
    """Bad reply from the daemon: {reason}."""

    code = "bad-response"


class LineBuffer:
    """Newline framing in linear time: bytes in (``feed``), complete lines out
    (``next_line``).  Each byte is searched for ``b"\n"`` once — the search resumes
    where the last one stopped — and a line is copied out once (``del`` of a
    ``bytearray``'s head is cheap), so N bytes cost O(N) however they are split.
    ``searched`` counts the bytes searched (the tests' measure); ``pending()`` is the
    size of the partial line held, for the caller's limit."""

    def __init__(self):
        self._buf = bytearray()
        self._seen = 0          # bytes of _buf known to hold no newline
        self.searched = 0

    def feed(self, data) -> None:
        self._buf += data

    def pending(self) -> int:
        return len(self._buf)

    def clear(self) -> None:
        self._buf.clear()
        self._seen = 0

    def next_line(self) -> bytes | None:
        nl = self._buf.find(b"\n", self._seen)
        if nl < 0:
            self.searched += len(self._buf) - self._seen
            self._seen = len(self._buf)
            return None
        self.searched += nl + 1 - self._seen
        line = bytes(self._buf[:nl])
        del self._buf[:nl + 1]
        self._seen = 0
        return line


def parse_request(line: bytes) -> tuple[object, str, dict]:
    """Validate one request line; return ``(id, method, params)`` or raise a ProtocolError.

    The error carries ``.request_id`` when the id could be read, so the reply can echo it.
    """
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadJson(reason=str(exc)) from None
    except RecursionError:   # deeply nested junk: refuse it, do not crash the handler
        raise BadJson(reason="nested too deeply") from None
    if not isinstance(msg, dict):
        raise BadJson(reason="not an object")
    rid = msg.get("id")
    try:
        if msg.get("v") != VERSION or isinstance(msg.get("v"), bool):   # true == 1
            raise BadVersion(got=msg.get("v"))
        if not isinstance(rid, (int, str)) or isinstance(rid, bool):
            raise BadParams(method="request", reason="'id' must be an integer or a string")
        method = msg.get("method")
        if not isinstance(method, str):
            raise BadParams(method="request", reason="'method' must be a string")
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise BadParams(method=method, reason="'params' must be an object")
    except ProtocolError as exc:
        exc.request_id = rid if isinstance(rid, (int, str)) else None
        raise
    return rid, method, params


# -- parameter helpers (raise BadParams with the method name) ---------------------------

def req_str(params: dict, name: str, method: str, *, empty: bool = False) -> str:
    value = params.get(name)
    if not isinstance(value, str) or (not empty and not value):
        raise BadParams(method=method, reason=f"{name!r} must be a non-empty string")
    return check_text(value, name, method)


def check_text(value: str, name: str, method: str) -> str:
    """Names and labels are stored as UTF-8: a lone surrogate (valid JSON ``"\\ud800"``,
    not valid Unicode) is a bad parameter, not an internal error later."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadParams(method=method, reason=f"{name!r} is not valid Unicode") from None
    return value


def opt_str(params: dict, name: str, method: str) -> str | None:
    if params.get(name) is None:
        return None
    return req_str(params, name, method)


def req_int(params: dict, name: str, method: str, *, minimum: int | None = None) -> int:
    value = params.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or (
            minimum is not None and value < minimum):
        bound = f" ≥ {minimum}" if minimum is not None else ""
        raise BadParams(method=method, reason=f"{name!r} must be an integer{bound}")
    return value


# -- the method table -------------------------------------------------------------------

async def turn_begin(ctx, params: dict, emit) -> dict:
    session = req_str(params, "session", "turn.begin")
    turn = req_int(params, "turn", "turn.begin", minimum=1)
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
    async with _mutation_lock(ctx):
        await ctx.flush_writes()
        # No await between the epoch switch and telling the filesystem: no FUSE request
        # can run in between, so every change lands in exactly one of the two epochs.
        # another session's open turn: TurnOpen (nothing changed) unless forced
        epoch = ctx.store.begin_turn(ctx.ws, session, turn, label, force=force,
                                     flush=False)   # durable within _FLUSH_EVERY_S
        ctx.fs.set_epoch(epoch.id)
    return {"epoch": epoch.id}


def _mutation_lock(ctx) -> trio.Lock:
    from ._rewind_service import rewind_lock  # late: _rewind_service imports this module
    return rewind_lock(ctx)


async def turn_end(ctx, params: dict, emit) -> dict:
    session = opt_str(params, "session", "turn.end")
    async with _mutation_lock(ctx):
        await ctx.flush_writes()
        # no await until set_epoch (see turn_begin); another session's turn stays open
        epoch = ctx.store.end_turn(ctx.ws, session, flush=False)
        ctx.fs.set_epoch(epoch.id)
    return {"epoch": epoch.id}


async def status(ctx, params: dict, emit) -> dict:
    cur = ctx.store.current_epoch(ctx.ws)
    open_turn = ctx.store.open_turn(ctx.ws)
    out = {
        "workspace": os.fsdecode(ctx.workspace_path), "store": str(ctx.store.path),
        "socket": os.fsdecode(ctx.socket_path), "epoch": cur.id,
        "epoch_kind": cur.kind, "mounted": True, "pid": os.getpid(),
        "open_turn": open_turn.as_point() if open_turn else None,
        "fs": ctx.fs.statistics(),
    }
    bypass = await ctx.bypass_processes()
    if bypass:
        out["bypass_writes"] = {"possible": True, "pids": bypass,
                                "hint": 'these processes work in the bare directory; '
                                        'they should re-enter it (cd "$PWD")'}
    intent = ctx.store.get_intent(ctx.ws)
    if intent:
        out["intent"] = True
    if params.get("usage") is True:   # on request (rewindfs status): a pass over the
        # epochs and a stat per blob file — off the FUSE thread
        out["usage"] = await trio.to_thread.run_sync(ctx.store.usage, ctx.ws)
    return out


async def points(ctx, params: dict, emit) -> dict:
    session = opt_str(params, "session", "points")
    return {"points": [e.as_point() for e in ctx.store.points(ctx.ws, session)]}


async def fork(ctx, params: dict, emit) -> dict:
    child = req_str(params, "child", "fork")
    parent = req_str(params, "parent", "fork")
    boundary = req_int(params, "boundary_turn", "fork", minimum=0)
    ctx.store.fork_session(child, parent, boundary)
    return {}


async def unmount(ctx, params: dict, emit) -> dict:
    ctx.request_unmount()  # takes effect after this reply is sent
    return {}


TABLE = {
    "turn.begin": turn_begin,
    "turn.end": turn_end,
    "status": status,
    "points": points,
    "fork": fork,
    "unmount": unmount,
}

try:
    from rewindfs.overlay._rewind_service import METHODS as _RW
    TABLE.update(_RW)
except ImportError:
    pass


# -- client -------------------------------------------------------------------------------

def error_from_dict(err: dict) -> RewindfsError:
    """Rebuild the error class named by a protocol error's ``code`` (for exit codes)."""
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message", "") if isinstance(err, dict) else str(err)
    for cls in all_error_classes():
        if cls.code == code:
            exc = cls.__new__(cls)
            RewindfsError.__init__(exc, message)
            return exc
    exc = RewindfsError(message)
    exc.code = code or "error"
    return exc


def _connect(s: socket.socket, path: bytes) -> None:
    # A full listen backlog answers EAGAIN on a socket with a timeout; retry briefly.
    for delay in (0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0):
        try:
            s.connect(path)
            return
        except BlockingIOError:
            time.sleep(delay)
    s.connect(path)


def call(sock_path, method: str, params: dict | None = None, *, on_event=None,
         timeout: float | None = None, request_id=1) -> dict:
    """Blocking client: send one request, pass events to ``on_event``, return the result.

    Raises the ``RewindfsError`` subclass matching an error reply's code,
    ``DaemonGone`` if the connection closes first, ``OSError`` if it cannot connect,
    ``UnsafeSocket`` (nothing sent) if the socket or the process answering on it
    belongs to neither our uid nor root.
    """
    from ._paths import check_socket_owner   # late: _paths is light, but keep imports flat

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        check_socket_owner(sock_path)          # before connecting: owner of the file
        _connect(s, os.fsencode(sock_path))
        check_socket_owner(sock_path, s)       # before sending: the process answering
        req = {"v": VERSION, "id": request_id, "method": method, "params": params or {}}
        s.sendall(json.dumps(req).encode() + b"\n")
        lines = LineBuffer()
        while True:
            while (line := lines.next_line()) is None:
                if lines.pending() > MAX_REPLY_LINE:
                    raise BadReply(reason=f"a reply line over {MAX_REPLY_LINE >> 20} MiB")
                chunk = s.recv(65536)
                if not chunk:
                    raise DaemonGone()
                lines.feed(chunk)
            try:
                msg = json.loads(line)
            except (ValueError, RecursionError):
                raise BadReply(reason=f"not JSON: {line[:80]!r}") from None
            if not isinstance(msg, dict):
                raise BadReply(reason=f"not an object: {line[:80]!r}")
            if "event" in msg:
                if on_event is not None:
                    on_event(msg["event"])
                continue
            if msg.get("ok"):
                return msg.get("result", {})
            raise error_from_dict(msg.get("error", {}))


# -- server side of one connection ------------------------------------------------------

def reply_ok(rid, result) -> bytes:
    return json.dumps({"v": VERSION, "id": rid, "ok": True, "result": result}).encode() + b"\n"


def reply_error(rid, exc: RewindfsError) -> bytes:
    return json.dumps({"v": VERSION, "id": rid, "ok": False,
                       "error": exc.to_dict()}).encode() + b"\n"


async def dispatch(ctx, line: bytes, send) -> None:
    """Handle one request line; every outcome is exactly one reply line."""
    rid = None
    try:
        rid, method, params = parse_request(line)
        handler = TABLE.get(method)
        if handler is None:
            raise UnknownMethod(method=method)

        async def emit(*events: dict) -> None:
            await send(b"".join(json.dumps({"v": VERSION, "id": rid, "event": e}).encode()
                                + b"\n" for e in events))

        result = await handler(ctx, params, emit)
        await send(reply_ok(rid, result if result is not None else {}))
    except RewindfsError as exc:
        rid = getattr(exc, "request_id", rid)
        await send(reply_error(rid, exc))
    except (trio.Cancelled, trio.BrokenResourceError, trio.ClosedResourceError):
        raise   # cancelled, or the client went away mid-reply (`rewindfs show | head`)
    except Exception as exc:  # a bug must not take the daemon down
        if isinstance(exc, OSError) and exc.errno in EXHAUSTED:
            log.warning("control request refused: %s", exc, exc_info=True)
            await send(reply_error(rid, FdExhausted()))    # refuse this one request
            return
        log.exception("control request failed")
        err = RewindfsError(f"internal error: {type(exc).__name__}: {exc}")
        err.code = "internal"
        await send(reply_error(rid, err))
