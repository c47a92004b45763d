"""Control protocol v1, the wire: framing, request parsing, ONE set of param readers,
replies, and errors on the wire.

Wire format (DESIGN.md): one JSON object per line, UTF-8, at most ``MAX_LINE`` bytes.

    → {"v":1,"id":7,"method":"turn.begin","params":{...}}
    ← {"v":1,"id":7,"event":{...}}                      (zero or more, long operations)
    ← {"v":1,"id":7,"ok":true,"result":{...}}           (exactly one)
    ← {"v":1,"id":7,"ok":false,"error":{"code":...,"message":...}}

Every param reader raises ``BadParams`` naming the method, so a bad request is refused
before anything changes.  ``MAX_LINE`` and ``LineBuffer`` are the plugin's (their one
Python home).  The methods are in ``methods``/``rewind_methods``, the server in
``server``, the CLI's client in ``client``.
"""

from __future__ import annotations

import json
import logging
import os

from rewindfs.plugin._protocol import MAX_LINE, LineBuffer  # their one Python home
from rewindfs.store._errors import BadPath, PathEscape, RewindfsError, all_error_classes
from rewindfs.store._preimage import check_relpath

from rewindfs.overlay.errors import BadJson, BadParams, BadVersion, ProtocolError

log = logging.getLogger(__name__)

__all__ = ["LineBuffer", "MAX_LINE", "MAX_REPLY_LINE", "VERSION", "check_text", "error_from_dict",
           "flag", "opt_paths", "opt_str", "parse_request", "point_param", "reply_error", "reply_ok",
           "req_int", "req_str", "wire_path"]

VERSION = 1
# The blocking client's bound on one reply line.  File content is streamed in lines of
# ~256 KiB (``show``); a result can still be one long line (a dry run's ``changes`` of a
# huge tree), so the bound is generous, but it is a bound.
MAX_REPLY_LINE = 64 << 20




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

_NAME_MAX = 255


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


def req_int(params: dict, name: str, method: str, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    value = params.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or (
            minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        if minimum is not None and maximum is not None:
            bound = f" from {minimum} to {maximum}"
        elif minimum is not None:
            bound = f" ≥ {minimum}"
        else:
            bound = f" ≤ {maximum}" if maximum is not None else ""
        raise BadParams(method=method, reason=f"{name!r} must be an integer{bound}")
    return value


def wire_path(value, method: str) -> bytes:
    """A workspace-relative path from the wire (str, surrogateescape) → bytes.
    ``""``/``"."`` = the whole workspace; absolute paths and ``..`` are refused."""
    if not isinstance(value, str):
        raise BadParams(method=method, reason="paths must be strings")
    try:   # non-UTF-8 bytes travel as surrogateescape; other lone surrogates are junk
        raw = os.fsencode(value)
    except UnicodeEncodeError:
        raise BadParams(method=method, reason=f"path {value!r} is not encodable") from None
    if raw.startswith(b"/"):
        raise PathEscape(path=raw, reason="absolute path; give it relative to the workspace")
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if b".." in parts:
        raise PathEscape(path=raw, reason="'..' component")
    if any(len(p) > _NAME_MAX for p in parts):   # no such name can exist
        raise BadPath(path=raw[:64] + b"...", reason=f"a name longer than {_NAME_MAX} bytes")
    return check_relpath(b"/".join(parts))      # NUL, over 4096 bytes: BadPath


def opt_paths(params: dict, method: str) -> list[bytes] | None:
    value = params.get("paths")
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise BadParams(method=method, reason="'paths' must be a non-empty list of strings")
    return [wire_path(v, method) for v in value]


def point_param(params: dict, name: str, method: str, *, required: bool = True):
    value = params.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise BadParams(method=method, reason=f"{name!r} must be an epoch id or a turn")
    return value


def flag(params: dict, name: str, method: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise BadParams(method=method, reason=f"{name!r} must be true or false")
    return value


# -- replies and errors on the wire ----------------------------------------------------

def reply_ok(rid, result) -> bytes:
    return json.dumps({"v": VERSION, "id": rid, "ok": True, "result": result}).encode() + b"\n"


def reply_error(rid, exc: RewindfsError) -> bytes:
    return json.dumps({"v": VERSION, "id": rid, "ok": False,
                       "error": exc.to_dict()}).encode() + b"\n"


def error_from_dict(err: dict) -> RewindfsError:
    """Rebuild the error class named by a protocol error's ``code`` (for exit codes)."""
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message", "") if isinstance(err, dict) else str(err)
    data = err.get("data") if isinstance(err, dict) else None
    data = {k: v for k, v in data.items() if isinstance(k, str)} if isinstance(data, dict) else {}
    for cls in all_error_classes():
        if cls.code == code:
            exc = cls.__new__(cls)
            RewindfsError.__init__(exc, message, **data)   # ``data`` stays for --json
            return exc
    exc = RewindfsError(message)
    exc.code = code or "error"
    return exc
