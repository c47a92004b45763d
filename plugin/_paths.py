"""Where things live, for every Python side: the default store, the control socket,
and finding the daemon that serves a directory.

This is the one Python home of these three rules.  The daemon and the CLI
(``overlay/``) import them from here; the plugin may import nothing from ``overlay`` or
``store``, so the home has to be on the plugin's side, and this module imports only the
standard library (``store/`` is handed its path and has no default of its own).  The
JavaScript plugin carries the one other copy (``plugin/dsh/lib/paths.js``); both are
tested against ``tests/e2e/socket_path_vectors.json``.

The socket path is a pure function of the store's real path and the workspace's real
path (``docs/architecture.md``, "Control socket")::

    ${XDG_RUNTIME_DIR:-/tmp}/rewindfs-<uid>/<sha256(store_real + NUL + ws_real), first 16 hex>.sock

SHA-256 because every runtime has it built in (``hashlib``, ``node:crypto``); cut to 16
hex digits (64 bits) so the name is exactly as long as the xxh3-64 one it replaced: a
``sun_path`` holds 107 bytes, and an ``XDG_RUNTIME_DIR`` (or a test's temporary
directory) that fitted before still fits.  64 bits only have to keep one user's own
workspaces apart (by accident; nobody else can name a socket in the 0700 runtime
directory), and the NUL keeps ``("/a/b", "/c")`` apart from ``("/a", "/b/c")``.

A client finds the daemon from any directory inside a workspace by walking up from
that directory and computing the path for each ancestor; the first socket that exists
wins.  That costs one ``stat`` per ancestor and needs no configuration.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

__all__ = ["DIGEST_HEX", "control_socket_path", "default_store_path", "find_socket",
           "socket_path_for"]

DIGEST_HEX = 16  # hex digits of the SHA-256 kept in the socket name (see above)


def default_store_path() -> pathlib.Path:
    """``$REWINDFS_HOME``, else ``$XDG_DATA_HOME/rewindfs``, else ``~/.local/share/rewindfs``
    (an empty variable counts as unset)."""
    if home := os.environ.get("REWINDFS_HOME"):
        return pathlib.Path(home)
    if data := os.environ.get("XDG_DATA_HOME"):
        return pathlib.Path(data) / "rewindfs"
    return pathlib.Path.home() / ".local" / "share" / "rewindfs"


def socket_path_for(store_real: bytes, ws_real: bytes, uid: int, runtime_dir: bytes | None) -> bytes:
    """The pure core: no file system access, no environment (what the vectors pin)."""
    digest = hashlib.sha256(store_real + b"\0" + ws_real).hexdigest()[:DIGEST_HEX].encode()
    base = runtime_dir or b"/tmp"
    return base + b"/rewindfs-%d/" % uid + digest + b".sock"


def control_socket_path(store_path, ws_path) -> bytes:
    """The socket a daemon for (*store_path*, *ws_path*) listens on; both made real first."""
    store_real = os.path.realpath(os.fsencode(os.path.abspath(os.fsencode(store_path))))
    ws_real = os.path.realpath(os.fsencode(ws_path))
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return socket_path_for(store_real, ws_real, os.getuid(), os.fsencode(runtime) if runtime else None)


def find_socket(start=".", store=None) -> tuple[bytes, bytes] | None:
    """``(socket, workspace_real)`` of the nearest served ancestor of *start*, or None.

    *store* defaults to :func:`default_store_path`.  Walks from the real path of
    *start* up to ``/``; the first ancestor whose socket exists wins.
    """
    store_path = os.fsencode(store) if store is not None else os.fsencode(default_store_path())
    current = os.path.realpath(os.fsencode(start))
    while True:
        sock = control_socket_path(store_path, current)
        if os.path.exists(sock):
            return sock, current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
