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

import base64
import json

from ._errors import BadResponse, RewindfsClientError

__all__ = ["MAX_LINE", "Conversation", "LineBuffer", "Reply", "ShowAssembler"]

# The longest line either end accepts: the daemon refuses a longer request
# ("too-large"), a client a longer reply; the daemon imports it from here.
MAX_LINE = 1 << 20


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


class LineBuffer:
    """Newline framing in linear time, for both ends of the socket (the daemon imports
    it from here; ``plugin`` imports nothing from ``overlay``): bytes in (``feed``),
    complete lines out (``next_line``).  Each byte is searched for ``b"\n"`` once — the
    search resumes where the last one stopped — and a line is copied out once (``del``
    of a ``bytearray``'s head is cheap), so N bytes cost O(N) however they are split.
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


class ShowAssembler:
    """Collects a ``show`` reply: ``show.chunk`` events (in order, each at the offset
    where the last ended) or, from a daemon that does not stream, the result's
    ``content_b64``.  ``on_event`` goes to the call, ``finish`` parses its result."""

    def __init__(self):
        self.data = bytearray()

    def on_event(self, event) -> None:
        if not isinstance(event, dict) or event.get("type") != "show.chunk":
            return
        if event.get("offset") != len(self.data) or not isinstance(event.get("data_b64"), str):
            raise BadResponse(reason=f"show.chunk at offset {event.get('offset')!r}, "
                                     f"expected {len(self.data)}")
        self.data += base64.b64decode(event["data_b64"])

    def finish(self, result: dict) -> bytes:
        if result.get("streamed"):
            if result.get("size") != len(self.data):
                raise BadResponse(reason=f"show sent {len(self.data)} bytes, "
                                         f"announced {result.get('size')!r}")
            return bytes(self.data)
        return base64.b64decode(result.get("content_b64") or b"")


class Conversation:
    """Encodes requests and decodes replies of one connection."""

    def __init__(self):
        self._next_id = 1
        self.lines = LineBuffer()

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
        self.lines.feed(data)

    def next_reply(self, rid: int) -> Reply | None:
        """The next complete line for request *rid*, or None until more bytes arrive.
        Linear in the bytes fed (``LineBuffer``); a partial line over ``MAX_LINE`` is a
        ``BadResponse`` (streamed content comes in lines of ~256 KiB)."""
        line = self.lines.next_line()
        if line is None:
            if self.lines.pending() > MAX_LINE:
                raise BadResponse(reason="reply line over 1 MiB")
            return None
        if len(line) > MAX_LINE:
            raise BadResponse(reason="reply line over 1 MiB")
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
