"""Writes and renames through the mount *while* a rewind lands (issue 12, items 2 and 3;
DESIGN invariant 14: no acknowledged write is ever lost).

The landing is paused deterministically after its k-th change by the test hook
``REWINDFS_PAUSE_AFTER=k`` / ``REWINDFS_PAUSE_FILE`` (``overlay/rewind/land.py``):
some files are staged under ``.rewindfs~`` temp names, none renamed into place yet.
While it waits, the test acts through the mount like an agent would, then lets it go
on.  A change the rewind is about to overwrite must either be refused with an errno
(``EBUSY``/``EAGAIN``) or end up in a point; the rewind's temp names must never show
through the mount, never reach a journal, and a later redo must create no junk.
"""

from __future__ import annotations

import base64
import errno
import os
import threading
import time

import pytest

from mountkit import mounted

N = 30
PAUSE_AFTER = 5
AGENT = b"AGENT WRITE\n"
_WAIT_S = 60.0


def _ws_id(s, m):
    return s.workspace(os.fsencode(os.path.realpath(m.ws)))


def history(m) -> int:
    """victim/f000..f029 made idle, all changed in turn 1; returns turn 1's epoch."""
    d = m.ws / "victim"
    d.mkdir()
    for i in range(N):
        (d / f"f{i:03d}").write_bytes(b"old %d\n" % i)
    e1 = m.call("turn.begin", session="s1", turn=1, label="t1")["epoch"]
    for i in range(N):
        (d / f"f{i:03d}").write_bytes(b"changed %d\n" % i)
    m.call("turn.end")
    return e1


class Paused:
    """A rewind (or redo) over the socket in a thread, paused after its k-th change."""

    def __init__(self, m, pause_file, method="rewind", **params):
        self.m, self.pause_file, self.out = m, pause_file, []
        self.thread = threading.Thread(target=self._run, args=(method, params), daemon=True)

    def _run(self, method, params):
        try:
            self.out.append(self.m.call(method, **params))
        except BaseException as exc:     # noqa: BLE001 - re-raised by result()
            self.out.append(exc)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + _WAIT_S
        while not os.path.exists(self.pause_file):
            if self.out or time.monotonic() > deadline:
                raise AssertionError(f"the rewind never paused: {self.out}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        try:
            os.unlink(self.pause_file)
        except FileNotFoundError:
            pass
        self.thread.join(_WAIT_S * 2)

    def result(self) -> dict:
        assert self.out, "the rewind did not return"
        if isinstance(self.out[0], BaseException):
            raise self.out[0]
        return self.out[0]


def pause_env(tmp_path) -> tuple[dict, str]:
    pause = str(tmp_path / "pause")
    return {"REWINDFS_PAUSE_AFTER": str(PAUSE_AFTER), "REWINDFS_PAUSE_FILE": pause}, pause


def reachable(m, rel: str, data: bytes) -> list[str]:
    """Where ``data`` is ``rel``'s content: "now" and/or "eN" (the state at eN)."""
    where = []
    try:
        if (m.ws / rel).read_bytes() == data:
            where.append("now")
    except FileNotFoundError:
        pass
    with m.open_store() as s:
        epochs = [e.id for e in s.epochs(_ws_id(s, m))]
    for eid in epochs:
        r = m.call("show", point=f"e{eid}", path=rel)
        if r["exists"] and base64.b64decode(r["content_b64"]) == data:
            where.append(f"e{eid}")
    return where


def temp_names_in_journals(m) -> list:
    with m.open_store() as s:
        ws = _ws_id(s, m)
        return [(e.id, p) for e in s.epochs(ws) for p, _img in s.journal(ws, e.id)
                if any(c.startswith(b".rewindfs~") for c in p.split(b"/"))]


def tree(root) -> list[bytes]:
    out = []
    for dirpath, dirs, files in os.walk(os.fsencode(root)):
        out += [os.path.relpath(os.path.join(dirpath, n), os.fsencode(root))
                for n in dirs + files]
    return sorted(out)


# -- item 2: a write during a rewind --------------------------------------------------

@pytest.mark.mount
def test_write_during_rewind_is_refused_or_kept_in_a_point(tmp_path):
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        victim = m.ws / "victim" / f"f{N - 1:03d}"      # landed last
        with Paused(m, pause, to=f"e{e1}") as run:
            shown = os.listdir(m.ws / "victim")
            try:
                with open(victim, "wb") as f:
                    f.write(AGENT)
                refused = None
            except OSError as exc:
                refused = exc.errno
        res = run.result()
        if refused is not None:
            assert refused in (errno.EBUSY, errno.EAGAIN), os.strerror(refused)
            assert res["failed"] == []
            assert victim.read_bytes() == b"old %d\n" % (N - 1)
            assert m.call("redo")["failed"] == []
            assert victim.read_bytes() == b"changed %d\n" % (N - 1)
        else:
            # acknowledged: its bytes must be in a point, now and after a redo
            assert reachable(m, f"victim/f{N - 1:03d}", AGENT), "acknowledged write lost"
            assert m.call("redo")["failed"] == []
            assert reachable(m, f"victim/f{N - 1:03d}", AGENT), "lost after redo"
        # the rewind's temp names never show through the mount
        assert [n for n in shown if n.startswith(".rewindfs~")] == [], shown


@pytest.mark.mount
def test_write_through_a_handle_open_before_the_rewind_is_not_lost(tmp_path):
    """The writeback cache acknowledges write(2) before the daemon sees it; a file held
    open for writing when the rewind starts must keep what is written through it."""
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        rel = f"victim/f{N - 1:03d}"
        f = open(m.ws / rel, "r+b")
        try:
            with Paused(m, pause, to=f"e{e1}") as run:
                try:
                    f.seek(0)
                    f.write(AGENT)
                    f.truncate()
                    f.flush()
                    os.fsync(f.fileno())
                    refused = None
                except OSError as exc:
                    refused = exc.errno
        finally:
            try:
                f.close()
            except OSError as exc:
                refused = refused or exc.errno
        res = run.result()
        if refused is not None:
            assert refused in (errno.EBUSY, errno.EAGAIN), os.strerror(refused)
            return
        assert reachable(m, rel, AGENT), f"acknowledged write lost: {res}"
        # every other file was rewound: the rewind did its job around the busy file
        assert (m.ws / "victim" / "f000").read_bytes() == b"old 0\n"
        assert [f["path"] for f in res["failed"]] in ([], [rel]), res["failed"]
        redo = m.call("redo")
        assert reachable(m, rel, AGENT), f"lost after redo: {redo}"


# -- item 3: a rename of the directory being landed into --------------------------------

@pytest.mark.mount
def test_rename_of_the_landing_dir_leaves_no_temp_names_and_redo_no_junk(tmp_path):
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        with Paused(m, pause, to=f"e{e1}") as run:
            try:
                os.rename(m.ws / "victim", m.ws / "victim2")
                refused = None
            except OSError as exc:
                refused = exc.errno
            try:
                os.rmdir(m.ws / "victim")
                rmdir_refused = None
            except OSError as exc:
                rmdir_refused = exc.errno
        res = run.result()
        assert refused in (None, errno.EBUSY), os.strerror(refused)
        assert rmdir_refused in (errno.EBUSY, errno.ENOTEMPTY, errno.ENOENT)
        assert temp_names_in_journals(m) == []
        redo = m.call("redo")
        assert temp_names_in_journals(m) == []
        names = tree(m.ws)
        assert [n for n in names if b".rewindfs~" in n] == [], names
        files = [n for n in names if os.path.isfile(os.path.join(os.fsencode(m.ws), n))]
        assert len(files) == N, (res, redo, files)
        if refused == errno.EBUSY:
            assert res["failed"] == [] and redo["failed"] == []
            assert (m.ws / "victim" / "f000").read_bytes() == b"changed 0\n"
        with m.open_store() as s:
            assert s.fsck().ok


# -- the fence, request by request ------------------------------------------------------

def _errno_of(fn) -> int | None:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.mount
def test_every_way_to_change_a_landing_path_is_refused_and_others_go_on(tmp_path):
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        v = m.ws / "victim"
        last = v / f"f{N - 1:03d}"
        with Paused(m, pause, to=f"e{e1}") as run:
            # not in the plan: goes on, and is kept by the rewind
            (v / "new-file").write_bytes(b"beside")
            got = {
                "unlink": _errno_of(lambda: os.unlink(v / "f001")),
                "chmod": _errno_of(lambda: os.chmod(last, 0o600)),
                "truncate": _errno_of(lambda: os.truncate(last, 0)),
                "append": _errno_of(lambda: open(last, "ab").close()),
                "setxattr": _errno_of(lambda: os.setxattr(last, "user.k", b"v")),
                "utime": _errno_of(lambda: os.utime(last, ns=(1, 1))),
                "rename-over": _errno_of(lambda: os.rename(v / "new-file", v / "f002")),
                "rename-from": _errno_of(lambda: os.rename(v / "f003", m.ws / "moved")),
                "link-to": _errno_of(lambda: os.link(last, m.ws / "twin")),
                "rmdir-landing": _errno_of(lambda: os.rmdir(v)),
                "temp-name": _errno_of(lambda: open(v / ".rewindfs~9~x", "wb").close()),
            }
            read_ok = last.read_bytes()
        res = run.result()
        want = dict.fromkeys(got, errno.EBUSY)
        want["temp-name"] = errno.EPERM
        want["rmdir-landing"] = got["rmdir-landing"] if got["rmdir-landing"] in (
            errno.EBUSY, errno.ENOTEMPTY) else errno.EBUSY
        assert got == want
        assert read_ok == b"changed %d\n" % (N - 1)
        assert res["failed"] == []
        for i in range(N):
            assert (v / f"f{i:03d}").read_bytes() == b"old %d\n" % i
        assert (v / "new-file").read_bytes() == b"beside"
        assert not (m.ws / "moved").exists() and not (m.ws / "twin").exists()
        # the fence is lifted with the run
        with open(last, "ab") as f:
            f.write(b"after\n")
        os.unlink(v / "f001")
        assert temp_names_in_journals(m) == []


@pytest.mark.mount
def test_seeded_writes_at_random_moments_are_never_lost(tmp_path):
    """Pause after a random k-th change (before, between and after the landings), write
    one random file of the plan: refused, or its bytes in a point."""
    import random
    seeds = range(int(os.environ.get("REWINDFS_RACE_TRIALS", "6")))
    failures = []
    for seed in seeds:
        rng = random.Random(seed)
        k = rng.randrange(1, 2 * N)
        rel = f"victim/f{rng.randrange(N):03d}"
        data = b"AGENT %d\n" % seed
        base = tmp_path / f"t{seed}"
        base.mkdir()
        pause = str(base / "pause")
        env = {"REWINDFS_PAUSE_AFTER": str(k), "REWINDFS_PAUSE_FILE": pause}
        with mounted(base / "ws", base / "store", env=env) as m:
            e1 = history(m)
            with Paused(m, pause, to=f"e{e1}") as run:
                refused = _errno_of(lambda: (m.ws / rel).write_bytes(data))
            run.result()
            if refused is None:
                ok = bool(reachable(m, rel, data))
            else:
                ok = refused in (errno.EBUSY, errno.EAGAIN)
            if not ok:
                failures.append((seed, k, rel, refused))
    print(f"{len(seeds)} trials, {len(failures)} failures")
    assert failures == []


# -- temp names an older version recorded are never restored ----------------------------

def test_temp_names_in_a_journal_are_never_planned_or_restored(tmp_path):
    """An older version captured a rewind's staged ``.rewindfs~`` file as a real path
    (a rename of the directory being landed into): no rewind or redo may bring it back,
    list it or count it."""
    from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind
    from rewindfs.overlay.capture import capture
    from restorekit import open_history
    with open_history(tmp_path) as h:
        os.mkdir(h.p(b"d"))
        h.write(b"d/a", b"v1")
        e1 = h.turn(1)
        h.write(b"d/a", b"v2")
        junk = b"d/.rewindfs~9~0123456789abcdef"
        with open(h.p(junk), "wb") as f:
            f.write(b"staged")
        capture(h.fd, h.store, h.ws, h.store.current_epoch(h.ws).id, [junk])
        os.unlink(h.p(junk))
        h.end_turn()
        assert junk in dict(h.store.journal(h.ws, e1))      # the old damage is there
        plan = plan_rewind(h.fd, h.store, h.ws, f"e{e1}")
        assert junk not in plan.plan.paths
        assert all(it.action.path != junk for it in plan.items)
        res = apply_plan(h.fd, h.store, h.ws, plan, session=None)
        assert res.failed == [] and res.counts["created"] == 0
        assert sorted(os.listdir(h.p(b"d"))) == [b"a"]
        with open(h.p(b"d/a"), "rb") as f:
            assert f.read() == b"v1"


# -- stopping the daemon while a rewind lands -------------------------------------------

def test_unmount_during_a_rewind_waits_for_it_or_is_refused_and_the_rewind_is_answered(tmp_path):
    """``rewindfs unmount`` while a rewind was landing: the daemon stopped, the rewind
    finished in its thread, and its client got "The daemon closed the connection before
    answering" (daemon-gone, exit 2) for a rewind that had happened — the person could
    not tell. Now the unmount is refused while a rewind or redo runs, naming it, and
    the rewind's answer arrives; the unmount then goes through."""
    from mountkit import cli
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        with Paused(m, pause, to=f"e{e1}") as run:
            res = cli("--json", "unmount", m.ws, store=m.store, timeout=60)
            assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
            assert '"rewind-running"' in res.stdout, res.stdout
            assert m.proc.poll() is None and os.path.ismount(m.ws)
            assert m.call("status")["busy"] == "rewind"     # what status says meanwhile
        out = run.result()
        assert "busy" not in m.call("status")
        assert out["failed"] == [] and out["epoch"] > e1
        res = cli("unmount", m.ws, store=m.store, timeout=60)
        assert res.returncode == 0, res.stderr
        assert m.proc.wait(timeout=60) == 0
    assert sorted(os.listdir(tmp_path / "ws" / "victim"))[0] == "f000"
    assert (tmp_path / "ws" / "victim" / "f000").read_bytes() == b"old 0\n"


def test_a_stop_signal_during_a_rewind_lets_it_answer_first(tmp_path):
    """SIGTERM to the daemon (a supervisor stopping it) while a rewind lands: the rewind
    (which cannot stop half-way) finishes and is answered before the daemon exits."""
    import signal
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        with Paused(m, pause, to=f"e{e1}") as run:
            m.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)          # the daemon has seen it while the rewind waits
        out = run.result()
        assert out["failed"] == [] and out["epoch"] > e1
        assert m.proc.wait(timeout=60) == 0
    assert (tmp_path / "ws" / "victim" / "f000").read_bytes() == b"old 0\n"


def test_a_lazy_unmount_during_a_rewind_detaches_and_the_rewind_still_answers(tmp_path):
    """``unmount --lazy`` (detach anyway) while a rewind lands: the mount goes at once,
    the daemon still finishes the rewind and answers it, then exits."""
    from mountkit import cli
    env, pause = pause_env(tmp_path)
    with mounted(tmp_path / "ws", tmp_path / "store", env=env) as m:
        e1 = history(m)
        with Paused(m, pause, to=f"e{e1}") as run:
            res = cli("unmount", "--lazy", m.ws, store=m.store, timeout=60)
            assert res.returncode == 0, res.stderr
            assert not os.path.ismount(m.ws)
        out = run.result()
        assert out["failed"] == [] and out["epoch"] > e1
        assert m.proc.wait(timeout=60) == 0
    assert (tmp_path / "ws" / "victim" / "f000").read_bytes() == b"old 0\n"
