"""Where things live: the store, the control socket, and which workspaces we accept.

``control_socket_path``, ``default_store_path`` and ``find_socket`` are the plugin's
(``rewindfs.plugin._paths``, their one Python home: the plugin may not import the
overlay, so the overlay imports the plugin's); they are re-exported here so overlay
modules find every "where" in one place.
"""

from __future__ import annotations

import errno
import os
import pathlib
import socket
import stat
import struct
import subprocess

from rewindfs.plugin._paths import control_socket_path, default_store_path, find_socket
from rewindfs.store._errors import StoreInsideWorkspace
from rewindfs.store._location import is_inside  # noqa: F401  (re-exported for overlay modules)
from rewindfs.overlay.errors import BadWorkspace, RefusedWorkspace, StaleMount, UnsafeRuntimeDir, UnsafeSocket

__all__ = ["check_socket_owner", "control_socket_path", "default_store_path", "find_socket", "ensure_runtime_dir", "open_log", "resolve_store_path", "check_workspace", "is_inside"]


def _fs(path) -> bytes:
    return os.fsencode(path)


def resolve_store_path(arg=None) -> pathlib.Path:
    """The store path a command uses: the explicit argument, else the default, made absolute."""
    path = pathlib.Path(os.fsdecode(arg)) if arg else default_store_path()
    return pathlib.Path(os.path.abspath(path))


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


# -- the mount table ---------------------------------------------------------------------

def _unescape(field: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def find_rewindfs_mount(real_path: bytes) -> bool:
    """True if /proc/self/mountinfo lists a ``fuse.rewindfs`` mount at *real_path*."""
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            left, _, right = line.partition(b" - ")
            fields = left.split()
            if len(fields) > 4 and _unescape(fields[4]) == real_path:
                if right.split(b" ", 1)[0] == b"fuse.rewindfs":
                    return True
    return False


def lazy_unmount(path) -> None:
    """Detach a (stale) FUSE mount: ``fusermount3 -uz``."""
    subprocess.run(["fusermount3", "-uz", os.fsdecode(path)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
