"""The blocking control-socket client the CLI uses (the plugin has its own, in
``rewindfs.plugin``: the plugin may not import the overlay).

``call`` checks who owns the socket and who answers on it before sending anything
(``places.check_socket_owner``), then reads events and exactly one reply.
"""

from __future__ import annotations

import json
import os
import socket
import time

from rewindfs.overlay.control.wire import (MAX_REPLY_LINE, VERSION, LineBuffer,
                                           error_from_dict)
from rewindfs.overlay.errors import BadReply, DaemonGone, SentThenInterrupted
from rewindfs.overlay.places import check_socket_owner

__all__ = ["call"]


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
    belongs to neither our uid nor root, ``SentThenInterrupted`` for a Ctrl-C after the
    request was sent (the daemon carries it out all the same).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        check_socket_owner(sock_path)          # before connecting: owner of the file
        _connect(s, os.fsencode(sock_path))
        check_socket_owner(sock_path, s)       # before sending: the process answering
        req = {"v": VERSION, "id": request_id, "method": method, "params": params or {}}
        s.sendall(json.dumps(req).encode() + b"\n")
        try:
            return _reply(s, on_event)
        except KeyboardInterrupt:
            raise SentThenInterrupted() from None


def _reply(s: socket.socket, on_event) -> dict:
    """The result of the request just sent on *s*; events go to ``on_event``."""
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
