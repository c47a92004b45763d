"""The client's errors.

``plugin/`` may not import ``store`` (it talks only to the socket), so it has its own
root, :class:`RewindfsClientError`, carrying the same kebab-case ``code`` the daemon
sends (``turn-open``, ``unknown-point``, ``relative-point``, ``nothing-to-redo``, …).
Scripts match ``.code``, never the text.  Codes born on this side:

- ``not-mounted``: no daemon serves that directory (no socket found);
- ``daemon-unreachable``: the socket exists but nobody answers (dead daemon);
- ``connection-lost``: the daemon closed the connection mid-call;
- ``timeout``: no reply within the client's timeout;
- ``bad-response``: the daemon sent something that is not protocol v1;
- ``unsafe-socket``: the socket, or the process answering on it, belongs to neither
  our uid nor root (a squatted runtime directory); nothing was sent.
"""

from __future__ import annotations

__all__ = ["BadResponse", "ConnectionLost", "DaemonUnreachable", "NotMounted",
           "RewindfsClientError", "Timeout", "UnsafeSocket"]


class RewindfsClientError(Exception):
    """A control-socket call failed; ``code`` says why (see the module docstring)."""

    default_code = "error"

    def __init__(self, message: str, *, code: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details = details or {}

    def __repr__(self):
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class NotMounted(RewindfsClientError):
    """No daemon serves that directory (no control socket found)."""

    default_code = "not-mounted"

    def __init__(self, path):
        super().__init__(f"{path} is not inside a workspace served by rewindfs "
                         "(no control socket found; run `rewindfs mount DIR`)")


class DaemonUnreachable(RewindfsClientError):
    """The socket exists but nobody answers on it (a dead daemon)."""

    default_code = "daemon-unreachable"

    def __init__(self, socket, reason, *, gone=None):
        # gone: the workspace whose daemon died (the same words as the dsh plugin's)
        hint = (f" (the daemon serving {gone} is gone: `rewindfs mount --recover {gone}`"
                " brings the workspace back)") if gone else ""
        super().__init__(f"no rewindfs daemon answers on {socket}: {reason}{hint}")


class ConnectionLost(RewindfsClientError):
    """The daemon closed the connection before replying."""

    default_code = "connection-lost"

    def __init__(self):
        super().__init__("the rewindfs daemon closed the connection before replying")


class Timeout(RewindfsClientError):
    """No reply within the client's timeout (the daemon may still apply the request)."""

    default_code = "timeout"

    def __init__(self, method, seconds):
        super().__init__(f"no reply to {method} within {seconds:g} s")


class BadResponse(RewindfsClientError):
    """The daemon sent something that is not protocol v1."""

    default_code = "bad-response"

    def __init__(self, *, reason):
        super().__init__(f"bad reply from the rewindfs daemon: {reason}")


class UnsafeSocket(RewindfsClientError):
    """The socket, or the process answering on it, is neither ours nor root's; nothing was sent."""

    default_code = "unsafe-socket"

    def __init__(self, socket, reason):
        super().__init__(f"refusing the control socket {socket}: {reason}; nothing was sent")
