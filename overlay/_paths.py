"""Where things live: the store, the control socket, and which workspaces we accept.

``control_socket_path`` is part of the protocol (the plugin re-implements it and both
sides are tested against the same vectors), so it is a pure function of the store's
real path and the workspace's real path and nothing else but the uid and
``$XDG_RUNTIME_DIR``.

The overlay's own errors live here too; they hang off the project's one error root.
"""

from __future__ import annotations

import errno
import os
import pathlib
import stat

import xxhash

from store._errors import EXIT_USAGE, RewindfsError, StoreInsideWorkspace
from store._location import is_inside  # noqa: F401  (re-exported for overlay modules)

__all__ = [
    "AlreadyMounted", "BadWorkspace", "MountFailed", "NotMounted", "RefusedWorkspace",
    "StaleMount", "UsageError", "control_socket_path", "default_store_path",
    "resolve_store_path", "check_workspace", "is_inside",
]


class BadWorkspace(RewindfsError):
    """{path} is not a directory ({reason})."""

    code = "bad-workspace"


class RefusedWorkspace(RewindfsError):
    """Refusing to serve {path}: {reason}."""

    code = "refused-workspace"


class AlreadyMounted(RewindfsError):
    """{path} is already mounted (rewindfs status shows the daemon); unmount it first."""

    code = "already-mounted"


class StaleMount(RewindfsError):
    """{path} is a stale mount left by a dead daemon (transport endpoint not connected); run `rewindfs mount --recover {path}` to detach it and mount again."""

    code = "stale-mount"


class NotMounted(RewindfsError):
    """{path} is not served by a rewindfs daemon."""

    code = "not-mounted"


class MountFailed(RewindfsError):
    """Mounting {path} failed: {reason}."""

    code = "mount-failed"


class UsageError(RewindfsError):
    """{message}"""

    code = "usage"
    exit_code = EXIT_USAGE


def _fs(path) -> bytes:
    return os.fsencode(path)


def default_store_path() -> pathlib.Path:
    """``$REWINDFS_HOME``, else ``$XDG_DATA_HOME/rewindfs``, else ``~/.local/share/rewindfs``."""
    from store import default_store_path as store_default
    return store_default()


def resolve_store_path(arg=None) -> pathlib.Path:
    """The store path a command uses: the explicit argument, else the default, made absolute."""
    path = pathlib.Path(os.fsdecode(arg)) if arg else default_store_path()
    return pathlib.Path(os.path.abspath(path))


def control_socket_path(store_path, ws_real_path) -> bytes:
    """``${XDG_RUNTIME_DIR:-/tmp}/rewindfs-<uid>/<xxh3_64(store_real + NUL + ws_real)>.sock``.

    Both paths are made real (``os.path.realpath``) first; the digest is lowercase hex
    of xxh3-64 with seed 0 (16 characters), short enough for ``sun_path``.
    """
    store_real = os.path.realpath(_fs(store_path))
    ws_real = os.path.realpath(_fs(ws_real_path))
    digest = xxhash.xxh3_64_hexdigest(store_real + b"\0" + ws_real).encode()
    base = _fs(os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
    return base + b"/rewindfs-%d/" % os.getuid() + digest + b".sock"


def check_workspace(dir_path, store_path) -> bytes:
    """Validate a workspace directory and return its real path (bytes).

    Refuses: a missing path or a non-directory (``BadWorkspace``), ``/`` or the home
    directory itself (``RefusedWorkspace``), a store inside the workspace
    (``StoreInsideWorkspace``).  Mount state is checked by the daemon, not here.
    """
    raw = _fs(dir_path)
    real = os.path.realpath(raw)
    name = os.fsdecode(raw)
    try:
        st = os.stat(real)
        os.statvfs(real)  # never answered from a cache: a dead daemon's mount shows here
    except FileNotFoundError:
        raise BadWorkspace(path=name, reason="it does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            raise StaleMount(path=name) from None
        raise BadWorkspace(path=name, reason=exc.strerror) from None
    if not stat.S_ISDIR(st.st_mode):
        raise BadWorkspace(path=name, reason="not a directory")
    if real == b"/":
        raise RefusedWorkspace(path="/", reason="the root directory cannot be a workspace")
    home = os.path.realpath(os.path.expanduser(b"~"))
    if real == home:
        raise RefusedWorkspace(path=os.fsdecode(real),
                               reason="the home directory itself cannot be a workspace; "
                                      "pick a project directory")
    store_real = os.path.realpath(_fs(store_path))
    if is_inside(store_real, real):
        raise StoreInsideWorkspace(store=os.fsdecode(store_real), workspace=os.fsdecode(real))
    return real
