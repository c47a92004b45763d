"""Protocol v1 of the control socket, client side, with no I/O (shared by both clients).

Newline-delimited JSON (``DESIGN.md``, "Control protocol")::

    → {"v":1,"id":7,"method":"turn.begin","params":{...}}
    ← {"v":1,"id":7,"event":{...}}                 (zero or more progress lines)
    ← {"v":1,"id":7,"ok":true,"result":{...}}       (exactly one final line)
    ← {"v":1,"id":7,"ok":false,"error":{"code":"turn-open","message":"..."}}

:class:`Conversation` turns requests into bytes and bytes into responses; the blocking
and the trio client only move bytes.  One request is outstanding at a time per
connection (the clients serialize), so a reply with another id is a protocol error.
"""

from __future__ import annotations

import json

from ._errors import BadResponse, RewindfsClientError

__all__ = ["MAX_LINE", "Conversation", "Reply"]

MAX_LINE = 1 << 20  # the daemon refuses longer lines ("too-large"); so do we


class Reply:
    """One parsed line: a progress event (``event`` set) or the final reply."""

    __slots__ = ("id", "event", "ok", "result", "error")

    def __init__(self, msg: dict):
        self.id = msg.get("id")
        self.event = msg.get("event")
        self.ok = msg.get("ok")
        self.result = msg.get("result")
        self.error = msg.get("error")

    @property
    def final(self) -> bool:
        return self.event is None


class Conversation:
    """Encodes requests and decodes replies of one connection."""

    def __init__(self):
        self._next_id = 1
        self._buffer = b""

    def request(self, method: str, params: dict | None) -> tuple[int, bytes]:
        """``(id, line)`` for one call; params with value None are left out."""
        rid = self._next_id
        self._next_id += 1
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        line = json.dumps({"v": 1, "id": rid, "method": method, "params": clean},
                          ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        if len(line) > MAX_LINE:
            raise RewindfsClientError("request too large", code="too-large")
        return rid, line

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > MAX_LINE and b"\n" not in self._buffer:
            raise BadResponse(reason="reply line over 1 MiB")

    def next_reply(self, rid: int) -> Reply | None:
        """The next complete line for request *rid*, or None until more bytes arrive."""
        nl = self._buffer.find(b"\n")
        if nl < 0:
            return None
        line, self._buffer = self._buffer[:nl], self._buffer[nl + 1:]
        try:
            msg = json.loads(line)
        except ValueError:
            raise BadResponse(reason=f"not JSON: {line[:80]!r}") from None
        if not isinstance(msg, dict) or msg.get("v") != 1:
            raise BadResponse(reason=f"not a v1 message: {line[:80]!r}")
        reply = Reply(msg)
        if reply.id is not None and reply.id != rid:
            raise BadResponse(reason=f"reply for id {reply.id}, expected {rid}")
        if not reply.final:
            return reply
        if reply.ok is True:
            return reply
        if reply.ok is False and isinstance(reply.error, dict):
            return reply
        raise BadResponse(reason=f"neither result nor error: {line[:80]!r}")

    @staticmethod
    def raise_for(reply: Reply) -> dict:
        """The result of a final reply, or the daemon's error raised as RewindfsClientError."""
        if reply.ok:
            return reply.result if isinstance(reply.result, dict) else {}
        err = reply.error
        raise RewindfsClientError(err.get("message", "error"), code=err.get("code", "error"),
                                  details={k: v for k, v in err.items()
                                           if k not in ("code", "message")})
