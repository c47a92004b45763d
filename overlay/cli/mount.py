"""CLI commands around the daemon: mount, unmount, run, turn begin|end, status, fsck.

``mount`` without ``--foreground`` forks the daemon and returns 0 once the mount is
live (or prints the daemon's startup error with its exit code); the daemon logs to
``<control socket path>.log``.  Commands that talk to a daemon find it from any
directory inside the workspace (``find_daemon``), or from ``-C DIR``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time

from rewindfs.store._errors import RewindfsError

from rewindfs.overlay.cli import options
from rewindfs.overlay.control import client, wire
from rewindfs.overlay.fs import SESSIONS
from rewindfs.overlay.cli.render import INTENT_FINISHING, INTENT_PENDING, escape, human_bytes
from rewindfs.overlay.places import (check_mount_owner, check_named_dir, check_place,
                                     check_workspace, control_socket_path,
                                     enclosing_rewindfs_mount, find_rewindfs_mount,
                                     find_socket, lazy_unmount,
                                     ensure_runtime_dir, is_inside, mount_answers, mount_users,
                                     open_log, resolve_store_path, rewindfs_mount_at)
from rewindfs.overlay.errors import (AlreadyMounted, Interrupted, MountBusy, MountFailed,
                                     MutationRunning, NotMounted, OtherStoreMount,
                                     RemoteUnnamed, SentThenInterrupted, StaleMount,
                                     UnmountFailed, UsageError, WorkspaceMoved)

log = logging.getLogger(__name__)

__all__ = ["HANDLERS", "find_daemon", "intent_pending", "moved_daemon", "register",
           "spawn_daemon", "unmount_workspace"]

_UNMOUNT_WAIT_S = 30.0


# -- helpers shared with other CLI modules ----------------------------------------------

def find_daemon(start, store_path) -> tuple[bytes, bytes]:
    """``(workspace real path, socket path)`` of the daemon serving *start* or a parent
    (the walk up is the plugin's ``find_socket``, its one Python home); ``NotMounted``
    if no ancestor up to ``/`` has a socket."""
    found = find_socket(start, store_path)
    if found is None:
        real = os.path.realpath(os.fsencode(start))
        mnt = enclosing_rewindfs_mount(real)
        if mnt is not None:
            check_mount_owner(mnt)   # another uid's daemon: say so, not "not mounted"
            if mount_answers(mnt.point):   # a live daemon, not at this path: never "dead"
                moved = moved_daemon(mnt, store_path)
                if moved is not None:
                    raise WorkspaceMoved(path=os.fsdecode(mnt.point), was=moved["workspace"])
                raise OtherStoreMount(path=os.fsdecode(mnt.point), store=str(store_path))
        raise NotMounted(path=os.fsdecode(real))
    sock, path = found
    return path, sock


def moved_daemon(mnt, store_path) -> dict | None:
    """The ``status`` (plus its ``socket``) of the daemon of *store_path* that serves the
    mount *mnt* under another path — its workspace was moved while mounted, so the
    socket named after the path it has now does not exist — found by the mount's device
    number among this user's sockets; None if none is."""
    runtime = os.path.dirname(control_socket_path(store_path, b"/"))
    store_real = os.path.realpath(os.fsencode(os.path.abspath(os.fsencode(store_path))))
    try:
        names = sorted(os.listdir(runtime))
    except OSError:
        return None
    for name in names:
        if not name.endswith(b".sock"):
            continue
        sock = os.path.join(runtime, name)
        try:
            found = client.call(sock, "status", {}, timeout=2)
        except (OSError, RewindfsError):
            continue        # a dead daemon's socket, another uid's: not this one
        ours = os.path.realpath(os.fsencode(found.get("store") or "")) == store_real
        if ours and found.get("dev") == mnt.dev:
            return dict(found, socket=os.fsdecode(sock))
    return None


def call_daemon(args, method: str, params=None, *, on_event=None) -> dict:
    """Send one request to the daemon of ``args.workspace`` (default: the cwd's)."""
    store = resolve_store_path(args.store)
    _, sock = find_daemon(args.workspace or ".", store)
    try:
        return client.call(sock, method, params or {}, on_event=on_event)
    except (ConnectionRefusedError, FileNotFoundError):
        raise NotMounted(path=os.fsdecode(args.workspace or os.getcwd())) from None


def _log_path(store, real: bytes) -> bytes:
    return control_socket_path(store, real)[: -len(b".sock")] + b".log"


def spawn_daemon(dir_path, store, *, recover: bool = False, session_kind=None,
                 auto=None, label: str = "") -> int:
    """Fork a daemon for *dir_path*; return its pid once it is mounted, or raise its
    startup error.  *session_kind*: the FUSE session layer (None: the default);
    *auto*: the remote to push to after every turn end (``mount --auto``); *label*:
    of the epoch the mount starts (``run``: its command)."""
    real = _checked_workspace(dir_path, store, recover)
    logfile = _log_path(store, real)
    ensure_runtime_dir(os.path.dirname(logfile))   # refused here: nothing written yet
    log_fd = open_log(logfile)                       # never through a symlink
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        os._exit(_daemon_child(dir_path, store, recover, w, log_fd, session_kind, auto,
                               label))
    os.close(w)
    os.close(log_fd)
    with os.fdopen(r, "rb") as pipe:
        line = pipe.readline()
    if line == b"ok\n":
        return pid
    os.waitpid(pid, os.WNOHANG)
    if not line:
        raise MountFailed(path=os.fsdecode(dir_path),
                          reason=f"the daemon exited early; see {os.fsdecode(logfile)}")
    raise wire.error_from_dict(json.loads(line))


def _checked_workspace(dir_path, store, recover: bool) -> bytes:
    """The real path of a workspace this mount may take, else its refusal."""
    if recover:   # a stale mount cannot be stat-ed: the daemon detaches it, then checks
        real = os.path.realpath(os.fsencode(dir_path))
        check_place(real, store)
        return real
    return check_workspace(dir_path, store)


def _daemon_child(dir_path, store, recover, w, log_fd, session_kind=None, auto=None,
                  label="") -> int:
    from rewindfs.overlay import daemon     # here: the other commands do without trio
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        logging.basicConfig(level=logging.INFO, force=True,
                            format="%(asctime)s %(process)d %(name)s: %(message)s")

        def ready():
            os.write(w, b"ok\n")
            os.close(w)

        return daemon.serve_mount(dir_path, store, recover=recover, ready=ready,
                                  session_kind=session_kind, auto=auto, label=label)
    except BaseException as exc:  # report to the waiting parent, never unwind into it
        logging.getLogger(__name__).exception("daemon failed")
        try:
            os.write(w, daemon.error_line(exc))
        except OSError:
            pass
        return exc.exit_code if isinstance(exc, RewindfsError) else 2


def unmount_workspace(dir_path, store, *, lazy: bool = False,
                      reply: dict | None = None) -> tuple[str, list]:
    """Unmount cleanly: ask the daemon (it ends its session and removes the mount), else
    ``fusermount3 -u``.  Returns ``(how it went, the processes left inside)``.

    Refused, with nothing sent and nothing changed: another uid's mount
    (``ForeignMount``), a mount that other processes use — a working directory, root,
    open or mapped file on it (``MountBusy``, naming each) — unless *lazy*.  Why here
    and not in the daemon: the daemon's session end detaches lazily (libfuse's
    unmount is ``umount2(MNT_DETACH)``), so the kernel's EBUSY never comes back to
    say so.  A process entering between the check and the unmount is not seen.
    With *lazy* the mount is detached anyway (the daemon first, then
    ``fusermount3 -uz`` if it is still there); the processes listed keep the detached
    mount, whose daemon is gone.
    """
    raw = os.fsencode(dir_path)
    real = os.path.realpath(raw)
    mnt = rewindfs_mount_at(real)
    if mnt is not None:
        check_mount_owner(mnt)
    try:
        alive = mount_answers(real)
    except OSError:
        raise NotMounted(path=os.fsdecode(raw)) from None
    if not alive:    # a dead daemon's mount
        lazy_unmount(real)
        return "stale mount detached", []
    if mnt is None:
        outer = enclosing_rewindfs_mount(real)
        if outer is not None:
            check_mount_owner(outer)
        raise NotMounted(path=os.fsdecode(real))
    users = mount_users(real, mnt.dev)
    if users and not lazy:
        raise MountBusy(path=os.fsdecode(real), holders=", ".join(map(str, users)))
    sock = control_socket_path(store, real)
    if not os.path.exists(sock):     # moved while mounted: its daemon has another name
        moved = moved_daemon(mnt, store)
        if moved is not None:
            sock = moved["socket"]
    try:
        answer = client.call(sock, "unmount", {}, timeout=60)
        if reply is not None:
            reply.update(answer)
    except SentThenInterrupted:
        # the daemon acts on a request it got, with or without its client
        raise Interrupted("interrupted after the daemon got the unmount: it unmounts "
                          "without us once no rewind, redo or gc runs (it waits a "
                          "moment, else refuses); `rewindfs status` shows whether it is "
                          "still mounted") from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted before the unmount was sent; nothing "
                          "changed") from None
    except MutationRunning:
        if not lazy:     # the daemon said no: going round it would be no clean unmount
            raise
        _fusermount(real, lazy)    # the daemon still finishes the rewind, then stops
    except (OSError, RewindfsError) as exc:
        log.info("daemon did not answer (%s); using fusermount3 -u", exc)
        _fusermount(real, lazy)
    try:
        _wait_gone(real, lazy)
    except KeyboardInterrupt:
        raise Interrupted("interrupted: the mount is being taken down without us; "
                          "`rewindfs status` shows when it is gone") from None
    return ("detached" if users else "unmounted"), users


def _wait_gone(real: bytes, lazy: bool) -> None:
    """Until the mount is gone (``UnmountFailed`` after a while; *lazy*: detach it)."""
    deadline = time.monotonic() + _UNMOUNT_WAIT_S
    while find_rewindfs_mount(real):
        if time.monotonic() > deadline:
            if not lazy:
                raise UnmountFailed(path=os.fsdecode(real), reason="still mounted (busy?)")
            _fusermount(real, lazy)
            break
        time.sleep(0.02)


def _fusermount(real: bytes, lazy: bool) -> None:
    """``fusermount3 -u`` (``-uz`` if *lazy*); ``MountFailed`` at once when it refuses
    (waiting for a mount it could not remove only delays the same answer)."""
    res = subprocess.run(["fusermount3", "-uz" if lazy else "-u", os.fsdecode(real)],
                         check=False, capture_output=True, text=True)
    if res.returncode != 0 and find_rewindfs_mount(real):
        raise UnmountFailed(path=os.fsdecode(real),
                          reason=res.stderr.strip() or f"fusermount3 exited with {res.returncode}")


# -- commands ------------------------------------------------------------------------------

def _dir_and_auto(args) -> None:
    """``mount --auto DIR``: the one positional word was taken as the remote's name;
    DIR is required, so it is DIR and ``--auto`` means the only remote."""
    if args.dir is None:
        if not args.auto:
            raise UsageError("the following arguments are required: DIR (see rewindfs mount "
                             "--help)")
        args.dir, args.auto = args.auto, ""


def cmd_mount(args, out) -> int:
    _dir_and_auto(args)
    store = resolve_store_path(args.store)
    real = os.path.realpath(os.fsencode(args.dir))
    cwd = os.path.realpath(os.getcwd().encode())
    # Refusals first: "finishing an interrupted rewind" said before a mount that is then
    # refused (a dead daemon's mount, a live one) would announce what does not happen.
    _checked_workspace(args.dir, store, args.recover)
    if find_rewindfs_mount(real) and not args.recover:
        raise AlreadyMounted(path=os.fsdecode(real))
    _say_pending_intent(store, real, out)
    auto = _auto_remote(store, args.auto)   # refused here: nothing mounted
    if args.foreground:
        # Computed now: realpath() on the workspace once it is mounted would stat our
        # own mount from the daemon's thread before it serves, and hang.
        sock = os.fsdecode(control_socket_path(store, real))

        def ready():
            out.emit("mounted", workspace=os.fsdecode(real), pid=os.getpid(), socket=sock)
            out.say(f"mounted {escape(os.fsdecode(real))} (pid {os.getpid()})")
            _warn_if_inside(out, cwd, real)

        from rewindfs.overlay import daemon
        return daemon.serve_mount(args.dir, store, recover=args.recover, ready=ready,
                                   writeback=args.writeback, session_kind=args.session,
                                   auto=auto)
    spawn_daemon(args.dir, store, recover=args.recover, session_kind=args.session, auto=auto)
    out.emit("mounted", workspace=os.fsdecode(real),
             socket=os.fsdecode(control_socket_path(store, real)))
    out.say(f"mounted {escape(os.fsdecode(real))}")
    _warn_if_inside(out, cwd, real)
    return 0


def _warn_if_inside(out, cwd: bytes, real: bytes) -> None:
    """Once mounted (not before: a refused mount gives the shell nothing to re-enter)."""
    if is_inside(cwd, real):
        out.warn(f"your working directory is inside {os.fsdecode(real)}: this shell still "
                 f"sees the bare directory and its writes bypass capture; re-enter it: "
                 f'cd "$PWD"')


def _auto_remote(store_path, name) -> str | None:
    """``--auto [NAME]``: NAME (known to the store), or the store's only remote; None
    without ``--auto``.  ``unknown-remote`` / ``remote-unnamed`` (exit 3) otherwise."""
    if name is None:
        return None
    from rewindfs.store import Store, StoreError
    from rewindfs.overlay.rewind.remote import default_remote
    try:
        store = Store.open(store_path, create=False)
    except StoreError:
        raise RemoteUnnamed(reason="this store has no remote yet (rewindfs remote add "
                            "NAME s3://BUCKET/PREFIX)") from None
    with store:
        return default_remote(store, name or None)


def intent_pending(store_path, real: bytes) -> bool | None:
    """Whether the workspace rooted at *real* has an interrupted rewind's intent (written
    before its first change, so: whether its tree is half-way); None if the store
    cannot be read."""
    from rewindfs.store import Store, StoreError
    try:
        with Store.open(store_path, create=False) as store:
            found = store.workspace_containing(real)
            return found is not None and found[1] == real and \
                store.get_intent(found[0]) is not None
    except (StoreError, OSError):
        return None


def _say_pending_intent(store_path, real: bytes, out) -> None:
    """Say so before the daemon finishes an interrupted rewind (it does, before it
    serves): only ``mount``, ``rewind`` and ``redo`` write to the tree for it.  An
    unreadable store says nothing here: the daemon will say why."""
    if intent_pending(store_path, real):
        out.warn(INTENT_FINISHING)


def cmd_unmount(args, out) -> int:
    check_named_dir(args.dir)      # a typo is named as such (a dead mount is left to unmount)
    reply: dict = {}
    real = os.fsdecode(os.path.realpath(os.fsencode(args.dir)))
    store = resolve_store_path(args.store)
    _step_out_of(real)
    how, users = unmount_workspace(real, store, lazy=args.lazy, reply=reply)
    out.emit("unmounted", workspace=real, how=how,
             left_inside=[{"pid": u.pid, "command": u.command, "how": u.how} for u in users],
             **({"push": reply["push"]} if reply.get("push") else {}))
    out.say(how)
    push = reply.get("push") or {}
    for r in push.get("remotes", ()):
        if r["remote"] == push.get("auto") and r["unpushed_epochs"]:
            out.warn(push_text(r, auto=True) + " — `rewindfs push` sends the rest")
    if users:
        _warn_left_inside(out, real, users)
    return 0


def _step_out_of(real: str) -> None:
    """Leave *real* if this process's working directory is in it (``rewindfs -C DIR
    unmount .``): the unmount would detach the mount under our own feet, and every
    path after it would fail with "Transport endpoint is not connected"."""
    try:
        here = os.getcwdb()
    except OSError:
        return
    if is_inside(here, os.fsencode(real)):
        os.chdir("/")


def _warn_left_inside(out, real: str, users) -> None:
    out.warn(f"still inside the detached mount: {', '.join(map(str, users))}; there, "
             f"their working directories and paths now fail with \"Transport endpoint is "
             f"not connected\" until they re-enter {real} (cd \"$PWD\"), where they see "
             f"the bare directory: its changes are not captured")


def cmd_run(args, out) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("rewindfs run: name a command to run (rewindfs run -- CMD …)")
    store = resolve_store_path(args.store)
    ws_dir = args.workspace or "."
    cwd = _run_dir(ws_dir)
    problem = _start_problem(cmd[0], cwd)
    if problem is not None:    # found out before anything is mounted or recorded
        return _not_started(out, cmd, cwd, *problem)
    child = None
    try:
        child = spawn_daemon(ws_dir, store, label=_run_label(cmd))
    except AlreadyMounted:
        out.say("already mounted; running inside the existing mount")
    try:
        return _run_in_foreground(cmd, cwd, out)
    finally:
        if child is not None:
            # CMD is done: what it left running inside must not keep the daemon alive
            _, users = unmount_workspace(ws_dir, store, lazy=True)
            if users:
                _warn_left_inside(out, os.fsdecode(os.path.realpath(os.fsencode(ws_dir))),
                                  users)
            os.waitpid(child, 0)  # our child: reap it


# what ``rewindfs run`` does with a signal while CMD runs: pass it on, or leave it to
# the terminal, which sends Ctrl-C and Ctrl-backslash to CMD as well (one process group)
_PASSED_ON = (signal.SIGTERM, signal.SIGHUP)
_LEFT_TO_CMD = (signal.SIGINT, signal.SIGQUIT)


def _run_in_foreground(cmd: list[str], cwd: str, out) -> int:
    """Run CMD and wait for it as a shell waits for a foreground job: its exit status,
    128 + N when signal N ended it (127: not found, 126: not executable).  Ctrl-C and
    Ctrl-backslash reach CMD from the terminal and this process waits for CMD to finish
    its own clean-up; SIGTERM and SIGHUP sent to this process alone (a supervisor, a
    closed terminal) are passed on to CMD.  Why: either way ``run`` must outlive CMD to
    unmount after it, and must not cut CMD's clean-up short."""
    def pass_on(signum, _frame):
        if child is not None:
            child.send_signal(signum)

    def wait_for_cmd(_signum, _frame):
        pass

    child = None
    old = {}
    for sig in _PASSED_ON + _LEFT_TO_CMD:
        if signal.getsignal(sig) is not signal.SIG_IGN:   # ignored stays ignored for CMD
            # a Python handler, unlike SIG_IGN, is not inherited: CMD gets the default
            old[sig] = signal.signal(sig, pass_on if sig in _PASSED_ON else wait_for_cmd)
    try:
        try:
            child = subprocess.Popen(cmd, cwd=cwd)
        except FileNotFoundError:    # gone since _start_problem looked
            return _not_started(out, cmd, cwd, 127, "not found")
        except PermissionError:
            return _not_started(out, cmd, cwd, 126, "permission denied (not executable)")
        status = child.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def _run_label(cmd: list[str]) -> str:
    """The label of the epoch a run starts: ``run: make test`` (as a shell would
    read it, its first line, at most 200 characters), so ``log`` names each run."""
    line = shlex.join(cmd).split("\n", 1)[0]
    return f"run: {line[:197]}..." if len(line) > 200 else f"run: {line}"


def _run_dir(ws_dir: str) -> str:
    """Where CMD runs: the current directory when it is inside the workspace, else the
    workspace (``run -C DIR`` from elsewhere, as ``git -C``) — inside the mount either
    way, or nothing it writes would be seen.  A path string: resolving it again after
    the mount re-enters the directory through it."""
    cwd = os.getcwd()
    if is_inside(os.path.realpath(os.fsencode(cwd)), os.path.realpath(os.fsencode(ws_dir))):
        return cwd
    return os.path.abspath(ws_dir)


def _start_problem(cmd0: str, cwd: str) -> tuple[int, str] | None:
    """Why a shell in *cwd* could not start *cmd0* — ``(127, …)`` not found, ``(126, …)``
    found but not executable — or None.  Looked up as ``execvp`` does: a name with a
    slash from *cwd*, else along ``$PATH``.  The mount shows the same tree as *cwd*, so
    the answer holds inside it too."""
    if "/" not in cmd0:
        return None if shutil.which(cmd0) else (127, "command not found")
    path = os.path.join(cwd, cmd0)
    if not os.path.lexists(path):
        return 127, "no such file or directory"
    if os.path.isdir(path):
        return 126, "is a directory"
    if not os.access(path, os.X_OK):
        return 126, "permission denied (not executable)"
    return None


def _not_started(out, cmd: list[str], cwd: str, status: int, why: str) -> int:
    """Say, as a shell would, that CMD did not start; exit *status* (126 or 127).  A
    directory named first was most likely meant as the workspace: the ``-C`` form is
    shown."""
    text = f"rewindfs run: {cmd[0]}: {why}"
    if os.path.isdir(os.path.join(cwd, cmd[0])):
        rest = cmd[2:] if cmd[1:2] == ["--"] else cmd[1:]
        text += (f" ({cmd[0]} is a directory here; to run in it as the workspace: "
                 f"rewindfs run -C {shlex.join(cmd[:1])} -- {shlex.join(rest) or 'CMD'})")
    out.emit("run.not_started", command=cmd[0], reason=why, exit_code=status)
    out.say_stderr(text)
    return status


def cmd_turn_begin(args, out) -> int:
    params = {"session": args.session, "turn": args.turn, "label": args.label}
    if args.force:
        params["force"] = True
    res = _call_mark(args, "turn.begin", params,
                     f"whether turn {args.turn} of {args.session} began")
    out.emit("turn.begun", session=args.session, turn=args.turn, epoch=res["epoch"])
    out.say(f"turn {args.turn} of {escape(args.session)} began (epoch e{res['epoch']})")
    _warn_all(out, res)
    return 0


def cmd_turn_end(args, out) -> int:
    params = {"session": args.session} if args.session else {}
    res = _call_mark(args, "turn.end", params, "whether the turn ended")
    ended = res.get("ended", True)      # a daemon before issue 14 does not say
    out.emit("turn.ended", epoch=res["epoch"], ended=ended)
    out.say(f"turn ended (now epoch e{res['epoch']}, idle)" if ended
            else f"no turn was open; nothing ended (epoch e{res['epoch']})")
    return 0


def _call_mark(args, method: str, params: dict, whether: str) -> dict:
    """``call_daemon`` for a turn mark, whose Ctrl-C says what it left: the daemon
    carries out a mark it received (never half of one), so a person must not be left
    guessing whether the turn began."""
    what = method.replace(".", " ")
    try:
        return call_daemon(args, method, params)
    except SentThenInterrupted:
        raise Interrupted(f"interrupted after the daemon got the {what}: it carries it "
                          f"out (or refuses it) without us; `rewindfs status` shows "
                          f"{whether}") from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted before the {what} was sent; nothing "
                          f"changed") from None


def _warn_all(out, res: dict) -> None:
    """The daemon's ``warnings`` (e.g. an invalid ``.rewindignore``), one line each."""
    for text in res.get("warnings") or ():
        out.warn(text)


def _offline_status(args) -> dict:
    """Status of an unmounted workspace, straight from the store (read-only)."""
    from rewindfs.store import Store

    start = os.path.realpath(os.fsencode(args.workspace or "."))
    store_path = resolve_store_path(args.store)
    if not Store.exists(store_path):    # no store: nothing was ever mounted here
        raise NotMounted(path=os.fsdecode(start))
    store = Store.open(store_path, create=False)   # one that cannot be opened says why
    with store:
        found = store.workspace_containing(start)
        if found is None:
            raise NotMounted(path=os.fsdecode(start))
        ws, path = found
        if find_rewindfs_mount(path):   # mounted, and no daemon answered: it died
            raise StaleMount(path=os.fsdecode(path))
        cur = store.current_epoch(ws)
        turn = store.open_turn(ws)
        return {"workspace": os.fsdecode(path), "store": str(store.path), "mounted": False,
                "epoch": cur.id, "epoch_kind": cur.kind, "intent": bool(store.get_intent(ws)),
                "usage": store.usage(ws),
                "open_turn": None if turn is None else turn.as_point(),
                "push": {"auto": None, "remotes": [
                    {"remote": name, "state": "idle", **store.push_state(name, ws)}
                    for name in sorted(store.remotes())]}}


def cmd_status(args, out) -> int:
    try:
        res = call_daemon(args, "status", {"usage": True})
    except NotMounted:
        res = _offline_status(args)
    out.emit("status", **res)
    if not res["mounted"]:
        out.say(f"[bold]{escape(res['workspace'])}[/] is not mounted; epoch e{res['epoch']} "
                f"({res['epoch_kind']})")
        _say_usage(out, res.get("usage"))
        _say_push(out, res.get("push"))
        if res.get("intent"):
            out.warn(INTENT_PENDING)
        return 0
    if not out.json:
        turn = res.get("open_turn")
        turn_s = (f"turn {turn['turn']} of {escape(turn['session'] or '')}" if turn
                  else "no open turn")
        out.say(f"[bold]{escape(res['workspace'])}[/] mounted (pid {res['pid']})")
        out.say(f"  epoch e{res['epoch']} ({res['epoch_kind']}), {turn_s}")
        out.say(f"  store {escape(res['store'])}")
        out.say(f"  socket {escape(res['socket'])}")
        _say_usage(out, res.get("usage"))
        _say_push(out, res.get("push"))
        if res.get("bypass_writes"):
            out.warn(f"processes {res['bypass_writes']['pids']} work in the bare directory "
                     f'under the mount; their writes are not captured (cd "$PWD")')
        for w in res.get("late_writes", []):
            out.warn(late_write_text(w))
        if res.get("intent") or res.get("busy"):   # a live daemon finished any older
            # intent when it mounted: one now is the running rewind's
            what = res.get("busy") or "rewind"
            out.say(f"  a {what} is running (epoch e{res['epoch']}); turn marks wait for "
                    "it, an unmount is refused until it ends")
    _warn_all(out, res)
    return 0


def _say_push(out, push) -> None:
    """What is not pushed, per remote: the auto remote first, with its queue."""
    if not push or out.json:
        return
    rows = sorted(push["remotes"], key=lambda r: r["remote"] != push.get("auto"))
    for r in rows:
        out.say("  " + push_text(r, auto=r["remote"] == push.get("auto")))
        err = r.get("last_error")
        if err:
            out.warn(f"last push to {escape(r['remote'])} failed at {_clock(err['at_ns'])}: "
                     f"{escape(err['message'])} ({err['code']})")


def push_text(r: dict, *, auto: bool) -> str:
    """One remote's push state for people (``status``, ``unmount``)."""
    name = escape(r["remote"]) + (" (auto)" if auto else "")
    if r.get("removed"):
        return f"remote {name}: removed from this store; nothing more is pushed to it"
    if r["pushed_epoch"] is None:
        what = f"never pushed ({r['unpushed_epochs']} epochs)"
    elif r["unpushed_epochs"]:
        what = (f"{r['unpushed_epochs']} epoch(s) not pushed (local e{r['head_epoch']}, "
                f"pushed up to e{r['pushed_epoch']} at {_clock(r['pushed_ns'])})")
    else:
        what = f"pushed up to e{r['pushed_epoch']} at {_clock(r['pushed_ns'])}"
    state = r.get("state", "idle")
    if state == "retrying" and r.get("retry_at_ns"):
        state = f"waiting to retry at {_clock(r['retry_at_ns'])}"
    queued = f", {r['queued']} queued" if r.get("queued") else ""
    return f"remote {name}: {what}; {state}{queued}"


def _clock(ns) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) if ns else "?"


def late_write_text(w: dict) -> str:
    """One late write (``status``'s ``late_writes``) for people."""
    via = "" if w["by"] == w["pid"] else f", child of pid {w['by']}"
    return (f"late write: pid {w['pid']} ({escape(w['comm'])}{via}) changed {escape(w['path'])} after a "
            f"rewind removed turn {w['turn']} of session {w['session']} (e{w['epoch']}), "
            f"which started it")


def _say_usage(out, usage) -> None:
    """Store usage for people: the store's footprint, then this workspace by session."""
    if not usage or out.json:
        return
    st = usage["store"]
    out.say(f"  store usage {human_bytes(st['disk_bytes'])} on disk ({st['blobs']} blobs, "
            f"{st['blob_files']} of them in files)")
    for w in usage["workspaces"]:
        out.say(f"  this workspace: {w['epochs']} epochs, {w['turns']} turns, "
                f"{w['paths']} pre-images, {human_bytes(w['bytes'])} recorded")
        for name, s in w["sessions"].items():
            out.say(f"    {escape(name)}: {s['turns']} turns, {s['epochs']} epochs, "
                    f"{s['paths']} pre-images, {human_bytes(s['bytes'])}")


def cmd_fsck(args, out) -> int:
    from rewindfs.store import Store

    if args.remote_check:
        from rewindfs.overlay.cli.remote import fsck_remote
        return fsck_remote(args, out)

    with Store.open(resolve_store_path(args.store), create=False) as store:
        report = store.fsck()
    data = report.to_dict()
    for p in data["problems"]:
        out.emit("fsck.problem", **p)
        out.say(f"[red]{p.get('code')}[/]: {escape(str(p.get('message')))}")
    out.emit("fsck", ok=report.ok, problems=len(data["problems"]),
             blobs_checked=data["blobs_checked"], entries_checked=data["entries_checked"])
    out.say("store is sound" if report.ok else f"{len(report.errors)} error(s)")
    return 0 if report.ok else 1


HANDLERS = {
    "mount": cmd_mount,
    "unmount": cmd_unmount,
    "run": cmd_run,
    "turn.begin": cmd_turn_begin,
    "turn.end": cmd_turn_end,
    "status": cmd_status,
    "fsck": cmd_fsck,
}


def register(sub) -> None:
    """Add this module's subcommands to the ``rewindfs`` parser."""
    p = sub.add_parser("mount", help="mount the FUSE overlay over DIR")
    p.add_argument("dir", metavar="DIR", nargs="?", help="the workspace, mounted over itself")
    p.add_argument("--foreground", action="store_true", help="serve in this process")
    p.add_argument("--recover", action="store_true",
                   help="detach a stale mount left by a dead daemon first")
    p.add_argument("--writeback", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--session", choices=SESSIONS, default=None,
                   help="the FUSE session layer: kernel (our own, faster) or libfuse "
                        "(pyfuse3); default: $REWINDFS_SESSION, else kernel")
    p.add_argument("--auto", nargs="?", const="", default=None, metavar="NAME",
                   help="push to remote NAME (default: the only one) in the background "
                        "after every turn end")
    options.common(p)
    p.set_defaults(command="mount")

    p = sub.add_parser("unmount", help="unmount DIR cleanly")
    p.add_argument("dir", metavar="DIR", help="the mounted workspace")
    p.add_argument("--lazy", action="store_true",
                   help="detach even while processes work inside (they are named)")
    options.common(p)
    p.set_defaults(command="unmount")

    p = sub.add_parser("run", help="mount, run CMD inside, unmount; exit with CMD's code",
                       description="Mount the workspace, run CMD inside it as a shell runs "
                       "a foreground job, unmount.  CMD runs in the current directory when "
                       "it is inside the workspace, else in the workspace (-C DIR from "
                       "elsewhere).  The exit status is CMD's (128+N when "
                       "signal N ended it, 127 not found, 126 not executable).  Ctrl-C "
                       "reaches CMD and run waits for it to finish; SIGTERM and SIGHUP "
                       "sent to run are passed on to CMD.")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the command and its arguments (after --)")
    options.workspace(p)
    p.set_defaults(command="run")

    turn = sub.add_parser("turn", help="mark turn boundaries")
    tsub = turn.add_subparsers(dest="turn_command", metavar="begin|end",
                               parser_class=type(turn), required=True)
    turn.set_defaults(command=None)
    p = tsub.add_parser("begin", help="start a turn")
    p.add_argument("--session", required=True, metavar="S", help="the session the turn belongs to")
    p.add_argument("--turn", type=options.turn_number, required=True, metavar="N",
                   help="the turn's number in its session (1, 2, …)")
    p.add_argument("--label", default="", help="what the turn is about (its first line is kept)")
    p.add_argument("--force", action="store_true",
                   help="close another session's open turn (refused otherwise)")
    options.workspace(p)
    p.set_defaults(command="turn.begin")
    p = tsub.add_parser("end", help="end the open turn")
    p.add_argument("--session", metavar="S",
                   help="end the open turn only if it is this session's")
    options.workspace(p)
    p.set_defaults(command="turn.end")

    p = sub.add_parser("status", help="show the daemon serving this workspace")
    options.workspace(p)
    p.set_defaults(command="status")

    p = sub.add_parser("fsck", help="check the store's consistency")
    p.add_argument("--remote", dest="remote_check", metavar="NAME",
                   help="check that remote instead: read and verify every object")
    options.common(p)
    p.set_defaults(command="fsck")
