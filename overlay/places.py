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
import pwd
import socket
import stat
import struct
import subprocess
import typing

from rewindfs.plugin._paths import control_socket_path, default_store_path, find_socket
from rewindfs.store._errors import StoreInsideWorkspace
from rewindfs.store._location import is_inside  # noqa: F401  (re-exported for overlay modules)
from rewindfs.overlay.errors import (BadWorkspace, ForeignMount, RefusedWorkspace, StaleMount,
                                     UnsafeRuntimeDir, UnsafeSocket)

# What a mount whose daemon died answers: ENOTCONN through /dev/fuse, ECONNABORTED
# when it was served over io_uring (the kernel aborted the connection's ring).
DEAD_MOUNT = (errno.ENOTCONN, errno.ECONNABORTED)

__all__ = ["DEAD_MOUNT", "check_socket_owner", "control_socket_path", "default_store_path", "find_socket", "ensure_runtime_dir", "open_log", "resolve_store_path", "check_workspace", "check_place", "is_inside",
           "mount_table", "enclosing_rewindfs_mount", "check_mount_owner",
           "mount_answers", "mount_users", "rewindfs_mount_at"]


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

    Refuses, before anything is written or mounted (``rewindfs mount`` calls it in the
    CLI before it forks the daemon, and in the daemon before it opens the store): a
    place other people's or programs' files live in (``check_place``:
    ``RefusedWorkspace``, or ``ForeignMount`` for another uid's workspace), a missing
    path or a non-directory (``BadWorkspace``), a dead daemon's mount (``StaleMount``),
    a store inside the workspace (``StoreInsideWorkspace``).  Whether *this* directory
    is already mounted by us is the caller's check (``AlreadyMounted``).
    """
    raw = _fs(dir_path)
    real = os.path.realpath(raw)
    name = os.fsdecode(raw)
    check_place(real, store_path)
    try:
        os.statvfs(real)  # never answered from a cache: a dead daemon's mount shows here
    except (FileNotFoundError, NotADirectoryError):
        pass              # named by check_named_dir, as for -C
    except OSError as exc:
        if exc.errno in DEAD_MOUNT:
            raise StaleMount(path=name) from None
        raise BadWorkspace(path=name, reason=exc.strerror) from None
    check_named_dir(real, shown=name)
    store_real = os.path.realpath(_fs(store_path))
    if is_inside(store_real, real):
        raise StoreInsideWorkspace(store=os.fsdecode(store_real), workspace=os.fsdecode(real))
    return real


# Directories every user and program shares: a mount over one hides their files (and
# every daemon's socket, tmux's, X's) from everyone.  Their subdirectories are fine
# (a project under /tmp is usual), except under the kernel's own trees.
_SHARED = (b"/tmp", b"/var/tmp", b"/dev/shm", b"/run")
_SYSTEM_TREES = (b"/proc", b"/sys", b"/dev")


def check_named_dir(dir_path, *, shown: str | None = None) -> None:
    """A directory a command was pointed at (``-C DIR``, ``mount DIR``) exists and is
    one, else ``BadWorkspace`` naming it as *shown* (default: *dir_path*).  Anything
    else (a dead daemon's mount: ``ENOTCONN``) is left to the caller, which names it
    better (``check_workspace``: ``StaleMount``)."""
    name = shown if shown is not None else os.fsdecode(_fs(dir_path))
    try:
        st = os.stat(_fs(dir_path))
    except (FileNotFoundError, NotADirectoryError) as exc:
        reason = "it does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise BadWorkspace(path=name, reason=reason) from None
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise BadWorkspace(path=name, reason="not a directory")


def check_place(real: bytes, store_path) -> None:
    """Raise ``RefusedWorkspace`` (exit 2) if the real path *real* is a directory other
    people's or programs' files live in; ``ForeignMount`` if it is at or inside another
    uid's mounted workspace.  Reads ``/proc/self/mountinfo`` and the user database
    (resolving each home with ``realpath``); it never writes and never stats *real*.

    Refused, each with its reason: ``/``; a shared directory (``_SHARED``) or anything
    under ``/proc``, ``/sys``, ``/dev``; the home directory itself; the parent of a home
    (``$HOME``'s, and every user database entry's: ``/home``, but also ``/var`` or
    ``/var/lib`` where services keep theirs); the daemons' socket directory or a
    directory containing it; a directory inside or above a mounted rewindfs workspace
    (two daemons would capture the same files into two histories); a directory with
    any other mount below it (the daemon serves one file system through one root fd,
    so the files of the mount below would be hidden, and the mount left unreachable
    to unmount).

    Workspaces the store knows but nobody serves are not refused: that history is not
    a live conflict, and with no ``--force`` and no way to forget a workspace, a
    refusal on it would lock the parent out for good.
    """
    shown = os.fsdecode(real)
    if real == b"/":
        raise RefusedWorkspace(path="/", reason="the root directory cannot be a workspace")
    if real in _SHARED:
        raise RefusedWorkspace(path=shown, reason="it is a shared directory other users' "
                                                  "and programs' files live in; pick a "
                                                  "project directory inside it")
    for tree in _SYSTEM_TREES:
        if is_inside(real, tree):
            raise RefusedWorkspace(path=shown, reason=f"it is in the system's "
                                                      f"{os.fsdecode(tree)} tree")
    home = os.path.realpath(os.path.expanduser(b"~"))
    if real == home:
        raise RefusedWorkspace(path=shown,
                               reason="the home directory itself cannot be a workspace; "
                                      "pick a project directory")
    if real in _home_parents(home):
        raise RefusedWorkspace(path=shown, reason="it holds users' home directories; "
                                                  "pick a project directory")
    runtime = os.path.dirname(control_socket_path(store_path, real))
    if is_inside(runtime, real) or is_inside(real, runtime):
        raise RefusedWorkspace(path=shown, reason=f"the daemons' socket directory "
                                                  f"{os.fsdecode(runtime)} is there")
    mounts = mount_table()
    for mnt in mounts:
        if mnt.fstype == b"fuse.rewindfs" and is_inside(real, mnt.point):
            check_mount_owner(mnt)         # at *real* and ours: the caller's AlreadyMounted
            if mnt.point != real:
                raise RefusedWorkspace(path=shown, reason=f"it is inside the mounted "
                                                          f"workspace {os.fsdecode(mnt.point)}")
    below = [m for m in mounts if m.point != real and is_inside(m.point, real)]
    for mnt in below:
        if mnt.fstype == b"fuse.rewindfs":
            raise RefusedWorkspace(path=shown, reason=f"the mounted workspace "
                                                      f"{os.fsdecode(mnt.point)} is inside it")
    if below:
        first = below[0]
        raise RefusedWorkspace(path=shown, reason=f"{os.fsdecode(first.point)} is mounted "
                                                  f"inside it ({os.fsdecode(first.fstype)}); "
                                                  f"a workspace must be one file system")


def _home_parents(home: bytes) -> set[bytes]:
    """The parents of ``$HOME`` and of every home in the user database (``/`` aside)."""
    homes = {home}
    try:
        homes.update(os.fsencode(p.pw_dir) for p in pwd.getpwall() if p.pw_dir)
    except OSError:      # no user database: $HOME alone
        pass
    return {os.path.dirname(os.path.realpath(h)) for h in homes} - {b"/"}


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


class MountEntry(typing.NamedTuple):
    """One line of /proc/self/mountinfo: ``point`` (real path), ``dev`` (``st_dev`` of
    its files), ``fstype`` (``fuse.rewindfs`` for ours), ``options`` (super options:
    a FUSE mount's ``user_id=N`` names the uid that mounted it)."""

    point: bytes
    dev: int
    fstype: bytes
    options: bytes

    def owner(self) -> int | None:
        """The uid that mounted a FUSE file system (``user_id=``), else None."""
        for opt in self.options.split(b","):
            if opt.startswith(b"user_id="):
                return int(opt[len(b"user_id="):])
        return None


def mount_table() -> list[MountEntry]:
    """Every mount this process's mount namespace sees, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            left, _, right = line.partition(b" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            major, _, minor = fields[2].partition(b":")
            out.append(MountEntry(_unescape(fields[4]), os.makedev(int(major), int(minor)),
                                  rest[0], rest[2]))
    return out


def rewindfs_mount_at(real_path: bytes) -> MountEntry | None:
    """The ``fuse.rewindfs`` mount at *real_path* (the newest, if stacked), or None."""
    found = None
    for mnt in mount_table():
        if mnt.point == real_path and mnt.fstype == b"fuse.rewindfs":
            found = mnt
    return found


def find_rewindfs_mount(real_path: bytes) -> bool:
    """True if /proc/self/mountinfo lists a ``fuse.rewindfs`` mount at *real_path*."""
    return rewindfs_mount_at(real_path) is not None


def mount_answers(path: bytes) -> bool:
    """Whether the daemon of the mount at *path* answers (a ``statfs`` always reaches
    it); False when it died (``DEAD_MOUNT``)."""
    try:
        os.statvfs(path)
    except OSError as exc:
        if exc.errno in DEAD_MOUNT:
            return False
        raise
    return True


def enclosing_rewindfs_mount(real_path: bytes) -> MountEntry | None:
    """The innermost ``fuse.rewindfs`` mount at or above *real_path*, or None."""
    best = None
    for mnt in mount_table():
        if mnt.fstype == b"fuse.rewindfs" and is_inside(real_path, mnt.point):
            if best is None or len(mnt.point) >= len(best.point):
                best = mnt
    return best


def check_mount_owner(mnt: MountEntry) -> None:
    """Raise ``ForeignMount`` (exit 2) if another uid's daemon serves *mnt* and we are
    neither that uid nor root: its socket is in that user's runtime directory, which
    we can neither find nor enter, and ``fusermount3`` would refuse us too."""
    owner = mnt.owner()
    me = os.getuid()
    if owner is not None and owner != me and me != 0:
        raise ForeignMount(path=os.fsdecode(mnt.point), uid=owner)


class MountUser(typing.NamedTuple):
    """A process that keeps a mount busy: ``pid``, ``command`` (its command line, cut
    short) and ``how`` (``cwd``, ``root``, ``open file``, ``mapped file``)."""

    pid: int
    command: str
    how: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command}: {self.how})"


def mount_users(point: bytes, dev: int) -> list[MountUser]:
    """Every other process with its working directory, its root, an open file or a
    mapped file on the mount at *point* whose files have ``st_dev`` *dev* — what makes
    a plain ``umount`` fail with EBUSY.

    A link in /proc (``cwd``, ``root``, ``fd/N``) is taken only if its path is under
    *point* and ``stat`` through it shows *dev*: a process left in the bare directory
    under the mount has the same path but not the mount's device, and does not keep it
    busy.  Processes we may not inspect (another uid's, when not root) are not seen.
    """
    me = os.getpid()
    users = []
    for name in os.listdir(b"/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        proc = b"/proc/" + name
        how = _holds(proc, point, dev)
        if how is not None:
            users.append(MountUser(int(name), _command(proc), how))
    return sorted(users)


def _on_mount(link: bytes, point: bytes, dev: int) -> bool:
    try:
        return is_inside(os.readlink(link), point) and os.stat(link).st_dev == dev
    except OSError:       # gone, or not ours to read
        return False


def _holds(proc: bytes, point: bytes, dev: int) -> str | None:
    for what, how in ((b"cwd", "cwd"), (b"root", "root")):
        if _on_mount(proc + b"/" + what, point, dev):
            return how
    try:
        fds = os.listdir(proc + b"/fd")
    except OSError:
        fds = []
    for fd in fds:
        if _on_mount(proc + b"/fd/" + fd, point, dev):
            return "open file"
    want = b"%02x:%02x" % (os.major(dev), os.minor(dev))
    try:
        with open(proc + b"/maps", "rb") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[3] == want and is_inside(parts[5].rstrip(b"\n"), point):
                    return "mapped file"
    except OSError:
        pass
    return None


def _command(proc: bytes, limit: int = 60) -> str:
    try:
        with open(proc + b"/cmdline", "rb") as f:
            cmd = b" ".join(a for a in f.read().split(b"\0") if a)
    except OSError:
        cmd = b""
    if not cmd:
        try:
            with open(proc + b"/comm", "rb") as f:
                cmd = f.read().strip()
        except OSError:
            cmd = b"?"
    text = "".join(c if c.isprintable() else " " for c in cmd.decode(errors="replace"))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def lazy_unmount(path) -> None:
    """Detach a (stale) FUSE mount: ``fusermount3 -uz``."""
    subprocess.run(["fusermount3", "-uz", os.fsdecode(path)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
