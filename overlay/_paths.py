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
import socket
import stat
import struct

import xxhash

from rewindfs.store._errors import EXIT_USAGE, RewindfsError, StoreInsideWorkspace
from rewindfs.store._location import is_inside  # noqa: F401  (re-exported for overlay modules)

__all__ = [
    "AlreadyMounted", "BadWorkspace", "MountFailed", "NotMounted", "RefusedWorkspace",
    "StaleMount", "UnsafeRuntimeDir", "UnsafeSocket", "UsageError", "check_socket_owner",
    "control_socket_path", "default_store_path", "ensure_runtime_dir", "open_log",
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


class UnsafeRuntimeDir(RewindfsError):
    """Refusing the runtime directory {path}: {reason}. Remove it (or set XDG_RUNTIME_DIR to a private directory) and try again."""

    code = "unsafe-runtime-dir"


class UnsafeSocket(RewindfsError):
    """Refusing the control socket {path}: {reason}; nothing was sent."""

    code = "unsafe-socket"


class UsageError(RewindfsError):
    """{message}

    The command line does not parse: an unknown option, a missing argument.
    """

    code = "usage"
    exit_code = EXIT_USAGE


def _fs(path) -> bytes:
    return os.fsencode(path)


def default_store_path() -> pathlib.Path:
    """``$REWINDFS_HOME``, else ``$XDG_DATA_HOME/rewindfs``, else ``~/.local/share/rewindfs``."""
    from rewindfs.store import default_store_path as store_default
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


def ensure_runtime_dir(path) -> bytes:
    """Create the runtime directory (``mkdir`` mode 0700) or accept an existing one only
    if ``lstat`` shows a real directory (not a symlink) owned by us with no group or
    other bits; raise ``UnsafeRuntimeDir`` (exit 2) otherwise.  Returns *path* (bytes).

    Why: without ``$XDG_RUNTIME_DIR`` the directory is ``/tmp/rewindfs-<uid>``, which
    any local user can create first (mode 0777, or a symlink to a directory of hers)
    to catch the daemon's log and socket.  Only the last component is checked: the
    base (``/tmp``, ``$XDG_RUNTIME_DIR``) is the system's or the user's own choice.
    Once verified the directory is ours and closed to others, so nobody else can put
    or swap a name inside it afterwards.
    """
    path = _fs(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafeRuntimeDir(path=os.fsdecode(path), reason=exc.strerror) from None
    st = os.lstat(path)
    reason = None
    if stat.S_ISLNK(st.st_mode):
        reason = "it is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        reason = "it is not a directory"
    elif st.st_uid != os.getuid():
        reason = f"it is owned by uid {st.st_uid}, not by uid {os.getuid()}"
    elif stat.S_IMODE(st.st_mode) & 0o077:
        reason = f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700"
    if reason is not None:
        raise UnsafeRuntimeDir(path=os.fsdecode(path), reason=reason)
    return path


def open_log(path) -> int:
    """Open the daemon's log for appending, never through a symlink (``O_NOFOLLOW``)
    and only if it is our own regular file; ``UnsafeRuntimeDir`` otherwise.  The caller
    has checked its directory with ``ensure_runtime_dir``."""
    path = _fs(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                     | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        why = "the log is a symlink" if exc.errno == errno.ELOOP else \
            f"the log cannot be opened: {exc.strerror}"
        raise UnsafeRuntimeDir(path=os.fsdecode(os.path.dirname(path)), reason=why) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise UnsafeRuntimeDir(path=os.fsdecode(os.path.dirname(path)),
                               reason="the log is not our own regular file")
    os.set_blocking(fd, True)
    return fd


def check_socket_owner(path, sock=None) -> None:
    """Raise ``UnsafeSocket`` unless *path* is a socket owned by us or by root (checked
    with ``lstat``: a symlink is refused) and, given the connected *sock*, the process
    answering on it runs as us or as root (``SO_PEERCRED``).  A client calls it before
    it sends anything: a socket in a squatted directory may be someone else's."""
    path = _fs(path)
    ok = (os.getuid(), 0)
    if sock is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return      # connecting fails next, with the usual "not mounted"
        if not stat.S_ISSOCK(st.st_mode):
            raise UnsafeSocket(path=os.fsdecode(path), reason="it is not a socket")
        if st.st_uid not in ok:
            raise UnsafeSocket(path=os.fsdecode(path),
                               reason=f"it is owned by uid {st.st_uid}, not by us or root")
        return
    uid = peer_uid(sock)
    if uid not in ok:
        raise UnsafeSocket(path=os.fsdecode(path),
                           reason=f"the process answering runs as uid {uid}, not as us or root")


def peer_uid(sock) -> int:
    """The uid of the process at the other end of a connected Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[1]


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
